#!/usr/bin/env bash
# One block of GPU time for the agent's own run (issue 44): `agent run` for $RUN_M minutes on
# $WORKLOAD (default: the GPU default, serving.jsonl at 32 in flight), then its ledger, report,
# doctor and trials per hour, and `agent verify` of a committed branch when time is left. Each
# step's output is under $R. The run works on a copy of the tree in /tmp/src: the device tool
# copies the working tree again on every watching call, and a trial's worker imports the code afresh.
# Check a workload here first (seconds, no GPU): `agent run` refuses one whose traffic is too small
# before the model is prepared. The lever table's rag-c32 (256 requests a phase at 32 in flight)
# is such a one with the shipped rag.jsonl: 600 requests, 112 held out, where 2 repeats need 512
# held-out requests (2026-12-06 22:09, the first block of this script, exited there).
#     .venv/bin/python -c "from sandbox.workload import load_workload; load_workload('W').check(2)"
# Run from the project root on the GPU host once its packages are installed (a development tool:
# ../shared/tools/gpu/on-device.sh, or `agent bundle` and `VENV=/opt/torch/.venv scripts/setup.sh --offline`).
#     R=/tmp/res RUN_M=25 setsid nohup bash bench/gpu_agent_block.sh > /tmp/res/block.log 2>&1 &
set -u
BLOCK_S=${BLOCK_S:-1620}
RUN_M=${RUN_M:-25}
SRC=${SRC:-/tmp/src}
rm -rf "$SRC" && mkdir -p "$SRC"
tar --exclude=./.gpu --exclude=./.venv --exclude=./runs --exclude=./.git -cf - . | tar -C "$SRC" -xf -
cd "$SRC" || exit 1
source bench/gpu_block_start.sh   # $R, $PY, step, left; the model prepared

WORKLOAD=${WORKLOAD:-default}

step "agent run --budget ${RUN_M}m --workload $WORKLOAD"
$PY -m agent.cli run --budget "${RUN_M}m" --workload "$WORKLOAD" > "$R/run.log" 2>&1 || step "agent run exited $?"
$PY -m agent.cli ledger --json > "$R/ledger.json" 2>&1
$PY -m agent.cli report > "$R/report.txt" 2>&1
$PY -m agent.cli doctor > "$R/doctor.log" 2>&1
$PY -m agent.cli branches > "$R/branches.txt" 2>&1
$PY bench/trials_per_hour.py runs/ledger.sqlite > "$R/trials_per_hour.log" 2>&1
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
