"""The agent's meter against `vllm bench serve` under load, on the same requests, interleaved on one server.

    python3 bench/meter_agreement.py --rounds 3                 # a GPU: concurrency 32, 256 requests a shape
    .venv/bin/python bench/meter_agreement.py --concurrency 4 --requests 32 --rounds 2   # a quick CPU check
    .venv/bin/python bench/meter_agreement.py table docs/data/agreement/*.jsonl

Two shapes, each greedy with ignore_eos so both meters count exactly the same tokens:
- `random`: prompts of 128 tokens and 128 output tokens, drawn as `vllm bench serve --dataset-name
  random` draws them (agent.synthetic, seed 0);
- `realistic`: the GPU default's first measured phase (serving.jsonl), each request's output length
  fixed to what the defaults produced for it as served (a first pass with natural stops).

Each round sends the shape's requests once through each meter, the order rotating: `agent` is
sandbox.worker._measure as a trial runs it (its figure: tokens/s over the steady window; its
whole-phase figure beside it), `vllm` is `vllm bench serve` (custom dataset of the same prompts with
their output_tokens, --ignore-eos, --temperature 0, --max-concurrency, request rate inf) read from
its --save-result JSON (output_throughput: every token over the benchmark's duration). A first
round of each shape is sent and discarded (the prefix cache then holds every prompt for both
arms alike). One raw line per measurement in --out; `table` prints the ratios from raw files alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from meter_vs_vllm_bench import BENCH_WRAPPER  # noqa: E402
from phase_table import commit, device, server_flags  # noqa: E402

from sandbox import bench, host, worker  # noqa: E402
from sandbox.server import Server  # noqa: E402
from sandbox.traffic import Request  # noqa: E402
from sandbox.workload import load_workload  # noqa: E402


def fixed(requests: list[Request], lengths: list[int]) -> list[Request]:
    """Each request greedy, to exactly its length (ignore_eos), without stop sequences."""
    out = []
    for r, n in zip(requests, lengths, strict=False):
        body = {k: v for k, v in r.body.items() if k not in ("stop", "top_p", "top_k", "seed", "max_completion_tokens")}
        out.append(replace(r, body={**body, "max_tokens": max(1, n), "temperature": 0.0, "ignore_eos": True}))
    return out


def random_shape(model: str, count: int) -> list[Request]:
    from agent import synthetic

    shape = synthetic.Shape(128, 128, 0.0, count, 0, True, 0.0, None, 1.0)
    return [Request("completions", {**b, "temperature": 0.0}, i + 1)
            for i, b in enumerate(synthetic.bodies(shape, model))]


def agent_arm(server, workload, requests) -> dict:
    result, _ = asyncio.run(worker._measure(server, workload, requests, 600))
    return {"tps": result.tps, "phase_tps": result.phase_tps, "window_s": result.window_s, "wall_s": result.wall_s,
            "tokens": result.output_tokens, "errors": result.errors, "short": result.short_outputs,
            "ttft_ms_mean": result.ttft_ms.get("mean"), "itl_ms_mean": result.itl_ms.get("mean")}


def vllm_arm(server, model: str, requests, concurrency: int, out: Path, tag: str) -> dict:
    data_path = out.parent / f"{out.stem}-{tag}.prompts.jsonl"
    data_path.write_text("".join(json.dumps({"prompt": r.body["prompt"], "output_tokens": r.body["max_tokens"]}) + "\n"
                                 for r in requests))
    name, cpu = f"{out.stem}-{tag}.vllm.json", out.parent / f"{out.stem}-{tag}.cpu.json"
    argv = [sys.executable, "-c", BENCH_WRAPPER, str(cpu), str(server.proc.pid),
            "--backend", "openai", "--endpoint", "/v1/completions", "--base-url", server.base_url,
            "--model", server.model_name, "--tokenizer", model, "--dataset-name", "custom",
            "--dataset-path", str(data_path), "--skip-chat-template", "--disable-shuffle", "--custom-output-len", "-1",
            "--num-prompts", str(len(requests)), "--max-concurrency", str(concurrency), "--request-rate", "inf",
            "--num-warmups", "0", "--temperature", "0", "--ignore-eos", "--disable-tqdm",
            "--save-result", "--result-dir", str(out.parent), "--result-filename", name]
    with open(out.parent / f"{out.stem}-{tag}.vllm.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"})
        try:
            proc.wait(timeout=900)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    if proc.returncode != 0:
        tail = (out.parent / f"{out.stem}-{tag}.vllm.log").read_text(errors="replace")[-1500:]
        raise RuntimeError(f"vllm bench serve exited {proc.returncode}:\n{tail}")
    data = json.loads((out.parent / name).read_text())
    return {"tps": round(data["output_throughput"], 3), "wall_s": round(data["duration"], 3),
            "tokens": data["total_output_tokens"], "errors": data["num_prompts"] - data["completed"],
            "ttft_ms_mean": round(data["mean_ttft_ms"], 2), "itl_ms_mean": round(data["mean_itl_ms"], 2)}


def run(args) -> int:
    default = load_workload("default")
    concurrency = args.concurrency or default.concurrency
    count = args.requests or default.num_prompts
    workload = replace(default, concurrency=concurrency, num_prompts=count)
    gpu, flags, env = server_flags(args.model, [workload], args.space)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    out = args.out or ROOT / "docs" / "data" / "agreement" / f"{'gpu' if gpu else 'cpu'}-{stamp}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    head = {"run": stamp, "commit": commit(), "device": device(), "engine": host.engine(), "concurrency": concurrency}
    server = Server(args.model, flags, env, Path(args.log_dir or "/tmp") / f"agreement-{stamp}.server.log")
    print(f"run {stamp} on {head['device']}: concurrency {concurrency}, {count} requests a shape; "
          f"raw to {out}", flush=True)
    try:
        t0 = time.monotonic()
        server.start()
        server.wait_ready(900)
        print(f"server ready in {time.monotonic() - t0:.0f} s", flush=True)
        warm, _ = asyncio.run(bench.run_requests(server.base_url, server.model_name, workload.warmups(),
                                                 concurrency, 600))
        assert all(r.ok for r in warm), "warm-up failed"
        served = workload.measured(0)   # the realistic phase as served, for its output lengths
        first, _ = asyncio.run(bench.run_requests(server.base_url, server.model_name, served, concurrency, 600))
        shapes = {"random": random_shape(args.model, count),
                  "realistic": fixed(served, [r.output_tokens for r in first])}
        for shape, requests in shapes.items():
            expected = sum(r.body["max_tokens"] for r in requests)
            for i in range(args.rounds + 1):   # round 0: sent and discarded
                order = ["agent", "vllm"] if i % 2 == 0 else ["vllm", "agent"]
                for arm in order:
                    server.fail_if_dead(f"{shape} round {i}")
                    m = (agent_arm(server, workload, requests) if arm == "agent" else
                         vllm_arm(server, args.model, requests, concurrency, out, f"{shape}-{i}"))
                    if m["errors"] or m["tokens"] != expected:
                        raise RuntimeError(f"{shape} round {i} {arm}: {m['errors']} errors, {m['tokens']} tokens "
                                           f"of {expected}")
                    if i:
                        with open(out, "a") as f:
                            f.write(json.dumps({**head, "shape": shape, "round": i, "arm": arm, **m}) + "\n")
                    print(f"{shape} round {i}{' (discarded)' if not i else ''} {arm}: {m['tps']:.1f} tok/s"
                          + (f" (whole phase {m['phase_tps']:.1f})" if arm == "agent" else ""), flush=True)
    finally:
        server.stop(60)
    print(table([out]))
    return 0


def table(paths: list[Path]) -> str:
    rows = [json.loads(line) for p in paths for line in Path(p).read_text().splitlines() if line.strip()]
    groups: dict[tuple, dict[int, dict]] = {}
    for r in rows:
        groups.setdefault((r["run"], r["device"], r["concurrency"],
                           r["shape"]), {}).setdefault(r["round"], {})[r["arm"]] = r
    lines = ["| device | run (commit) | concurrency | shape | vllm bench serve tok/s | agent window tok/s | "
             "agent whole phase tok/s | window / vllm | whole phase / vllm |", "|---|---|---|---|---|---|---|---|---|"]
    for (run, dev, c, shape), rounds in groups.items():
        pairs = [rounds[k] for k in sorted(rounds) if {"agent", "vllm"} <= set(rounds[k])]
        v = [p["vllm"]["tps"] for p in pairs]
        a = [p["agent"]["tps"] for p in pairs]
        w = [p["agent"]["phase_tps"] for p in pairs]
        commit_ = pairs[0]["agent"]["commit"] if pairs else "?"
        ratio = sum(a) / sum(v) if v else float("nan")
        whole = sum(w) / sum(v) if v else float("nan")
        lines.append(f"| {dev} | {run} ({commit_}) | {c} | {shape} | {', '.join(f'{x:,.0f}' for x in v)} | "
                     f"{', '.join(f'{x:,.0f}' for x in a)} | {', '.join(f'{x:,.0f}' for x in w)} | "
                     f"{ratio:.3f} | {whole:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd")
    t = sub.add_parser("table", help="the ratios from raw files")
    t.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int)
    parser.add_argument("--requests", type=int, help="requests a shape (default: the GPU default's phase, 256)")
    parser.add_argument("--model", default=str(ROOT / "runs" / "models" / "gemma-3-270m"))
    parser.add_argument("--space", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--log-dir")
    args = parser.parse_args(argv)
    if args.cmd == "table":
        print(table(args.paths))
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
