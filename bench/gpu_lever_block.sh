#!/usr/bin/env bash
# One block of GPU time for the lever table in docs/results.md, in priority order, each step's raw
# output under $R (default /tmp/res): the embedded model's levers on serving-c32 and serving-c128
# ($LEVER_S seconds at most; a config's first start compiles, about 100 s on an H100, later ones
# about 55 s; every instance serves serving-c32, serving-c128 and rag-c32 in turn), then, with
# STANDIN=1, the 8B-shaped stand-in with dummy weights on fixed-length answers with what is left of $BLOCK_S. Each table stops early when
# two instances of the defaults differ by more than 10% (the first H100 block's host: 1.7x).
# Run from the project root on the GPU host once its packages are installed (a development tool:
# ../shared/tools/gpu/on-device.sh, or `agent bundle` and `VENV=/opt/torch/.venv scripts/setup.sh --offline`).
#     R=/tmp/res setsid nohup bash bench/gpu_lever_block.sh > /tmp/res/block.log 2>&1 &
set -u
BLOCK_S=${BLOCK_S:-1400}
LEVER_S=${LEVER_S:-1000}
source "$(dirname "$0")/gpu_block_start.sh"   # $R, $PY, step, left; the model prepared

step "levers of the embedded model on all three shapes (at most $LEVER_S s)"
# The third block: the levers the first two did not resolve on a quiet host. Two rounds of the
# front-end lever that read 1.107x on rag-c32 (one instance, block two), the graph sizes and async
# scheduling against the defaults; then one instance each of the rest (--also: intervals from the
# noise pooled over the others); then the widest row until the budget is spent.
# LEVERS replaces the lever arguments (a shorter block: fewer levers); SPREAD the defaults' spread
# at which the table stops (default 10%; the intervals account for the spread either way).
LEVERS=${LEVERS:-"--lever api-server-count-4 --lever graphs-to-2048 --lever no-async-scheduling --instances 2
    --also api-server-count-2 --also max-num-batched-tokens-16384 --also stream-interval-8"}
SHAPES=${SHAPES:-"--shape serving-c32 --shape serving-c128 --shape rag-c32"}   # a shorter block: fewer shapes
# shellcheck disable=SC2086
$PY bench/lever_table.py run $SHAPES $LEVERS \
    --budget-s "$LEVER_S" --max-defaults-spread "${SPREAD:-0.10}" --out "$R/levers-gpu.jsonl" --raw "$R/raw" \
    > "$R/levers.log" 2>&1 || step "lever table failed"

if [ "${STANDIN:-0}" = 1 ]; then
  step "the 8B-shaped stand-in, dummy weights ($(left) s left)"
  $PY bench/make_standin.py > "$R/standin.log" 2>&1 || step "stand-in failed"
  budget=$(( $(left) - 30 ))
  if [ "$budget" -ge 150 ]; then
    $PY bench/lever_table.py run --model runs/models/standin-8b --extra-flag=--load-format --extra-flag=dummy \
        --shape fixed-c32 --shape fixed-c128 --lever kv-cache-fp8 --lever max-num-seqs-64 --lever graphs-to-32 \
        --instances 1 --budget-s "$budget" --out "$R/levers-standin.jsonl" --raw "$R/raw" >> "$R/standin.log" 2>&1 \
        || step "stand-in table failed"
  else
    step "stand-in skipped: $(left) s left"
  fi
fi
step "done"
