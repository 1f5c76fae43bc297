#!/usr/bin/env bash
# One block of GPU time for the lever table in docs/results.md, in priority order, each step's raw
# output under $R (default /tmp/res): the embedded model's levers on serving-c32, serving-c128 and
# rag-c32 (scripts/lever_table.py, $LEVER_S seconds at most), then the 8B-shaped stand-in with dummy
# weights on fixed-length answers with what is left of $BLOCK_S.
# Run from the project root on the GPU host once its packages are installed (a development tool:
# ../shared/tools/gpu/on-device.sh, or `agent bundle` and `VENV=/opt/torch/.venv scripts/setup.sh --offline`).
#     R=/tmp/res BLOCK_S=1300 LEVER_S=900 setsid nohup bash scripts/gpu_lever_block.sh > /tmp/res/block.log 2>&1 &
set -u
R=${R:-/tmp/res}
BLOCK_S=${BLOCK_S:-1300}
LEVER_S=${LEVER_S:-900}
PY=${PY:-python3}
mkdir -p "$R/raw"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1
began=$(date +%s)
step() { echo "=== $(date -u +%T) (+$(( $(date +%s) - began )) s) $*" | tee -a "$R/steps.log"; }
left() { echo $(( BLOCK_S - ($(date +%s) - began) )); }

step "model prepare"
$PY -m agent.cli model prepare > "$R/prepare.log" 2>&1 || { step "prepare failed"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$R/gpu.csv" 2>&1

step "levers of the embedded model (at most $LEVER_S s)"
$PY scripts/lever_table.py run --instances 2 --budget-s "$LEVER_S" --out "$R/levers-gpu.jsonl" \
    --raw "$R/raw" > "$R/levers.log" 2>&1 || step "lever table failed"

step "the 8B-shaped stand-in, dummy weights ($(left) s left)"
$PY scripts/make_standin.py > "$R/standin.log" 2>&1 || step "stand-in failed"
budget=$(( $(left) - 30 ))
if [ "$budget" -ge 150 ]; then
  $PY scripts/lever_table.py run --model runs/models/standin-8b --extra-flag=--load-format --extra-flag=dummy \
      --shape fixed-c32 --shape fixed-c128 --lever kv-cache-fp8 --lever max-num-seqs-64 --lever graphs-to-32 \
      --instances 2 --budget-s "$budget" --out "$R/levers-standin.jsonl" --raw "$R/raw" >> "$R/standin.log" 2>&1 \
      || step "stand-in table failed"
else
  step "stand-in skipped: $(left) s left"
fi
step "done"
