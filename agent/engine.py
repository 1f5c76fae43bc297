"""Runs one trial in the sandbox worker: a subprocess in its own process group, with a deadline.

The agent never imports vLLM. It writes the trial spec, starts `python -m sandbox.worker`, watches
its progress file, and reads the result JSON. If the deadline passes or the agent is told to stop,
the worker gets SIGTERM (it tears its server down and still writes a result), then SIGKILL for
the whole group if it does not finish in time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import yaml

from sandbox.contract import (
    ResultError,
    TrialResult,
    allowed_digest,
    failed_result,
    read_result,
    session_members,
)

TEARDOWN_GRACE_S = 90.0
SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD")


def worker_env() -> dict[str, str]:
    """The agent's environment without anything that looks like a credential (the database URL holds one)."""
    return {k: v for k, v in os.environ.items()
            if not any(w in k.upper() for w in SECRET_WORDS) and k != "AGENT_STORAGE"}


class WorkerEngine:
    """evaluate(spec, trial_dir, timeout_s) -> the worker's TrialResult (never raises for a trial).

    slot: the device this engine's trials run on when a host has several workers (agent.devices):
    its variables reach the trial (GPU, cores, ports, caches), and a core binding is to its own cores."""

    def __init__(self, slot=None):
        self._preflight: Preflight | None = None
        self.slot = slot
        self.rules: dict | None = None   # the run's allow-list (allow); None: the spec's own checks only

    def preflight(self, model: str, flags: dict, env: dict) -> dict | None:
        """vLLM's verdict on a point's config without a start (see sandbox.preflight); None: no verdict."""
        if self._preflight is None or self._preflight.model != model:
            self.close()
            self._preflight = Preflight(model, env=self.slot.env if self.slot else {})
        return self._preflight.check(flags, env)

    def close(self) -> None:
        if self._preflight is not None:
            self._preflight.close()
            self._preflight = None

    def defaults(self, model: str, names: list[str], timeout_s: float = 120) -> dict[str, list | None]:
        """The engine's defaults for these knobs, read by the harness from vLLM itself ({} if it cannot:
        then every knob set counts as a change, which only makes lossless claims rarer)."""
        argv = [sys.executable, "-m", "sandbox.defaults", model, *names]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=worker_env(),
                                  cwd=Path(__file__).resolve().parents[1], start_new_session=True)
            return json.loads(done.stdout.strip().splitlines()[-1])
        except (subprocess.SubprocessError, OSError, ValueError, IndexError):
            return {}

    def evaluate(self, spec: dict, trial_dir: Path, timeout_s: float,
                 on_phase: Callable[[str], None] = lambda phase: None) -> TrialResult:
        trial_dir.mkdir(parents=True, exist_ok=True)
        spec = self._on_device(spec)
        spec_path, out, progress = trial_dir / "trial.yaml", trial_dir / "result.json", trial_dir / "progress.json"
        spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
        argv = [sys.executable, "-m", "sandbox.worker", str(spec_path), "--out", str(out),
                "--progress", str(progress), "--log", str(trial_dir / "server.log")]
        if self.rules is not None:   # the run's space, not the spec, says what the trial may set
            text = json.dumps(self._rules_on_device(), sort_keys=True)
            (trial_dir / "allowed.json").write_text(text)
            argv += ["--allowed", str(trial_dir / "allowed.json"), "--allowed-sha", allowed_digest(text)]
        with open(trial_dir / "worker.log", "ab") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**worker_env(), **(self.slot.env if self.slot else {})},
                                    start_new_session=True, cwd=Path(__file__).resolve().parents[1])
        deadline = time.monotonic() + timeout_s
        phase, interrupted = "", None
        try:
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    self._stop(proc, progress)
                    break
                current = _phase(progress)
                if current and current != phase:
                    phase = current
                    on_phase(phase)
                time.sleep(0.5)
        except BaseException as e:   # Ctrl-C, SIGTERM or SIGHUP, or a phase callback's own error (a full
            interrupted = e          # disk under events.jsonl): the worker and its server end with the trial
            self._stop(proc, progress)
        try:
            result = read_result(out)
        except (OSError, ResultError) as e:
            tail = ((trial_dir / "worker.log").read_text(errors="replace")[-2000:]
                    if (trial_dir / "worker.log").exists() else "")
            killed = reap(progress)  # the worker died without its teardown: its server may still run
            why = "wrote no result" if isinstance(e, OSError) else f"wrote no readable result ({e})"
            result = failed_result("worker_error", f"the worker {why} (exit {proc.returncode})"
                                    + (f"; ended its leftover processes {killed}" if killed else ""), tail)
        if interrupted:
            raise interrupted
        if self.slot is not None:
            result.device = self.slot.device
        return result

    def allow(self, rules: dict) -> None:
        """The run's allow-list (agent.space.Space.allowed): every later trial's worker checks its spec
        against it."""
        self.rules = rules

    def _rules_on_device(self) -> dict:
        """The allow-list with this worker's own core span among the thread-binding choices (_on_device)."""
        assert self.rules is not None   # allow() was called: the caller checked
        bind = self.rules["env"].get("VLLM_CPU_OMP_THREADS_BIND")
        if self.slot is None or not self.slot.cores or not bind or "choices" not in bind:
            return self.rules
        from agent.devices import span

        return {**self.rules, "env": {**self.rules["env"], "VLLM_CPU_OMP_THREADS_BIND": {
            "choices": [*bind["choices"], span(self.slot.cores)]}}}

    def _on_device(self, spec: dict) -> dict:
        """A point that binds vLLM's threads to every core means this worker's cores, on a shared host."""
        bind = spec["env"].get("VLLM_CPU_OMP_THREADS_BIND")
        if self.slot is None or not self.slot.cores or bind in (None, "auto"):
            return spec
        from agent.devices import span

        return {**spec, "env": {**spec["env"], "VLLM_CPU_OMP_THREADS_BIND": span(self.slot.cores)}}

    @staticmethod
    def _stop(proc: subprocess.Popen, progress: Path) -> None:
        """SIGTERM the worker (it tears its server down and writes a result); if it does not
        finish in time, SIGKILL its group and the server's, which runs in a session of its own."""
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=TEARDOWN_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            pass
        except ProcessLookupError:
            return
        server_pid = _read(progress).get("server_pid")
        for pgid in (proc.pid, server_pid):
            try:
                if pgid:
                    os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        proc.wait()


def reap(progress: Path) -> list[int]:
    """End every process of a trial whose worker is gone without tearing down (trial_processes)."""
    victims = trial_processes(progress)
    for p in victims:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(victims, timeout=10)
    return sorted(p.pid for p in victims)


def trial_processes(progress: Path) -> list[psutil.Process]:
    """A trial's live processes, from its progress file: the worker (its command line names the file),
    everything carrying the trial's marker, and the server's session. The session counts because
    vLLM starts its engine core and workers with an environment of their own (no marker), and once
    the server is killed they are nobody's children. Pids alone are never trusted: the session is
    taken only for a trial that did not finish (a finished one tore its server down and checked),
    and only members started between the server's recorded start and the file's last write, or all
    of them when the live leader is that very server."""
    state = _read(progress)
    token = state.get("token")
    session, started = state.get("server_pid"), float(state.get("server_started") or 0.0)
    if state.get("phase") == "done" or not session or not started:
        session = None
    try:
        written = progress.stat().st_mtime
    except OSError:
        written = 0.0
    whole = False
    if session:
        try:
            leader = psutil.Process(session)
            whole = leader.status() != psutil.STATUS_ZOMBIE and abs(leader.create_time() - started) < 0.5
        except psutil.Error:
            pass
    found: dict[int, psutil.Process] = {}
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.status() != psutil.STATUS_ZOMBIE and (
                    (token and p.environ().get("AGENT_TRIAL_TOKEN") == token) or str(progress) in p.cmdline()):
                found[p.pid] = p
        except (psutil.Error, OSError):
            continue
    if session and session != os.getsid(0):
        members = session_members(session) if whole else session_members(session, started - 0.5, written + 1)
        found.update({p.pid: p for p in members})
    return list(found.values())


def _read(progress: Path) -> dict:
    try:
        return json.loads(progress.read_text())
    except (OSError, ValueError):
        return {}


def _phase(progress: Path) -> str | None:
    """The phase in flight, with the worker's detail where it gives one (a goodput search's rate point)."""
    state = _read(progress)
    return f"{state['phase']}: {state['detail']}" if state.get("phase") and state.get("detail") else state.get("phase")


class Preflight:
    """vLLM's own config checks on candidate points, in one long-lived harness process.

    check() answers {"ok": bool, "message": ...}, or None when the pre-flight cannot say (it failed
    to start, or did not answer in time: then the point goes on to a real start, which decides).
    The process lives in its own session and is killed as a group by close() or on any timeout.
    """

    def __init__(self, model: str, start_s: float = 180.0, answer_s: float = 60.0, env: dict | None = None):
        self.model, self.start_s, self.answer_s, self.env = model, start_s, answer_s, env or {}
        self.proc: subprocess.Popen | None = None
        self.broken = False
        self.import_s: float | None = None

    def _read(self, timeout_s: float) -> dict | None:
        import selectors

        assert self.proc is not None and self.proc.stdout is not None   # started with a pipe (_start)
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout_s):
                return None
        line = self.proc.stdout.readline()
        return json.loads(line) if line.strip() else None

    def _start(self) -> bool:
        if self.proc is not None and self.proc.poll() is None:
            return True
        if self.broken:
            return False
        self.proc = subprocess.Popen([sys.executable, "-m", "sandbox.preflight", self.model], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                     env={**worker_env(), **self.env},
                                     cwd=Path(__file__).resolve().parents[1], start_new_session=True)
        try:
            ready = self._read(self.start_s)
        except (OSError, ValueError):
            ready = None
        if not ready or not ready.get("ready"):
            self.close()
            self.broken = True   # once: a pre-flight that cannot start is not retried every trial
            return False
        self.import_s = ready.get("import_s")
        return True

    def check(self, flags: dict, env: dict, effective: bool = False) -> dict | None:
        """effective: the answer carries the engine config vLLM built (sandbox.preflight.effective)."""
        if not self._start():
            return None
        assert self.proc is not None and self.proc.stdin is not None   # started with a pipe (_start)
        try:
            self.proc.stdin.write(json.dumps({"flags": flags, "env": env, "effective": effective}) + "\n")
            self.proc.stdin.flush()
            answer = self._read(self.answer_s)
        except (OSError, ValueError):
            answer = None
        if answer is None or answer.get("ok") is None:
            self.close()   # a hung or confused pre-flight is replaced at the next point
            return None
        return answer

    def close(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self.proc = None
