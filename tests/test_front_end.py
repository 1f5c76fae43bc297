"""Front-end knobs act where `vllm serve` runs them: on the CUDA build, `--api-server-count 2` starts two
API server processes (vLLM titles them VLLM::APIServer_N) where the defaults start none, and the
server answers through them. The CPU build's launcher ignores the flag (its space refuses the knob,
tests/test_space.py), so this runs only where the CUDA build is installed (the GPU host; an H100
counted 4 for `--api-server-count 4`, docs/history.md)."""

import asyncio

import pytest

from sandbox import bench
from sandbox.server import Server
from sandbox.workload import load_workload

pytestmark = [pytest.mark.engine, pytest.mark.gpu]   # deselected where the CUDA build is not installed


def api_servers(server: Server) -> int:
    return sum("APIServer" in title for title in server.titles().values())


@pytest.mark.parametrize("count", [1, 2])
def test_api_server_count_starts_that_many_front_end_processes(embedded_model, tmp_path, count):
    server = Server(str(embedded_model), ["--max-model-len", "1024", "--api-server-count", str(count)], {},
                    tmp_path / "server.log")
    try:
        server.start()
        server.wait_ready(900)
        assert api_servers(server) == (0 if count == 1 else count)
        requests = load_workload("default").warmups()[:8]
        results, _ = asyncio.run(bench.run_requests(server.base_url, server.model_name, requests, 4, 120))
        assert all(r.ok and r.output_tokens > 0 for r in results)
    finally:
        server.stop(30)
