# Sourced by the GPU block scripts (bench/gpu_*_block.sh), after they set BLOCK_S: the results folder
# $R, the Python $PY, step (a timestamped line in $R/steps.log) and left (seconds of $BLOCK_S left),
# then the embedded model prepared and the GPU named in $R/gpu.csv.
R=${R:-/tmp/res}
PY=${PY:-python3}
mkdir -p "$R/raw"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1
began=$(date +%s)
step() { echo "=== $(date -u +%T) (+$(( $(date +%s) - began )) s) $*" | tee -a "$R/steps.log"; }
left() { echo $(( BLOCK_S - ($(date +%s) - began) )); }

step "model prepare"
$PY -m agent.cli model prepare > "$R/prepare.log" 2>&1 || { step "prepare failed"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$R/gpu.csv" 2>&1
