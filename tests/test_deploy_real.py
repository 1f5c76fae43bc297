"""A committed branch served exactly as its README says, on the real CPU engine with the embedded model:
`git worktree add`, then `serving/launch.sh` (config.yaml with serving/env). The server's own environment
(/proc/<pid>/environ) holds the trial's, it serves the model's own context (/v1/models), and the same
server answers the branch's serving/bench.sh (`vllm bench serve` on `agent traffic export`'s dataset):
one server start for all of it."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from agent import export, gitops, proposal, results_file
from agent.context import Inputs, Settings, stored
from agent.ledger import Run, Trial
from agent.request import load_space, served_context
from sandbox.contract import load_workload

pytestmark = pytest.mark.engine
ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


def committed_branch(tmp_path: Path, model_limit: int) -> tuple[Path, Trial]:
    """A branch as the night commits one: core binding on the shipped CPU space (eager, to start in half
    the time), at the context the run serves, into a fresh repository; checked out as the README says."""
    space = load_space("vllm-cpu", [])
    space = space.with_fixed_flag("max-model-len", served_context(None, model_limit, 768))
    flags, env = space.to_flags_env({"VLLM_CPU_OMP_THREADS_BIND": f"0-{max(os.sched_getaffinity(0))}",
                                     "enforce-eager": True})
    meter = load_workload("default-cpu")
    run = Run(id="20261207-050000", model="/measuring/host/runs/models/gemma-3-270m", engine="vllm-cpu",
              engine_version="0.32.0", baseline_figure=12.0, hardware={"kind": "cpu", "cpus": 2},
              settings=stored(Settings(model="m", workload=meter.as_dict()),
                              Inputs(model_given="embedded", traffic=meter.summary(), max_model_len=model_limit)))
    trial = Trial(number=3, source="planner", params={"VLLM_CPU_OMP_THREADS_BIND": env["VLLM_CPU_OMP_THREADS_BIND"]},
                  flags=flags, env=env, figure=14.0, search_ratio=1.17, heldout_ratio=1.2,
                  heldout_interval=[1.02, 1.4], meter={"name": "default-cpu", "objective": "tps"},
                  measured={"engine": {"name": "vllm-cpu", "version": "0.32.0"}})
    repo = gitops.open_repo(tmp_path / "proposals", create=True)
    gitops.commit_branch(repo, "agent/20261207-050000/3", proposal.files(run, trial), "trial 3")
    tree = tmp_path / "serve"
    subprocess.run(["git", "-C", str(repo.working_dir), "worktree", "add", str(tree), "agent/20261207-050000/3"],
                   check=True, capture_output=True, timeout=60)
    return tree, trial


def test_a_committed_branch_serves_what_was_measured_and_bench_sh_measures_it(tmp_path, embedded_model):
    limit = json.loads((Path(embedded_model) / "config.json").read_text())["max_position_embeddings"]
    tree, trial = committed_branch(tmp_path, limit)
    port = 18000 + os.getpid() % 1000
    # As a user's shell has it: the agent's environment first on PATH (`python3`, `agent model path`).
    env = {"PATH": f"{VENV_BIN}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"),
           "AGENT_HOME": str(Path(embedded_model).parent.parent), "HF_HUB_OFFLINE": "1"}
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen(["serving/launch.sh", "--host", "127.0.0.1", "--port", str(port)], cwd=tree, env=env,
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(2)
        else:
            raise AssertionError("the branch's server did not come up in 15 minutes")
        # launch.sh execs the server: its pid is the server's, and its environment is what it runs with.
        environ = dict(item.split("=", 1) for item in
                       Path(f"/proc/{server.pid}/environ").read_text().split("\0") if "=" in item)
        assert {k: environ.get(k) for k in trial.env} == trial.env
        (model,) = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
        assert model["max_model_len"] == limit == 32768 and model["id"] == str(embedded_model)

        found = results_file.read((tree / "serving" / "results.json").read_text(), "results.json")
        dataset = tmp_path / "heldout.jsonl"
        done = export.export(found, ROOT / "sandbox/data/traffic/default.jsonl", dataset)
        assert done.written > 0 and done.written == len(dataset.read_text().splitlines())
        bench = subprocess.run(["serving/bench.sh", "--num-prompts", "3"], cwd=tree, capture_output=True, text=True,
                               timeout=900, env={**env, "BASE_URL": url, "DATASET": str(dataset),
                                                 "MODEL": str(embedded_model), "OUT": str(tmp_path)})
        assert bench.returncode == 0, bench.stdout[-2000:] + bench.stderr[-3000:]
        (saved,) = tmp_path.glob("bench-*.json")
        figures = json.loads(saved.read_text())
        assert figures["completed"] == 3 and figures["output_throughput"] > 0
        assert figures["max_concurrency"] == found.load.concurrency == 1
        assert {"p99_ttft_ms", "p99_tpot_ms", "p99_itl_ms", "p99_e2el_ms"} <= set(figures)
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=60)
        log.close()
