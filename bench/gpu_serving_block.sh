#!/usr/bin/env bash
# One block of GPU time for the serving-under-load figures in docs/results.md, in priority order, each
# step's raw output under $R (default /tmp/res): the phase table (concurrency 32 and 128 on one
# server: the first start of a fresh host, so cold), the meter against `vllm bench serve` (random
# 128/128 and the realistic prompts at fixed lengths), three warm starts phase by phase, then
# `agent run` on the GPU default with what is left of $BLOCK_S (at least 8 minutes, else skipped).
# Run from the project root on the GPU host once its packages are installed (a development tool:
# ../shared/tools/gpu/on-device.sh, or `agent bundle` and `VENV=/opt/torch/.venv scripts/setup.sh --offline`).
#     R=/tmp/res BLOCK_S=1380 setsid nohup bash bench/gpu_serving_block.sh > /tmp/res/block.log 2>&1 &
set -u
BLOCK_S=${BLOCK_S:-1380}
source "$(dirname "$0")/gpu_block_start.sh"   # $R, $PY, step, left; the model prepared

step "phase table: default (c32) then default-c128 on one server, 4 phases each"
$PY bench/phase_table.py run --workload default --workload default-c128 --phases 4 \
    --out "$R/phases-gpu.jsonl" --log-dir "$R" > "$R/phases.log" 2>&1 || step "phase table failed"

step "meter agreement at concurrency 32"
$PY bench/meter_agreement.py --rounds 3 --out "$R/agreement/gpu.jsonl" --log-dir "$R" \
    > "$R/agreement.log" 2>&1 || step "agreement failed"

LEN=$($PY -c "import sys; sys.path.insert(0, 'bench'); from phase_table import context; \
from sandbox.workload import load_workload; print(context('runs/models/gemma-3-270m', [load_workload('default')]))")
step "start breakdown: 3 starts of the GPU default (max-model-len $LEN), the host's caches"
$PY bench/start_breakdown.py --starts 3 --max-model-len "$LEN" --label warm --out "$R/starts" \
    > "$R/starts.log" 2>&1 || step "start breakdown failed"

budget=$(( $(left) / 60 - 1 ))
if [ "$budget" -ge 8 ]; then
  step "agent run --budget ${budget}m (the GPU default)"
  $PY -m agent.cli run --budget "${budget}m" > "$R/run.log" 2>&1 || step "agent run exited $?"
  $PY -m agent.cli ledger --json > "$R/ledger.json" 2>&1
  $PY -m agent.cli doctor > "$R/doctor.log" 2>&1
  $PY bench/trials_per_hour.py runs/ledger.sqlite > "$R/trials_per_hour.log" 2>&1
  cp runs/ledger.sqlite "$R/ledger.sqlite"
else
  step "agent run skipped: $(left) s left"
fi
step "done"
