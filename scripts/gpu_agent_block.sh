#!/usr/bin/env bash
# One block of GPU time for the agent's own run (issue 44, docs/results.md "What does a run give on a
# GPU under load?"): `agent run` for $RUN_M minutes on the lever table's long-prompt shape (rag.jsonl
# at 32 in flight, 256 requests a phase after 64 warm-ups, the shape where `--api-server-count 4`
# read 1.107x and 1.214x), then its ledger, report, doctor and trials per hour, and `agent verify`
# of the best branch when one was committed and time is left. Each step's output is under $R.
# The run works on a copy of the tree in /tmp/src: the device tool copies the working tree again on
# every watching call, and a trial's worker imports the code afresh.
# Run from the project root on the GPU host once its packages are installed (a development tool:
# ../shared/tools/gpu/on-device.sh, or `agent bundle` and `VENV=/opt/torch/.venv scripts/setup.sh --offline`).
#     R=/tmp/res RUN_M=25 setsid nohup bash scripts/gpu_agent_block.sh > /tmp/res/block.log 2>&1 &
set -u
BLOCK_S=${BLOCK_S:-1620}
RUN_M=${RUN_M:-25}
SRC=${SRC:-/tmp/src}
rm -rf "$SRC" && mkdir -p "$SRC"
tar --exclude=./.gpu --exclude=./.venv --exclude=./runs --exclude=./.git -cf - . | tar -C "$SRC" -xf -
cd "$SRC" || exit 1
source scripts/gpu_block_start.sh   # $R, $PY, step, left; the model prepared

cat > "$R/rag-c32.yaml" <<EOF
# The lever table's rag-c32 shape as a user's workload file (scripts/lever_table.py SHAPES).
name: rag-c32
meter_version: 5
concurrency: 32
num_prompts: 256
warmup_requests: 64
prompt_split: search
traffic: $SRC/sandbox/data/traffic/rag.jsonl
EOF

step "agent run --budget ${RUN_M}m --workload rag-c32.yaml"
$PY -m agent.cli run --budget "${RUN_M}m" --workload "$R/rag-c32.yaml" > "$R/run.log" 2>&1 || step "agent run exited $?"
$PY -m agent.cli ledger --json > "$R/ledger.json" 2>&1
$PY -m agent.cli report > "$R/report.txt" 2>&1
$PY -m agent.cli doctor > "$R/doctor.log" 2>&1
$PY -m agent.cli branches > "$R/branches.txt" 2>&1
$PY scripts/trials_per_hour.py runs/ledger.sqlite > "$R/trials_per_hour.log" 2>&1
cp runs/ledger.sqlite "$R/ledger.sqlite"
git -C runs/proposals log --all --format='%h %D %s' > "$R/proposals.log" 2>&1
branch=$(git -C runs/proposals for-each-ref --format='%(refname:short)' refs/heads/agent/ | head -1)
if [ -n "$branch" ] && [ "$(left)" -gt 300 ]; then
  git -C runs/proposals show "$branch:results.json" > "$R/results.json" 2>&1
  step "agent verify $branch ($(left) s left)"
  timeout "$(( $(left) - 30 ))" $PY -m agent.cli verify "$branch" --rounds 2 > "$R/verify.log" 2>&1 \
      || step "verify exited $?"
else
  step "no verify: branch '${branch}', $(left) s left"
fi
step "done"
