"""Does a claim measured at a short max-model-len hold at the model's maximum? (issue 55)

Runs the sandbox worker on the embedded model with the README's meter (default-cpu: one stream,
the realistic default traffic), alternating max-model-len SHORT and LONG on fresh servers, for the
defaults and for core binding (VLLM_CPU_OMP_THREADS_BIND=0-<last core>), and prints each instance's
server start time and tokens/s, the means by length, and binding's ratio at each length. Raw results
go under OUT (one JSON a trial, as the worker writes them).

    .venv/bin/python bench/context_length_check.py --out docs/data/context-length --rounds 1
About 4 server instances a round, 2-7 minutes each on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

BASE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_USE_AOT_COMPILE": "0"}


def spec(max_model_len: int, env: dict) -> dict:
    return {"model": "embedded", "flags": {"max-model-len": max_model_len}, "env": {**BASE_ENV, **env},
            "workload": "default-cpu", "quality": "none", "repeats": 2}


def trial(out: Path, name: str, body: dict) -> dict:
    path = out / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    result = out / f"{name}.json"
    subprocess.run([sys.executable, "-m", "sandbox.worker", str(path), "--out", str(result)], check=False,
                   start_new_session=True, timeout=1800)
    found = json.loads(result.read_text())
    bench = found.get("bench") or {}
    return {"name": name, "status": found.get("status"), "start_s": (found.get("timings") or {}).get("start_s"),
            "tps": bench.get("tps")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--short", type=int, default=768)
    parser.add_argument("--long", type=int, default=32768)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    bind = {"VLLM_CPU_OMP_THREADS_BIND": f"0-{os.cpu_count() - 1}"}
    rows = []
    for r in range(args.rounds):
        for config, env in (("defaults", {}), ("binding", bind)):
            for length in (args.short, args.long) if r % 2 == 0 else (args.long, args.short):
                row = {**trial(args.out, f"r{r}-{config}-{length}", spec(length, env)), "config": config,
                       "length": length}
                rows.append(row)
                print(json.dumps(row), flush=True)
    (args.out / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
    print("\n| config | max-model-len | instances | start s (mean) | tok/s (mean) |\n|---|---|---|---|---|")
    means = {}
    for config in ("defaults", "binding"):
        for length in (args.short, args.long):
            ok = [x for x in rows if x["config"] == config and x["length"] == length and x["status"] == "ok"]
            if ok:
                means[config, length] = statistics.fmean(x["tps"] for x in ok)
                print(f"| {config} | {length} | {len(ok)} | {statistics.fmean(x['start_s'] for x in ok):.0f} | "
                      f"{means[config, length]:.2f} |")
    for length in (args.short, args.long):
        if ("binding", length) in means and ("defaults", length) in means:
            print(f"binding / defaults at {length}: {means['binding', length] / means['defaults', length]:.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
