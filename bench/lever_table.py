"""Which levers bind where: each lever alone against the defaults, on fresh server instances, for
several traffic shapes served one after another by each instance (docs/history.md, "Levers on a GPU").

    python3 bench/lever_table.py run --budget-s 1200 --out /tmp/res/levers.jsonl --raw /tmp/res/raw
    python3 bench/lever_table.py run --shape serving-c32 --lever defaults --lever max-num-seqs-8 --instances 1
    python3 bench/lever_table.py table docs/data/levers/*.jsonl

`run` starts one server per instance: the space's fixed flags (search_space/vllm-gpu.yaml on a GPU,
vllm-cpu.yaml otherwise) and the context `agent run` would serve for every shape's traffic, plus the
lever's flags. Each instance serves every shape in turn (its warm-ups at its concurrency, then one
measured phase counted over its steady window, sandbox.worker._measure), each shape's requests
drawn from its traffic file at a cursor that only moves forward, so an instance never sees a request
twice and every instance sees the same requests. Levers take turns (defaults, lever 1, lever 2, ...)
so the machine's drift falls on all of them; after the first rounds, the config whose throughput
interval against the defaults is widest (on any shape) gets the next instance, until every
half-width is at most --bar or --budget-s is spent. One line per instance and shape in --out (run
id, commit, device, lever, flags, tok/s, TTFT and inter-token percentiles, the server's gauges
and counters, the API server processes and their CPU, the meter's own CPU); the server's /metrics text after each
shape, its log and its process list under --raw.

`table` prints, from raw files alone, one table per shape: instances, tok/s, the ratio to the
defaults with its 95% interval (instances pooled by config on the log scale, agent.stats), TTFT and
inter-token p50/p99 (the median over instances), and for shapes with SLOs the share of instances
within them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from phase_table import commit, device, server_flags  # noqa: E402

from agent import stats  # noqa: E402
from sandbox import bench, host, worker  # noqa: E402
from sandbox.failures import TrialFailure  # noqa: E402
from sandbox.server import Server  # noqa: E402
from sandbox.traffic import draw  # noqa: E402
from sandbox.workload import load_workload  # noqa: E402

BAR = 0.05
# MLPerf Inference's interactive Llama 2 70B scenario bounds: TTFT 450 ms, time per output token 40 ms
# (each at p99); the long-prompt shape is judged against them.
INTERACTIVE_SLO = {"ttft_p99_ms": 450.0, "itl_p99_ms": 40.0}


@dataclass(frozen=True)
class Shape:
    name: str
    workload: str
    concurrency: int
    num_prompts: int
    warmups: int
    slo: dict | None = None


SHAPES = {s.name: s for s in (
    Shape("serving-c32", "default", 32, 512, 64),
    Shape("serving-c128", "default-c128", 128, 1024, 256),
    Shape("rag-c32", "rag", 32, 256, 64, INTERACTIVE_SLO),
    # The bandwidth-bound stand-in: fixed 256-token answers (ignore_eos), its quality meaningless.
    # (the shipped prompt templates hold 576: fixed lengths keep the batch full, so fewer waves a phase do)
    Shape("fixed-c32", "throughput", 32, 128, 32),
    Shape("fixed-c128", "throughput", 128, 256, 128),
    # One stream on the CPU engine (issue 56): answers that copy their prompt (edits), the shipped chat
    # file (short answers, the Gemma chat template) and the realistic default.
    Shape("edits-c32", "edits-c32", 32, 256, 64),   # edit traffic under load on a GPU (issue 60)
    Shape("edits-c1", "edits-cpu", 1, 6, 2),
    Shape("edits-chat-c1", "edits-chat-cpu", 1, 6, 2),
    Shape("chat-c1", "chat-cpu", 1, 8, 2),
    Shape("default-c1", "default-cpu", 1, 6, 2),
)}

# Each lever alone; its flags go after the fixed ones. The defaults are vLLM's own for this host.
LEVERS = {
    "defaults": [],
    "max-num-seqs-8": ["--max-num-seqs", "8"],              # the known loser at concurrency 32
    "max-num-seqs-64": ["--max-num-seqs", "64"],
    "max-num-batched-tokens-2048": ["--max-num-batched-tokens", "2048"],
    "max-num-batched-tokens-16384": ["--max-num-batched-tokens", "16384"],
    "graphs-to-2048": ["--compilation-config", '{"max_cudagraph_capture_size": 2048}'],
    "graphs-to-32": ["--compilation-config", '{"max_cudagraph_capture_size": 32}'],
    "api-server-count-2": ["--api-server-count", "2"],
    "api-server-count-4": ["--api-server-count", "4"],
    "stream-interval-8": ["--stream-interval", "8"],
    "no-async-scheduling": ["--no-async-scheduling"],
    "kv-cache-fp8": ["--kv-cache-dtype", "fp8"],
}
# CPU levers (issue 56): core binding (an environment variable: ENV_LEVERS), n-gram speculation on top of it
# (the planner's move: k=4, lookup 2..4), and float32, which a host without native bf16 verifies faster.
NGRAM_K4 = ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, '
                                    '"prompt_lookup_max": 4}']
NGRAM_GPU_K4 = ["--speculative-config", '{"method": "ngram_gpu", "num_speculative_tokens": 4, '
                                        '"prompt_lookup_min": 2, "prompt_lookup_max": 4}']
LEVERS |= {
    "ngram-gpu-k4": NGRAM_GPU_K4,                                     # the planner's move under load on a GPU
    "ngram-k4-no-async": [*NGRAM_K4, "--no-async-scheduling"],         # plain ngram needs async scheduling off
    "binding": [],
    "binding-fp32": ["--dtype", "float32"],
    "binding-ngram-k4": NGRAM_K4,
    "binding-ngram-k4-fp32": [*NGRAM_K4, "--dtype", "float32"],
}
ENV_LEVERS = {lever: {"VLLM_CPU_OMP_THREADS_BIND": "every core"} for lever in LEVERS if lever.startswith("binding")}
FIRST_LEVERS = ["defaults", "max-num-seqs-8", "max-num-batched-tokens-2048", "max-num-batched-tokens-16384",
                "graphs-to-2048", "api-server-count-4", "no-async-scheduling", "stream-interval-8"]


def shape_workload(shape: Shape):
    w = load_workload(shape.workload)
    return replace(w, concurrency=shape.concurrency, num_prompts=shape.num_prompts, warmup_requests=shape.warmups,
                   name=shape.name)


def draws(workloads) -> dict[str, tuple[list, list]]:
    """Each shape's warm-ups and measured phase: consecutive slices of its traffic (search split, then
    held-out) at a cursor shared by the shapes that read the same file, so no request repeats on a server."""
    cursor: dict[str, int] = {}
    out = {}
    for w in workloads:
        pool = [*w.pool("search"), *w.pool("heldout")]
        at = cursor.get(w.traffic or w.name, 0)
        # At least the shape's warm-ups, and on until they reach every sampling path (Workload.warmup_count):
        # a sampler branch first run inside the measured phase compiles there (an H100 read 5,025 tok/s
        # at concurrency 32 with 64 warm-ups that missed some, 2026-12-06; 7,400-7,900 with all of them).
        count = w.warmup_count()
        if at + count + w.num_prompts > len(pool):
            raise SystemExit(f"{w.name}: its traffic has {len(pool)} requests, fewer than the shapes before it "
                             f"plus its {count} warm-ups and {w.num_prompts} measured")
        warm = draw(pool, at, count, w.where("search+heldout"))
        phase = draw(pool, at + count, w.num_prompts, w.where("search+heldout"))
        cursor[w.traffic or w.name] = at + count + w.num_prompts
        out[w.name] = (warm, phase)
    return out


def measure_shape(server: Server, w, warm: list, phase: list, raw: Path, tag: str) -> dict:
    started = time.monotonic()
    results, _ = asyncio.run(bench.run_requests(server.base_url, server.model_name, warm, w.concurrency, 600))
    if bad := [r for r in results if not r.ok]:
        raise TrialFailure("request_errors", f"{w.name}: warm-up failed: {bad[0].error}")
    warm_s = time.monotonic() - started
    client = time.process_time()
    result, gauges = asyncio.run(worker._measure(server, w, phase, bench.bench_deadline_s(w)))
    client = time.process_time() - client   # this process: the meter's own client, one core at most
    titles = sorted(server.titles().values())
    server.fail_if_dead(w.name)
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    (raw / f"{tag}.{w.name}.metrics.txt").write_text(text)
    return {"shape": w.name, "concurrency": w.concurrency, "requests": result.requests, "tps": result.tps,
            "phase_tps": result.phase_tps, "window_s": result.window_s, "wall_s": result.wall_s,
            "output_tokens": result.output_tokens, "errors": result.errors, "warmup_s": round(warm_s, 2),
            "ttft_ms": result.ttft_ms, "itl_ms": result.itl_ms, "latency_ms": result.latency_ms,
            "tpot_ms": result.tpot_ms, "itl_token_ms": result.itl_token_ms,
            "repeat_share": round(result.repeat_hits / result.repeat_words, 3) if result.repeat_words else None,
            "gauges": gauges, "api_processes": sum("APIServer" in t for t in titles), "processes": titles,
            "api_cpu_share": gauges.get("api_cpu_share"),
            "client_cpu_share": round(client / result.wall_s, 3) if result.wall_s else None}


def every_core() -> str:
    """The core list this process may run on, as VLLM_CPU_OMP_THREADS_BIND takes it (agent.devices.span)."""
    from agent.devices import span

    return span(tuple(sorted(os.sched_getaffinity(0))))


def instance(lever: str, number: int, args, workloads, phases, fixed: list[str], env: dict, head: dict) -> list[dict]:
    tag = f"{head['run']}-{number:03d}-{lever}"
    flags = [*fixed, *args.extra_flag, *LEVERS[lever]]
    launcher = (str(args.launcher),) if args.launcher else None
    env = {**env, **{k: every_core() if v == "every core" else v for k, v in ENV_LEVERS.get(lever, {}).items()}}
    server = Server(args.model, flags, env, args.raw / f"{tag}.server.log", launcher=launcher)
    base = {**head, "lever": lever, "instance": number, "flags": flags, "env": env}
    t0 = time.monotonic()
    rows = []
    try:
        server.start()
        server.wait_ready(args.start_timeout)
        ready_s = round(time.monotonic() - t0, 1)
        for w in workloads:
            warm, phase = phases[w.name]
            rows.append({**base, "ready_s": ready_s, **measure_shape(server, w, warm, phase, args.raw, tag)})
    except TrialFailure as e:
        rows.append({**base, "failure": e.klass, "detail": f"{e.message} {e.cause or ''}"[:500]})
    finally:
        cleanup = server.stop(60)
    for r in rows:
        r["instance_s"] = round(time.monotonic() - t0, 1)
        r["cleanup_forced"] = cleanup.forced_kill
    with open(args.out, "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    for r in rows:
        said = r.get("failure") or (f"{r['tps']:,.0f} tok/s, TTFT p99 {r['ttft_ms'].get('p99')} ms, ITL p99 "
                                    f"{r['itl_ms'].get('p99')} ms, {r['api_processes']} APIServer processes")
        print(f"#{number} {lever} {r.get('shape', '')}: {said} ({r['instance_s']} s)", flush=True)
    return rows


def comparisons(rows: list[dict]) -> dict[tuple[str, str, str], stats.Comparison]:
    """(run, shape, lever) -> the lever's instances against the defaults' of the same run (95% two-sided
    interval), the noise pooled over every config's instances of that shape in that run: a lever is
    only ever compared with defaults measured in its own run."""
    by: dict[tuple[str, str, str], list[float]] = {}
    for r in rows:
        if r.get("tps") and not r.get("errors"):
            by.setdefault((r["run"], r["shape"], r["lever"]), []).append(r["tps"])
    out = {}
    for run, shape in {(run, s) for run, s, _ in by}:
        groups = {lever: v for (rn, s, lever), v in by.items() if (rn, s) == (run, shape)}
        if "defaults" not in groups:
            continue
        noise = stats.pooled_noise(list(groups.values()))
        for lever, values in groups.items():
            out[(run, shape, lever)] = stats.compare(values, groups["defaults"], noise, level=0.975)
    return out


def half_width(c: stats.Comparison) -> float:
    return math.inf if c.high == math.inf or c.low <= 0 else math.sqrt(c.high / c.low) - 1


def next_lever(rows: list[dict], levers: list[str], bar: float) -> str | None:
    """The config to measure again: the one whose interval is widest on any shape, above the bar (the
    defaults instead while they have fewer instances than it); None when every row is within the bar."""
    comps = comparisons(rows)
    width = {lever: max((half_width(c) for (_, s, lv), c in comps.items() if lv == lever), default=math.inf)
             for lever in levers if lever != "defaults"}
    failed = {r["lever"] for r in rows if r.get("failure")}
    wide = {lv: w for lv, w in width.items() if w > bar and lv not in failed}
    if not wide:
        return None
    lever = max(wide, key=wide.get)
    count = lambda lv: len({r["instance"] for r in rows if r["lever"] == lv})  # noqa: E731
    return "defaults" if count("defaults") <= count(lever) else lever


def defaults_spread(rows: list[dict]) -> float | None:
    """The largest ratio less one between instances of the defaults on one shape (None below two), the
    run's first instance left out: on a fresh host it is the cold start (a quiet H100 read 6,158 tok/s
    there and 6,927-7,097 on the four instances of the defaults after it, 2026-12-06)."""
    spreads = []
    first = min((r["instance"] for r in rows), default=None)
    for shape in {r.get("shape") for r in rows if r.get("tps")}:
        tps = [r["tps"] for r in rows if r["lever"] == "defaults" and r.get("shape") == shape and r.get("tps")
               and r["instance"] != first]
        if len(tps) >= 2:
            spreads.append(max(tps) / min(tps) - 1)
    return max(spreads, default=None)


def run(args) -> int:
    shapes = [SHAPES[s] for s in (args.shape or ["serving-c32", "serving-c128", "rag-c32"])]
    levers = args.lever or FIRST_LEVERS
    if "defaults" not in levers:
        levers = ["defaults", *levers]
    workloads = [shape_workload(s) for s in shapes]
    phases = draws(workloads)
    gpu, fixed, env = server_flags(args.model, [load_workload(s.workload) for s in shapes], args.space)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    head = {"run": stamp, "commit": commit(), "device": device(), "engine": host.engine(),
            "model": Path(args.model).name,
            "slo": {s.name: s.slo for s in shapes if s.slo}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.raw.mkdir(parents=True, exist_ok=True)
    print(f"run {stamp} on {head['device']}: fixed {' '.join(fixed + args.extra_flag)}; levers {', '.join(levers)}; "
          f"shapes {', '.join(s.name for s in shapes)}; rows to {args.out}", flush=True)
    began, rows, number, durations = time.monotonic(), [], 0, []
    plan = [lever for _ in range(args.instances) for lever in levers] + args.also
    levers += [lv for lv in args.also if lv not in levers]
    while True:
        # The longest instance but the first, whose start compiles from cold (260 s on a fresh H100)
        if durations and time.monotonic() - began + max(durations[1:] or durations) > args.budget_s:
            print(f"budget spent ({time.monotonic() - began:.0f} s of {args.budget_s:.0f})", flush=True)
            break
        if plan:
            lever = plan.pop(0)
        elif not (lever := next_lever(rows, levers, args.bar)):
            print("every row within the bar", flush=True)
            break
        if (spread := defaults_spread(rows)) is not None and spread > args.max_defaults_spread:
            print(f"stopped: instances of the defaults differ by {spread:.1%} on one shape, more than "
                  f"--max-defaults-spread {args.max_defaults_spread:.0%}: this host cannot resolve a lever to "
                  f"{args.bar:.0%} within the budget", flush=True)
            break
        t = time.monotonic()
        rows += instance(lever, number, args, workloads, phases, fixed, env, head)
        durations.append(time.monotonic() - t)
        number += 1
    print(table([args.out]))
    return 0


def _median(rows: list[dict], key: str, pct: str) -> float | None:
    values = [r[key].get(pct) for r in rows if r.get(key) and r[key].get(pct) is not None]
    return round(statistics.median(values), 1) if values else None


def table(paths: list[Path]) -> str:
    rows = [json.loads(line) for p in paths for line in Path(p).read_text().splitlines() if line.strip()]
    comps = comparisons(rows)
    out = []
    for run, shape in dict.fromkeys((r["run"], r["shape"]) for r in rows if r.get("shape")):
        mine = [r for r in rows if (r["run"], r.get("shape")) == (run, shape)]
        first = mine[0]
        slo = (first.get("slo") or {}).get(shape)
        out += [f"**{shape}** ({first['device']}, {first['model']}, run {run} at {first['commit']}, "
                f"{first['concurrency']} in flight, {first['requests']} requests a phase"
                + (f"; SLO TTFT p99 {slo['ttft_p99_ms']:.0f} ms, ITL p99 {slo['itl_p99_ms']:.0f} ms" if slo else "")
                + ")", "",
                "| lever | instances | tok/s (mean) | ratio [95% interval] | half-width | TTFT p50/p99 ms | "
                "ITL p50/p99 ms | TPOT p99 ms | ITL a token p99 ms | e2e p99 ms | repeat share | API servers | "
                "API CPU share | client CPU share |" + (" within SLO |" if slo else ""),
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if slo else "")]
        for lever in dict.fromkeys(r["lever"] for r in mine):
            group = [r for r in mine if r["lever"] == lever and r.get("tps")]
            c = comps.get((run, shape, lever))
            ratio = (f"{c.ratio:.3f} [{c.low:.3f}, {c.high:.3f}]" if c and c.high != math.inf else
                     f"{c.ratio:.3f} [open]" if c else "-")
            width = f"{half_width(c):.1%}" if c and lever != "defaults" else "-"
            mean = f"{statistics.fmean(r['tps'] for r in group):,.0f}" if group else "-"
            within = ""
            if slo:
                ok = sum(r["ttft_ms"].get("p99", math.inf) <= slo["ttft_p99_ms"]
                         and r["itl_ms"].get("p99", math.inf) <= slo["itl_p99_ms"] for r in group)
                within = f" {ok}/{len(group)} |"
            repeats = ",".join(f"{r['repeat_share']:.2f}" for r in group if r.get("repeat_share") is not None) or "-"
            api = ",".join(sorted({str(r.get("api_processes")) for r in group}))
            share = ",".join(f"{r['api_cpu_share']:.2f}" for r in group if r.get("api_cpu_share") is not None)
            client = ",".join(f"{r['client_cpu_share']:.2f}" for r in group
                              if r.get("client_cpu_share") is not None) or "-"
            out.append(f"| {lever} | {len(group)} | {mean} | {ratio} | {width} | "
                       f"{_median(group, 'ttft_ms', 'p50')}/{_median(group, 'ttft_ms', 'p99')} | "
                       f"{_median(group, 'itl_ms', 'p50')}/{_median(group, 'itl_ms', 'p99')} | "
                       f"{_median(group, 'tpot_ms', 'p99')} | {_median(group, 'itl_token_ms', 'p99')} | "
                       f"{_median(group, 'latency_ms', 'p99')} | {repeats} | {api} | {share} | {client} |{within}")
        failed = [r for r in rows if r.get("failure") and r["run"] == run]
        out += [f"| {r['lever']} | failed to start | {r['failure']}: {r['detail'][:120]} |" for r in failed]
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="measure levers against the defaults")
    r.add_argument("--shape", action="append", choices=sorted(SHAPES), help="(repeatable) default: serving-c32, "
                   "serving-c128, rag-c32")
    r.add_argument("--lever", action="append", choices=sorted(LEVERS), help="(repeatable) default: FIRST_LEVERS")
    r.add_argument("--instances", type=int, default=2, help="first rounds: instances of every config")
    r.add_argument("--also", action="append", default=[], choices=sorted(LEVERS), help="(repeatable) a lever "
                   "measured once after the first rounds, its interval from the noise pooled over the others")
    r.add_argument("--bar", type=float, default=BAR, help="half-width to reach (0.05: 5%%)")
    r.add_argument("--budget-s", type=float, default=1200.0, help="no instance starts unless the longest one so far "
                   "(but the first) still fits (the first rounds take turns, "
                   "so a cut leaves every lever measured once)")
    r.add_argument("--max-defaults-spread", type=float, default=math.inf, help="stop once two instances of the "
                   "defaults differ by more than this on a shape "
                   "(0.10: 10%%; a host that noisy cannot resolve a lever)")
    r.add_argument("--model", default=str(ROOT / "runs" / "models" / "gemma-3-270m"))
    r.add_argument("--extra-flag", action="append", default=[], help="a flag every instance gets (repeatable; "
                   "the stand-in: --extra-flag=--load-format --extra-flag=dummy)")
    r.add_argument("--space", type=Path)
    r.add_argument("--out", type=Path, default=Path("/tmp/levers.jsonl"))
    r.add_argument("--raw", type=Path, default=Path("/tmp/levers-raw"))
    r.add_argument("--start-timeout", type=float, default=900.0)
    r.add_argument("--launcher", type=Path, help=argparse.SUPPRESS)   # tests: a stand-in server script
    t = sub.add_parser("table", help="the markdown tables from raw lever files")
    t.add_argument("paths", nargs="+", type=Path)
    args = parser.parse_args(argv)
    if args.cmd == "table":
        print(table(args.paths))
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
