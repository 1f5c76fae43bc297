"""The agent's meter against vLLM's own `vllm bench serve`, interleaved on one server.

    .venv/bin/python bench/meter_vs_vllm_bench.py --pairs 8 --arms agent,vllm,old
    .venv/bin/python bench/meter_vs_vllm_bench.py --pairs 8 --sampled 1.0

Starts ONE vLLM server (or measures one already running, --url) with the CPU space's fixed flags and environment
(search_space/vllm-cpu.yaml: max-model-len 2048, VLLM_CPU_KVCACHE_SPACE=2,
VLLM_USE_AOT_COMPILE=0), warms it up once with the workload's warm-up prompts, then runs N
interleaved rounds. Each round measures every arm once, the order rotating from round to round
so that drift hits all arms alike:

- `agent`: the agent's meter exactly as a trial runs it, `sandbox.worker._measure` (the
  measured phase of `sandbox.bench.run_requests`, each request through vLLM's own request
  function, with the metrics sampler beside it);
- `vllm`: `vllm bench serve` as a subprocess on the same prompts (a custom-dataset JSONL of the
  workload's prompts, in order, no chat template), the same output length, `--ignore-eos`,
  `--temperature 0`, `--max-concurrency` = the workload's concurrency, request rate inf, no
  warm-ups (the server is warm); its figures are read from `--save-result` JSON;
- `bare` (experiment): `sandbox.bench.run_requests` without the metrics sampler;
- `old` (experiment): the agent's meter with sandbox/bench.py as committed at `--rev` (default
  5d132f0, the plain asyncio reader of meter_version 3; aa1c0fb is the httpx meter of version 1);
- `deferred` (experiment): the agent's meter with the sampler's parsing moved after the phase.

What each meter counts (the definitions, from the code):

- agent (sandbox/bench.py, sandbox/worker.py): TPS = sum over successful requests of the
  server's `usage.completion_tokens` (read by vLLM's request function from each stream's usage
  chunk) / wall time of the measured phase, from just before the first request is handed to the
  event loop until the last request's stream has ended. The aiohttp session is opened before
  the clock starts. During the phase the metrics sampler (sandbox/metrics.py) GETs /metrics
  every second and parses it in the same process.
- vllm (vllm/benchmarks/serve.py, 0.32.0): output_throughput = sum over successful requests of
  `usage.completion_tokens` (client tokenizer only if the server sent no usage) /
  benchmark_duration, which runs from just before the first request task is created until
  `asyncio.gather` of all of them returns (the aiohttp session is opened before it, and the
  /metrics reads for speculative decoding are before and after it).

Both count the same tokens here (64 per request, checked per round) and time the same span; the
script records, per measurement, the client's own CPU seconds in the measured phase, the server
processes' CPU seconds (API server and engine core), the CPU seconds of everything else on the
host ("other": a neighbour's tests, say, which a 2-core host feels at once), the mean TTFT and
inter-token latency, and the sum of per-request latencies (wall minus that sum is the time
between requests), so a difference can be traced to its cause.

Writes rounds.jsonl, the table and the server log under runs/meter-vs-bench/<stamp>/. The
server's whole process group is torn down on any exit, error or signal included.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sandbox import bench, metrics, worker  # noqa: E402
from sandbox.server import Server  # noqa: E402
from sandbox.workload import load_workload  # noqa: E402

# `vllm bench serve` without the `vllm` console script (vllm-cpu 0.32.0's `vllm` command and
# `python -m vllm.entrypoints.cli.main` fail on importlib.metadata.version("vllm")). The same
# parser and main; benchmark() is wrapped only to record the client's CPU seconds around it, and
# the custom dataset's JSONL is read with json instead of pandas (not installed with vllm-cpu;
# its placeholder fails the same way): the same rows, in file order (--disable-shuffle).
BENCH_WRAPPER = r"""
import json, sys, time
import psutil
from vllm.benchmarks import serve
from vllm.benchmarks.datasets import datasets
def load_data(self):
    with open(self.dataset_path) as f:
        self.data = [json.loads(line) for line in f if line.strip()]
    assert getattr(self, "disable_shuffle", False)
datasets.CustomDataset.load_data = load_data
cpu_out, server_pid = sys.argv.pop(1), int(sys.argv.pop(1))
def server_cpu():
    out = {"api_server": 0.0, "engine": 0.0}
    if not server_pid:
        return out
    root = psutil.Process(server_pid)
    for p in [root, *root.children(recursive=True)]:
        t = p.cpu_times()
        out["api_server" if p.pid == server_pid else "engine"] += t.user + t.system
    return out
def host_busy():
    t = psutil.cpu_times()
    return sum(t) - t.idle - sum(getattr(t, k, 0.0) for k in ("iowait", "guest", "guest_nice"))
inner = serve.benchmark
async def timed(*a, **k):
    c0, w0, s0, h0 = time.process_time(), time.perf_counter(), server_cpu(), host_busy()
    try:
        return await inner(*a, **k)
    finally:
        c1, w1, s1, h1 = time.process_time(), time.perf_counter(), server_cpu(), host_busy()
        with open(cpu_out, "w") as f:
            json.dump({"client_cpu_s": c1 - c0, "span_s": w1 - w0, "host_busy_s": h1 - h0,
                       "server_cpu_s": {k: s1[k] - s0[k] for k in s1}}, f)
serve.benchmark = timed
from vllm.utils.argparse_utils import FlexibleArgumentParser
p = FlexibleArgumentParser()
serve.add_cli_args(p)
serve.main(p.parse_args())
"""


SAMPLED_SEED = 0


class Attached:
    """A server already running (--url): measured as it is, never started or stopped here."""
    proc = None

    def __init__(self, url: str, model: str):
        self.base_url, self.model_name = url.rstrip("/"), model

    def start(self) -> None:
        pass

    def wait_ready(self, timeout_s: float) -> None:
        import httpx
        self.model_name = httpx.get(f"{self.base_url}/v1/models", timeout=10).json()["data"][0]["id"]

    def fail_if_dead(self, phase: str) -> None:
        pass

    def api_cpu_seconds(self) -> None:
        return None   # another's processes: not read

    def stop(self):
        from types import SimpleNamespace
        return SimpleNamespace(leftover_pids=[], port_free=None)


def fixed_flags_env(space_path: Path) -> tuple[list[str], dict[str, str]]:
    raw = yaml.safe_load(space_path.read_text())
    fixed = raw.get("fixed") or {}
    argv: list[str] = []
    for name, value in (fixed.get("flags") or {}).items():
        argv += [f"--{name}"] if value is True else [f"--no-{name}"] if value is False else [f"--{name}", str(value)]
    return argv, {k: str(v) for k, v in (fixed.get("env") or {}).items()}


def server_cpu(server: Server) -> dict[str, float]:
    """CPU seconds so far of the server's processes: the API server (root) and the rest."""
    out = {"api_server": 0.0, "engine": 0.0}
    if server.proc is None:   # --url: a server this script did not start
        return out
    try:
        root = psutil.Process(server.proc.pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return out
    for p in procs:
        try:
            t = p.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        out["api_server" if p.pid == root.pid else "engine"] += t.user + t.system
    return out


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: round(after[k] - before.get(k, 0.0), 3) for k in after}


def host_busy() -> float:
    """CPU seconds the whole host has been busy (all cores, idle and iowait excluded)."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - sum(getattr(t, k, 0.0) for k in ("iowait", "guest", "guest_nice"))


def own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def committed_bench(rev: str):
    """sandbox/bench.py as committed at rev (the meter before this change), loaded as a module."""
    import importlib.util
    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:sandbox/bench.py"], check=True,
                          capture_output=True, text=True).stdout
    spec = importlib.util.spec_from_loader(f"bench_{rev}", loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    exec(compile(text, f"{rev}:sandbox/bench.py", "exec"), module.__dict__)
    return module


class DeferredSampler(metrics.Sampler):
    """The metrics sampler with its parsing moved after the phase (an experiment, --arms deferred):
    during the phase it only fetches /metrics' text; the same gauges are parsed when it stops."""

    async def run(self, stop: asyncio.Event) -> None:
        import httpx
        texts: list[str] = []
        async with httpx.AsyncClient(timeout=5.0) as client:
            while not stop.is_set():
                try:
                    response = await client.get(f"{self.base_url}/metrics")
                    if response.status_code == 200:
                        texts.append(response.text)
                except httpx.HTTPError:
                    pass
                try:
                    await asyncio.wait_for(stop.wait(), self.interval_s)
                except TimeoutError:
                    pass
        for text in texts:
            values = metrics.parse(text)
            for series, names in ((self.kv_usage, metrics.KV_USAGE), (self.waiting, metrics.WAITING),
                                  (self.running, metrics.RUNNING)):
                if (value := metrics.first(values, names)) is not None:
                    series.append(value)


def run_agent(server: Server, workload, requests: list, timeout_s: float, sampler: bool, meter=None,
              sampler_class=None) -> dict:
    """The agent's meter through sandbox.worker._measure (sampler=True) or run_requests alone;
    meter swaps the bench module (the committed one for arm old), sampler_class the sampler."""
    cpu0, srv0, host0 = own_cpu(), server_cpu(server), host_busy()
    if sampler:
        saved = worker.bench, metrics.Sampler
        worker.bench, metrics.Sampler = meter or bench, sampler_class or saved[1]
        try:
            result, explained = asyncio.run(worker._measure(server, workload, requests, timeout_s))
        finally:
            worker.bench, metrics.Sampler = saved
    else:
        results, wall = asyncio.run(bench.run_requests(server.base_url, server.model_name, requests,
                                                       workload.concurrency, timeout_s))
        result, explained = bench.summarize(results, wall, requests), None
    cpu1, srv1, host1 = own_cpu(), server_cpu(server), host_busy()
    return {"tps": result.tps, "tokens": result.output_tokens, "wall_s": result.wall_s,
            "requests": result.requests, "errors": result.errors, "short": result.short_outputs,
            "ttft_ms_mean": result.ttft_ms.get("mean"), "itl_ms_mean": result.itl_ms.get("mean"),
            "latency_sum_s": round(result.latency_ms.get("mean", 0) * result.requests / 1000, 3),
            "client_cpu_s": round(cpu1 - cpu0, 3), "server_cpu_s": delta(srv1, srv0),
            "foreign_cpu_s": round((host1 - host0) - (cpu1 - cpu0) - sum(srv1.values()) + sum(srv0.values()), 3),
            "metrics_samples": explained.get("samples") if explained else None, "finish": result.finish}


def run_vllm(server: Server, workload, jsonl: Path, out_dir: Path, tag: str, timeout_s: float,
             stop: list[str] | None = None) -> dict:
    name = f"vllm-{tag}.json"
    cpu_file = out_dir / f"vllm-{tag}.cpu.json"
    argv = [sys.executable, "-c", BENCH_WRAPPER, str(cpu_file), str(server.proc.pid if server.proc else 0),
            "--backend", "openai", "--endpoint", "/v1/completions", "--base-url", server.base_url,
            "--model", server.model_name, "--tokenizer", server.tokenizer,
            "--dataset-name", "custom", "--dataset-path", str(jsonl), "--skip-chat-template",
            "--disable-shuffle", "--custom-output-len", str(workload.max_tokens),
            "--num-prompts", str(workload.num_prompts), "--max-concurrency", str(workload.concurrency),
            "--request-rate", "inf", "--num-warmups", "0", "--temperature", str(workload.temperature),
            # Sampled: one seed for every request, as the agent's arms send them here (main), so both
            # meters send the same requests and read the same answers.
            *(["--extra-body", json.dumps({"seed": SAMPLED_SEED, **({"stop": stop} if stop else {})})]
              if workload.temperature else []),
            *(["--ignore-eos"] if workload.ignore_eos else []), "--disable-tqdm",
            "--save-result", "--save-detailed", "--result-dir", str(out_dir), "--result-filename", name]
    with open(out_dir / f"vllm-{tag}.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1",
                                     "PYTHONUNBUFFERED": "1"})
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"vllm bench serve did not finish in {timeout_s:.0f} s") from None
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    if proc.returncode != 0:
        tail = (out_dir / f"vllm-{tag}.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"vllm bench serve exited {proc.returncode}:\n{tail}")
    data = json.loads((out_dir / name).read_text())
    cpu = json.loads(cpu_file.read_text())
    lat = [t + sum(i) for t, i in zip(data["ttfts"], data["itls"], strict=False)]
    return {"tps": round(data["output_throughput"], 3), "tokens": data["total_output_tokens"],
            "wall_s": round(data["duration"], 3), "requests": data["num_prompts"],
            "errors": data["num_prompts"] - data["completed"],
            "short": sum(1 for n in data["output_lens"] if workload.ignore_eos and n != workload.max_tokens),
            "ttft_ms_mean": round(data["mean_ttft_ms"], 2), "itl_ms_mean": round(data["mean_itl_ms"], 2),
            "latency_sum_s": round(sum(lat), 3), "client_cpu_s": round(cpu["client_cpu_s"], 3),
            "server_cpu_s": {k: round(v, 3) for k, v in cpu["server_cpu_s"].items()},
            "foreign_cpu_s": round(cpu["host_busy_s"] - cpu["client_cpu_s"] - sum(cpu["server_cpu_s"].values()), 3),
            "metrics_samples": None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--arms", default="agent,vllm",
                        help="comma-separated: agent, bare, vllm; old (the committed meter at --rev) and "
                             "deferred (metrics parsed after the phase) are experiments")
    parser.add_argument("--rev", default="5d132f0", help="the commit whose sandbox/bench.py arm old runs "
                        "(default: the last one with the asyncio reader, meter_version 3; aa1c0fb: httpx)")
    parser.add_argument("--url", help="measure this running server instead of starting one (its CPU is not "
                                      "counted); --model is then its tokenizer's folder")
    parser.add_argument("--model", default=str(ROOT / "runs" / "models" / "gemma-3-270m"))
    parser.add_argument("--workload", default="challenge-cpu")
    parser.add_argument("--space", type=Path, default=ROOT / "search_space" / "vllm-cpu.yaml")
    parser.add_argument("--out", type=Path, help="output folder (default runs/meter-vs-bench/<stamp>)")
    parser.add_argument("--start-timeout", type=float, default=600.0)
    parser.add_argument("--sampled", type=float, metavar="T",
                        help="sampled, EOS-terminated: the workload's requests at temperature T, seeded, without "
                             "ignore_eos (vllm bench serve: --temperature T --extra-body '{\"seed\": 0}')")
    parser.add_argument("--stop", help="with --sampled: a JSON list of stop strings every request carries on both "
                                       "meters, so requests end where the text does, not at their length")
    args = parser.parse_args(argv)
    stop = json.loads(args.stop) if args.stop else None
    if stop is not None and (args.sampled is None or not isinstance(stop, list)):
        parser.error("--stop: a JSON list of strings, with --sampled")
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if not set(arms) <= {"agent", "bare", "vllm", "old", "deferred"} or "vllm" not in arms or len(arms) < 2:
        parser.error("--arms: two or more of agent, bare, vllm, old, deferred, vllm included")
    old = committed_bench(args.rev) if "old" in arms else None

    workload = load_workload(args.workload)
    if workload.traffic:   # vllm bench serve's custom dataset takes one length and one sampling for all
        sys.exit(f"error: --workload {args.workload}: a traffic workload; this comparison takes a template one "
                 f"(challenge-cpu, smoke, ...)")
    if args.sampled is not None:   # every request sampled and free to stop at EOS, on both meters
        workload = replace(workload, name=f"{workload.name}+sampled" + ("+stop" if args.stop else ""),
                           temperature=args.sampled, ignore_eos=False)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    out = args.out or ROOT / "runs" / "meter-vs-bench" / stamp
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / "prompts.jsonl"
    jsonl.write_text("".join(json.dumps({"prompt": r.body["prompt"]}) + "\n" for r in workload.measured(0)))
    flags, env = fixed_flags_env(args.space)
    server = Attached(args.url, args.model) if args.url else Server(args.model, flags, env, out / "server.log")
    server.tokenizer = args.model
    requests = workload.measured(0)
    if args.sampled is not None:
        requests = [replace(r, body={**r.body, "seed": SAMPLED_SEED, **({"stop": stop} if stop else {})})
                    for r in requests]

    def stop_on_signal(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop_on_signal)
    rows: list[dict] = []
    print(f"{workload.name} (meter_version {workload.meter_version}, hash {workload.hash}): "
          f"{workload.num_prompts} prompts x {workload.max_tokens} tokens, concurrency {workload.concurrency}; "
          f"server {' '.join(flags)} {' '.join(f'{k}={v}' for k, v in env.items())}; output {out}", flush=True)
    try:
        t0 = time.monotonic()
        server.start()
        server.wait_ready(args.start_timeout)
        print(f"server ready in {time.monotonic() - t0:.0f} s ({server.base_url})", flush=True)
        warm, _ = asyncio.run(bench.run_requests(server.base_url, server.model_name, workload.warmups(),
                                                 workload.concurrency, 300))
        if any(not r.ok for r in warm):
            raise RuntimeError(f"warm-up failed: {next(r.error for r in warm if not r.ok)}")
        timeout_s = bench.bench_deadline_s(workload)
        for i in range(args.pairs):
            order = arms[i % len(arms):] + arms[:i % len(arms)]
            row = {"round": i + 1, "order": order}
            for arm in order:
                server.fail_if_dead(f"round {i + 1}")
                if arm == "vllm":
                    row[arm] = run_vllm(server, workload, jsonl, out, f"{i + 1}", timeout_s + 120, stop)
                elif arm == "old":
                    row[arm] = run_agent(server, workload, requests, timeout_s, sampler=True, meter=old)
                elif arm == "deferred":
                    row[arm] = run_agent(server, workload, requests, timeout_s, sampler=True,
                                         sampler_class=DeferredSampler)
                else:
                    row[arm] = run_agent(server, workload, requests, timeout_s, sampler=(arm == "agent"))
                m = row[arm]
                if m["errors"] or m["short"] or (workload.ignore_eos and
                                                 m["tokens"] != workload.num_prompts * workload.max_tokens):
                    raise RuntimeError(f"round {i + 1} {arm}: {m['errors']} errors, {m['short']} short, "
                                       f"{m['tokens']} tokens")
            for arm in arms:
                if arm != "vllm":
                    row[f"ratio_{arm}"] = round(row[arm]["tps"] / row["vllm"]["tps"], 4)
            if len({row[a]["tokens"] for a in arms}) > 1:   # the same requests and seeds: the same answers
                print(f"note: round {i + 1}: the arms read different token counts "
                      f"{ {a: row[a]['tokens'] for a in arms} }", flush=True)
            rows.append(row)
            with open(out / "rounds.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
            print("round {}: {}".format(i + 1, ", ".join(
                f"{a} {row[a]['tps']:.2f} tok/s ({row[a]['tokens']} tokens, {row[a]['wall_s']:.2f} s, "
                f"client CPU {row[a]['client_cpu_s']:.2f} s)" for a in order)), flush=True)
    except KeyboardInterrupt as e:
        print(f"interrupted: {e}", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, lambda s, f: None)  # let teardown finish
        cleanup = server.stop()
        print(f"server stopped: leftover pids {cleanup.leftover_pids}, port free {cleanup.port_free}", flush=True)

    table = render(rows, arms)
    print(table)
    (out / "table.md").write_text(table + "\n")
    return 0


def render(rows: list[dict], arms: list[str]) -> str:
    others = [a for a in arms if a != "vllm"]
    head = ["round", "order"]
    for a in arms:
        head += [f"{a} tok/s", f"{a} wall s", f"{a} client CPU s", f"{a} API-server CPU s", f"{a} other CPU s"]
    head += [f"{a}/vllm" for a in others]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [str(r["round"]), " > ".join(r["order"])]
        for a in arms:
            m = r[a]
            cells += [f"{m['tps']:.2f}", f"{m['wall_s']:.2f}", f"{m['client_cpu_s']:.2f}",
                      f"{m['server_cpu_s'].get('api_server', float('nan')):.2f}",
                      f"{m.get('foreign_cpu_s', float('nan')):.2f}"]
        cells += [f"{r[f'ratio_{a}']:.3f}" for a in others]
        lines.append("| " + " | ".join(cells) + " |")
    if rows:
        cells = ["mean", ""]
        for a in arms:
            cells += [f"{statistics.fmean(r[a]['tps'] for r in rows):.2f}",
                      f"{statistics.fmean(r[a]['wall_s'] for r in rows):.2f}",
                      f"{statistics.fmean(r[a]['client_cpu_s'] for r in rows):.2f}",
                      f"{statistics.fmean(r[a]['server_cpu_s'].get('api_server', 0) for r in rows):.2f}",
                      f"{statistics.fmean(r[a].get('foreign_cpu_s', 0) for r in rows):.2f}"]
        cells += [f"{statistics.fmean(r[f'ratio_{a}'] for r in rows):.3f}" for a in others]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
