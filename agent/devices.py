"""How one host's devices are split between its workers: a GPU each, or a contiguous set of cores each.

Each slot also gets its own range of ports and its own compile caches, so two trials running at
once never meet: a port one server took, a cache another is writing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

PORTS_FROM, PORTS_PER_SLOT = 20000, 200


class DeviceError(ValueError):
    pass


@dataclass(frozen=True)
class Slot:
    index: int
    device: str                    # "GPU 1", "cores 2-3", or "host" (one worker with everything)
    env: dict[str, str] = field(default_factory=dict)
    cores: tuple[int, ...] = ()    # the CPU cores this slot's processes are bound to (CPU hosts)


def span(cores: tuple[int, ...]) -> str:
    """Cores as vLLM's VLLM_CPU_OMP_THREADS_BIND writes them: 2-3, or 0,2,5 when not contiguous."""
    if cores == tuple(range(cores[0], cores[-1] + 1)):
        return f"{cores[0]}-{cores[-1]}"
    return ",".join(map(str, cores))


def slots(workers: int, gpus: int, home: Path, cores: tuple[int, ...] | None = None) -> list[Slot]:
    """The slots of `workers` workers on this host (gpus: how many GPUs it shows this process)."""
    if workers < 1:
        raise DeviceError(f"--workers: {workers} is not a positive number")
    cores = tuple(sorted(cores if cores is not None else os.sched_getaffinity(0)))
    if workers == 1:
        return [Slot(0, "host", {})]
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    out = []
    if gpus:
        if workers > gpus:
            raise DeviceError(f"--workers: {workers} workers need a GPU each; this host shows {gpus}")
        ids = visible[:gpus] if visible else [str(i) for i in range(gpus)]
        for i in range(workers):
            out.append(Slot(i, f"GPU {ids[i]}", {"CUDA_VISIBLE_DEVICES": ids[i], **_private(home, i)}))
        return out
    if workers > len(cores):
        raise DeviceError(f"--workers: {workers} workers need a core each; this process may use {len(cores)}")
    size, extra = divmod(len(cores), workers)
    start = 0
    for i in range(workers):
        mine = cores[start:start + size + (i < extra)]
        start += len(mine)
        out.append(Slot(i, f"cores {span(mine)}", {"AGENT_CPUS": span(mine), **_private(home, i)}, mine))
    return out


def _private(home: Path, i: int) -> dict[str, str]:
    cache = home / "cache" / f"slot-{i}"
    low = PORTS_FROM + i * PORTS_PER_SLOT
    return {"VLLM_CACHE_ROOT": str(cache / "vllm"), "TRITON_CACHE_DIR": str(cache / "triton"),
            "AGENT_PORTS": f"{low}-{low + PORTS_PER_SLOT - 1}"}

