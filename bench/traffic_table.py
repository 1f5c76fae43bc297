"""The same configs measured side by side, in one run, on the challenge meter, the realistic default
and the chat example: what the meter choice does to a config's ratio.

    .venv/bin/python bench/traffic_table.py                    # CPU: defaults, core binding, binding + ngram
    .venv/bin/python bench/traffic_table.py --only defaults,no-prefix-cache --workloads conversations-cpu,chat-cpu
    python3 bench/traffic_table.py --gpu                       # GPU: defaults, ngram, ngram_gpu with async scheduling
    python3 bench/traffic_table.py --gpu --levers --repeats 3  # GPU: one stream's levers, one at a time

One fresh server per config (the space's fixed flags, the workloads' context length, the shipped
Gemma chat template); on it, for each workload, its warm-ups, then `--repeats` measured phases of
fresh requests through the trial's own meter (sandbox.worker._measure). Prints one table with each
config's TPS ratio to the defaults per workload, speculative acceptance, the answers' repeat share
(sandbox.bench.lookup_hits), TTFT and ITL p99, and how
the requests ended; writes it and rows.jsonl under runs/traffic-table/<stamp>/. A server instance is
the unit of noise (±3-8% here, ±10% on the H200): a ratio within that says nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sandbox import bench, worker  # noqa: E402
from sandbox.failures import TrialFailure  # noqa: E402
from sandbox.server import Server  # noqa: E402
from sandbox.spec import argv_of  # noqa: E402
from sandbox.workload import DATA, load_workload  # noqa: E402

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
CPU = {
    "fixed": ({"max-model-len": 2048}, {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_USE_AOT_COMPILE": "0"}),
    "configs": {"defaults": ({}, {}),
                "binding": ({}, {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}),
                "binding+ngram": ({"speculative-config": NGRAM}, {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}),
                "no-prefix-cache": ({"enable-prefix-caching": False}, {}),
                # the draft-model path (the target as its own draft), with and without one KV cache group
                "draft-self": ({"speculative-config": {"method": "draft_model", "model": "MODEL",
                                                       "num_speculative_tokens": 4},
                                "disable-hybrid-kv-cache-manager": True}, {}),
                "draft-self-hybrid": ({"speculative-config": {"method": "draft_model", "model": "MODEL",
                                                              "num_speculative_tokens": 4}}, {})},
    "workloads": ["challenge-cpu", "default-cpu", "chat-cpu"],
}
GPU = {
    "fixed": ({"max-model-len": 4096}, {}),
    "configs": {"defaults": ({}, {}),
                "ngram": ({"speculative-config": NGRAM}, {}),
                "ngram_gpu+async": ({"speculative-config": {**NGRAM, "method": "ngram_gpu"}, "async-scheduling": True},
                                    {}),
                # the draft-model path with the target as its own draft (same tokenizer by construction):
                # no smaller Gemma is reachable here, so this tests the path and claims no gain
                "draft-self": ({"speculative-config": {"method": "draft_model", "model": "MODEL",
                                                       "num_speculative_tokens": 4},
                                "disable-hybrid-kv-cache-manager": True}, {}),   # as agent/drafts.py sets it
                "draft-self-hybrid": ({"speculative-config": {"method": "draft_model", "model": "MODEL",
                                                              "num_speculative_tokens": 4}}, {})},
    "workloads": ["challenge-short", "default", "chat-cpu"],
}
# The levers a GPU expert tries first on one stream of short sampled requests (issue 25), each
# against the defaults on the realistic default, the challenge meter a second column; the defaults
# measured on a second instance last, so the table shows one instance's spread beside the ratios.
GPU_LEVERS = {
    "fixed": ({"max-model-len": 4096}, {}),
    "configs": {"defaults": ({}, {}),
                "stream-interval-8": ({"stream-interval": 8}, {}),
                "no-async": ({"async-scheduling": False}, {}),
                "full-decode-only": ({"compilation-config": {"cudagraph_mode": "FULL_DECODE_ONLY"}}, {}),
                "triton-attn": ({"attention-backend": "TRITON_ATTN"}, {}),
                "torch-sampler": ({}, {"VLLM_USE_FLASHINFER_SAMPLER": "0"}),
                "defaults-again": ({}, {}),
                # longer drafts than the space's k<=8 (issue 25): what they add where outputs repeat
                "ngram-gpu-k8": ({"speculative-config": {"method": "ngram_gpu", "num_speculative_tokens": 8,
                                                         "prompt_lookup_min": 2, "prompt_lookup_max": 8}}, {}),
                "ngram-gpu-k16": ({"speculative-config": {"method": "ngram_gpu", "num_speculative_tokens": 16,
                                                          "prompt_lookup_min": 2, "prompt_lookup_max": 8}}, {})},
    "workloads": ["default", "challenge-short"],
    "repeats": {"challenge-short": 1},   # the second column: one phase of 24 x 256 tokens
}


def measure(server: Server, name: str, repeats: int) -> dict:
    w = load_workload(name)
    asyncio.run(bench.run_requests(server.base_url, server.model_name, w.warmups(), w.concurrency, 900))
    runs = [asyncio.run(worker._measure(server, w, w.measured(r), bench.bench_deadline_s(w))) for r in range(repeats)]
    tps = [b.tps for b, _ in runs]
    finish: dict[str, int] = {}
    for b, _ in runs:
        for k, v in b.finish.items():
            finish[k] = finish.get(k, 0) + v
    drafted = sum(m.get("spec_draft_tokens") or 0 for _, m in runs)
    accepted = sum(m.get("spec_accepted_tokens") or 0 for _, m in runs)
    words = sum(b.repeat_words for b, _ in runs)
    return {"workload": name, "tps": round(statistics.median(tps), 3), "repeats_tps": tps,
            "acceptance": round(accepted / drafted, 3) if drafted else None,
            "repeat_share": round(sum(b.repeat_hits for b, _ in runs) / words, 3) if words else None,
            "ttft_p50_ms": round(statistics.median(b.ttft_ms.get("p50", 0) for b, _ in runs), 1),
            "ttft_p99_ms": max(b.ttft_ms.get("p99", 0) for b, _ in runs),
            "itl_p99_ms": max(b.itl_ms.get("p99", 0) for b, _ in runs), "finish": finish,
            "errors": sum(b.errors for b, _ in runs)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="store_true", help="the GPU configs and workloads")
    parser.add_argument("--levers", action="store_true", help="the GPU levers for one stream (with --gpu)")
    parser.add_argument("--model", default=str(ROOT / "runs" / "models" / "gemma-3-270m"))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--only", help="comma-separated config names")
    parser.add_argument("--workloads", help="comma-separated workload names (default: the plan's)")
    args = parser.parse_args()
    plan = (GPU_LEVERS if args.levers else GPU) if args.gpu else CPU
    if args.workloads:
        plan["workloads"] = args.workloads.split(",")
    out = ROOT / "runs" / "traffic-table" / datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True)
    fixed_flags, fixed_env = plan["fixed"]
    rows, refused = [], {}
    names = args.only.split(",") if args.only else list(plan["configs"])   # --only's order is the run's
    if unknown := [n for n in names if n not in plan["configs"]]:
        parser.error(f"--only: {', '.join(unknown)} not in this plan ({', '.join(plan['configs'])})")
    for config in names:
        flags, env = plan["configs"][config]
        if flags.get("speculative-config", {}).get("model") == "MODEL":
            flags = {**flags, "speculative-config": {**flags["speculative-config"], "model": args.model}}
        server = Server(args.model, argv_of({**fixed_flags, **flags})
                        + ["--chat-template", str(DATA / "traffic" / "gemma-chat.jinja")],
                        {**fixed_env, **env}, out / f"{config}.server.log")
        try:
            began = time.monotonic()
            try:
                server.start()
                server.wait_ready(900)
            except TrialFailure as e:   # a config the engine refuses is a row too, and the next one runs
                refused[config] = f"{e.klass}: {e.message}"
                print(f"{config}: refused: {refused[config]}", flush=True)
                with open(out / "rows.jsonl", "a") as f:
                    f.write(json.dumps({"config": config, "refused": refused[config]}) + "\n")
                continue
            print(f"{config}: ready in {time.monotonic() - began:.0f} s", flush=True)
            for name in plan["workloads"]:
                row = {"config": config, **measure(server, name, plan.get("repeats", {}).get(name, args.repeats))}
                rows.append(row)
                print(json.dumps(row), flush=True)
                with open(out / "rows.jsonl", "a") as f:
                    f.write(json.dumps(row) + "\n")
        finally:
            server.stop(30)
    base = {r["workload"]: r["tps"] for r in rows if r["config"] == "defaults"}
    lines = ["| config | workload | tok/s | ratio | acceptance | repeat share | TTFT p50 ms | TTFT p99 ms | ITL p99 ms "
             "| ended (eos/stop/length) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['tps'] / base[r['workload']]:.3f}x" if base.get(r["workload"]) else "-"
        ended = "/".join(str(r["finish"].get(k, 0)) for k in ("eos", "stop", "length"))
        lines.append(f"| {r['config']} | {r['workload']} | {r['tps']:.2f} | {ratio} | "
                     f"{r['acceptance'] if r['acceptance'] is not None else '-'} "
                     f"| {r['repeat_share'] if r['repeat_share'] is not None else '-'} "
                     f"| {r['ttft_p50_ms']:.0f} | {r['ttft_p99_ms']:.0f} | {r['itl_p99_ms']:.0f} | {ended} |")
    lines += [f"| {config} | all | refused at start: {' '.join(why.split()).replace('|', '/')[:300]} |"
              for config, why in refused.items()]
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
