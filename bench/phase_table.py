"""Do a server's consecutive measured phases agree? One vLLM server, the workload's warm-ups, then
consecutive phases of fresh requests, each measured exactly as a trial measures it
(sandbox.worker._measure: the steady window at concurrency > 1, docs/meters-and-gate.md).

    .venv/bin/python bench/phase_table.py run --workload default-cpu --concurrency 8 --phases 4
    python3 bench/phase_table.py run --workload default --workload default-c128 --phases 4   # a GPU
    .venv/bin/python bench/phase_table.py table docs/data/phases/*.jsonl

`run` starts ONE server with the space's fixed flags (search_space/vllm-gpu.yaml on a GPU,
vllm-cpu.yaml otherwise) and the context length `agent run` would serve for the workload's traffic,
then for each --workload in turn: its warm-ups at its concurrency, and --phases phases of its
num_prompts requests, each fresh (drawn from the search split, then the held-out split: no request
twice on the server). Each phase is one raw line in --out (default docs/data/phases/<device>-<stamp>.jsonl):
run id, commit, device, workload, concurrency, phase, tokens/s in the window and over the whole
phase, the window's length and tokens, TTFT and inter-token percentiles. `table` prints the
markdown table from raw files alone: per workload, each phase's figure and the largest difference
between consecutive phases (the bar: 5%).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from sandbox import bench, host, worker  # noqa: E402
from sandbox.server import Server  # noqa: E402
from sandbox.traffic import draw  # noqa: E402
from sandbox.workload import load_quality, load_workload  # noqa: E402

BAR = 0.05


def commit() -> str:
    out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return out.stdout.strip() + ("+dirty" if dirty else "")


def device() -> str:
    hw = host.hardware()
    if hw["gpus"]:
        first = hw["gpus"][0]
        return first.get("name", str(first)) if isinstance(first, dict) else str(first)
    return f"CPU, {hw['cpus']} cores ({hw['cpu']})"


def context(model: str, workloads) -> int | None:
    """The max-model-len `agent run` serves for these workloads' requests (agent.traffic.context_length)."""
    from agent import traffic as traffics

    template = next((w.chat_template for w in workloads if w.chat_template), None)
    tokens = traffics.Tokens(model, template)
    quality = load_quality("default")
    longest = max(traffics.check_against_model([*w.pool("search"), *w.pool("heldout")], tokens, w.name,
                                               quality.greedy_max_tokens) for w in workloads)
    return traffics.context_length(longest, quality, tokens.limit)


def server_flags(model: str, workloads, space: Path | None = None) -> tuple[bool, list[str], dict[str, str]]:
    """(on a GPU, flags, env): the space's fixed part (the installed engine's space by default) with the
    context length `agent run` would serve for these workloads."""
    from meter_vs_vllm_bench import fixed_flags_env

    gpu = host.hardware()["kind"] == "gpu"
    flags, env = fixed_flags_env(space or ROOT / "search_space" / ("vllm-gpu.yaml" if gpu else "vllm-cpu.yaml"))
    length = context(model, workloads)
    if length and "--max-model-len" in flags:
        flags[flags.index("--max-model-len") + 1] = str(length)
    if template := next((w.chat_template for w in workloads if w.chat_template), None):
        flags += ["--chat-template", template]   # as the worker serves a chat workload
    return gpu, flags, env


def phases_of(workload, count: int) -> list[list]:
    """count fresh phases: the search split after the warm-ups, then the held-out split."""
    search, heldout = workload.pool("search")[workload.warmup_count():], workload.pool("heldout")
    pool, n = [*search, *heldout], workload.num_prompts
    return [draw(pool, i * n, n, workload.where("search+heldout")) for i in range(count)]


def run(args) -> int:
    workloads = [load_workload(name) for name in args.workload]
    if args.concurrency:
        workloads = [replace(w, concurrency=args.concurrency, num_prompts=args.num_prompts or 8 * args.concurrency,
                             warmup_requests=2 * args.concurrency, name=f"{w.name}@c{args.concurrency}")
                     for w in workloads]
    gpu, flags, env = server_flags(args.model, workloads, args.space)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    dev = device()
    out = args.out or ROOT / "docs" / "data" / "phases" / f"{'gpu' if gpu else 'cpu'}-{stamp}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    log = Path(args.log_dir or "/tmp") / f"phase-table-{stamp}.server.log"
    server = Server(args.model, flags, env, log)
    head = {"run": stamp, "commit": commit(), "device": dev, "engine": host.engine(), "flags": flags, "env": env}
    print(f"run {stamp} on {dev}: server {' '.join(flags)}; raw phases to {out}", flush=True)
    try:
        t0 = time.monotonic()
        server.start()
        server.wait_ready(args.start_timeout)
        print(f"server ready in {time.monotonic() - t0:.0f} s", flush=True)
        for workload in workloads:
            warm_t = time.monotonic()
            warm, _ = asyncio.run(bench.run_requests(server.base_url, server.model_name, workload.warmups(),
                                                     workload.concurrency, 600))
            if bad := [r for r in warm if not r.ok]:
                raise RuntimeError(f"{workload.name}: warm-up failed: {bad[0].error}")
            print(f"{workload.name}: {len(warm)} warm-ups at concurrency {workload.concurrency} in "
                  f"{time.monotonic() - warm_t:.1f} s", flush=True)
            for i, requests in enumerate(phases_of(workload, args.phases)):
                result, _ = asyncio.run(worker._measure(server, workload, requests, bench.bench_deadline_s(workload)))
                server.fail_if_dead(f"{workload.name} phase {i + 1}")
                row = {**head, "workload": workload.name, "workload_hash": workload.hash,
                       "concurrency": workload.concurrency, "requests": result.requests, "phase": i + 1,
                       "tps": result.tps, "phase_tps": result.phase_tps, "window_s": result.window_s,
                       "window_tokens": result.window_tokens, "output_tokens": result.output_tokens,
                       "wall_s": result.wall_s, "errors": result.errors, "finish": result.finish,
                       "ttft_ms": result.ttft_ms, "itl_ms": result.itl_ms, "latency_ms": result.latency_ms}
                with open(out, "a") as f:
                    f.write(json.dumps(row) + "\n")
                print(f"{workload.name} phase {i + 1}: {result.tps:.1f} tok/s in the window "
                      f"({result.window_s} s), {result.phase_tps:.1f} over the phase ({result.wall_s:.1f} s), "
                      f"{result.errors} errors", flush=True)
    finally:
        server.stop(60)
    print(table([out]))
    return 0


def table(paths: list[Path]) -> str:
    rows = [json.loads(line) for p in paths for line in Path(p).read_text().splitlines() if line.strip()]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["run"], r["device"], r["workload"], r["concurrency"]), []).append(r)
    lines = ["| device | run (commit) | workload | concurrency | requests a phase | tok/s each phase (window) "
             "| largest step | whole phase tok/s | window share of the phase | TTFT p50/p99 ms | ITL p50/p99 ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (run, dev, name, c), group in groups.items():
        group.sort(key=lambda r: r["phase"])
        tps = [r["tps"] for r in group]
        step = max((abs(b / a - 1) for a, b in zip(tps, tps[1:], strict=False) if a), default=0.0)
        share = [r["window_s"] / r["wall_s"] for r in group if r.get("window_s")]
        mid = group[len(group) // 2]
        each = ", ".join(f"{t:,.1f}" for t in tps)
        whole = ", ".join(f"{r['phase_tps']:,.1f}" for r in group)
        window = f"{min(share):.0%}-{max(share):.0%}" if share else "whole phase"
        ttft, itl = mid["ttft_ms"], mid["itl_ms"]
        lines.append(f"| {dev} | {run} ({group[0]['commit']}) | {name} | {c} | {group[0]['requests']} | {each} | "
                     f"{step:.1%} {'ok' if step <= BAR else 'OVER 5%'} | {whole} | {window} | "
                     f"{ttft.get('p50')}/{ttft.get('p99')} | {itl.get('p50')}/{itl.get('p99')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="measure consecutive phases on one server")
    r.add_argument("--workload", action="append", required=True, help="a shipped workload (repeatable, in order)")
    r.add_argument("--phases", type=int, default=4)
    r.add_argument("--concurrency", type=int, help="override the workloads' concurrency (phases of 8 times it)")
    r.add_argument("--num-prompts", type=int, help="with --concurrency: requests a phase")
    r.add_argument("--model", default=str(ROOT / "runs" / "models" / "gemma-3-270m"))
    r.add_argument("--space", type=Path)
    r.add_argument("--out", type=Path)
    r.add_argument("--log-dir")
    r.add_argument("--start-timeout", type=float, default=900.0)
    t = sub.add_parser("table", help="the markdown table from raw phase files")
    t.add_argument("paths", nargs="+", type=Path)
    args = parser.parse_args(argv)
    if args.cmd == "table":
        print(table(args.paths))
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
