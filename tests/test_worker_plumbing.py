"""The worker's phases, deadlines, classification and teardown, against the fake server seam.

Each misbehaviour of the server must come back as its failure class, with the server gone.
Three of these paths also run against real vLLM in test_engine.py: an ok trial with speed and
quality, an invalid flag value refused with the server's message, and a server killed during the
benchmark (crashed, with its log tail). The others (hung starts, stray children, taken ports,
pruning, the progress file) run against the stand-in server here only.
"""

import json
import math
import sys
import time
from pathlib import Path

import psutil
import pytest

from sandbox import result as results
from sandbox import server as server_mod
from sandbox import spec as specs
from sandbox.worker import run_trial

pytestmark = pytest.mark.process   # starts processes (tests/conftest.py: not in `pytest -m unit`)

FAKE = (str(Path(__file__).with_name("fake_server.py")),)


@pytest.fixture
def fake_mode(monkeypatch):
    monkeypatch.setattr(server_mod, "PASSTHROUGH_ENV", (*server_mod.PASSTHROUGH_ENV, "FAKE_MODE"))

    def set_mode(mode: str) -> None:
        monkeypatch.setenv("FAKE_MODE", mode)

    return set_mode


def trial(tmp_path, flags=None, **deadlines):
    spec = specs.from_dict({"model": "fake", "flags": flags or {}, "workload": "smoke",
                            "deadlines": {"start_s": 30, **deadlines}})
    return run_trial(spec, tmp_path / "server.log", tmp_path / "progress.json", launcher=FAKE)


def assert_clean(result):
    assert result.cleanup["leftover_pids"] == []
    assert result.cleanup["port_free"] is True


def test_ok_trial_measures_speed_and_quality_through_the_server(tmp_path, fake_mode):
    fake_mode("ok")
    result = trial(tmp_path)
    assert result.status == "ok", result.failure
    bench = result.bench
    assert bench.requests == 4 and bench.output_tokens == 4 * 32 and bench.errors == 0
    assert bench.tps == pytest.approx(bench.output_tokens / bench.wall_s, rel=0.01)
    assert bench.ttft_ms["p50"] > 0 and bench.itl_ms["p99"] >= bench.itl_ms["p50"]
    # Every prompt token scores -2.0 in the fake, so the token-weighted PPL is exactly e^2.
    assert result.quality.ppl == pytest.approx(math.exp(2.0), rel=1e-6)
    assert result.quality.ppl_tokens > 100
    greedy = result.quality.greedy
    assert len(greedy) == 32 and all(g["token_ids"] == [7] * 64 for g in greedy)
    # Top-k keyed by token id (return_tokens_as_token_ids), not by text that two ids can share.
    assert greedy[0]["top_logprobs"][0] == {"7": -0.1, "8": -2.5}
    assert result.metrics["kv_cache_usage_max"] == 0.25
    assert set(result.timings) == {"start_s", "warmup_s", "benchmark_s", "quality_s", "teardown_s"}
    assert_clean(result)


@pytest.mark.parametrize("mode, klass", [
    ("exit_early", "crashed"),
    ("errors", "request_errors"),
    ("garbage", "bad_output"),      # 200 OK, but no tokens the meter can count
    ("nan", "bad_output"),
    ("short", "bad_output"),
])
def test_misbehaving_server_is_classified(tmp_path, fake_mode, mode, klass):
    fake_mode(mode)
    result = trial(tmp_path)
    assert result.status == "failed"
    assert result.failure.klass == klass, result.failure
    assert "fake server: mode" in result.failure.log_tail
    assert_clean(result)


def test_hung_start_is_ended_at_its_deadline(tmp_path, fake_mode):
    fake_mode("hang")
    started = time.monotonic()
    result = trial(tmp_path, start_s=3)
    assert result.failure.klass == "start_timeout"
    assert time.monotonic() - started < 30
    assert_clean(result)


def test_invalid_flag_value_comes_back_with_the_servers_message(tmp_path, fake_mode):
    fake_mode("ok")
    result = trial(tmp_path, flags={"max-num-seqs": -1})
    assert result.failure.klass == "invalid_config"
    assert "max_num_seqs must be >= 1" in result.failure.message
    # vLLM's own words, apart from the worker's framing, so the agent can learn from them
    assert "max_num_seqs must be >= 1" in result.failure.cause
    assert not result.failure.cause.startswith("server exited") and result.failed_phase == "start"
    assert_clean(result)


def test_child_that_left_the_process_group_is_killed_too(tmp_path, fake_mode):
    fake_mode("escapee")
    started = time.time()
    result = trial(tmp_path)
    assert result.status == "ok", result.failure
    assert_clean(result)
    leftovers = [p for p in psutil.process_iter(["cmdline", "create_time"])
                 if "time.sleep(3600)" in " ".join(p.info["cmdline"] or []) and p.info["create_time"] >= started - 1]
    assert leftovers == []


def test_progress_file_ends_at_done(tmp_path, fake_mode):
    fake_mode("ok")
    trial(tmp_path)
    assert '"phase": "done"' in (tmp_path / "progress.json").read_text()


def test_worker_cli_refuses_a_bad_spec_with_one_line_and_exit_2(tmp_path):
    import subprocess

    bad = tmp_path / "trial.yaml"
    bad.write_text("model: embedded\nenv:\n  LD_PRELOAD: /tmp/evil.so\n")
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "-m", "sandbox.worker", str(bad), "--out", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "LD_PRELOAD" in proc.stderr and str(bad) in proc.stderr
    assert '"invalid_config"' in out.read_text()



def test_a_port_already_taken_is_refused_before_the_server_starts(tmp_path, fake_mode):
    import socket

    fake_mode("ok")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        spec = specs.from_dict({"model": "fake", "workload": "smoke", "deadlines": {"start_s": 30}})
        result = run_trial(spec, tmp_path / "server.log", launcher=FAKE, port=port)
    assert result.status == "failed" and result.failure.klass == "port_in_use"
    assert str(port) in result.failure.message and result.cleanup["leftover_pids"] == []


def test_a_port_taken_after_the_check_by_another_server_is_never_measured(tmp_path, fake_mode, monkeypatch):
    """Another process answers /health on our port before our server binds it: the worker must notice."""
    import subprocess

    import httpx

    fake_mode("hang")   # our server is alive but never binds: only the other process can answer
    port = server_mod.free_port()
    other = subprocess.Popen([sys.executable, *FAKE, "--port", str(port)], stdout=subprocess.DEVNULL,
                             env={**__import__("os").environ, "FAKE_MODE": "ok"})
    try:
        for _ in range(100):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        monkeypatch.setattr(server_mod, "port_is_free", lambda p: True)   # lose the race on purpose
        spec = specs.from_dict({"model": "fake", "workload": "smoke", "deadlines": {"start_s": 30}})
        result = run_trial(spec, tmp_path / "server.log", launcher=FAKE, port=port)
    finally:
        other.kill()
        other.wait()
    assert result.status == "failed" and result.failure.klass == "port_in_use"
    assert result.bench is None   # nothing was measured against the other process


@pytest.mark.parametrize("mode", ["ok", "engine_core"])
def test_a_worker_killed_mid_benchmark_leaves_nothing_once_reaped(tmp_path, fake_mode, mode):
    """SIGKILL skips the worker's teardown; the agent ends the orphaned server from the progress file,
    and every process of the server's session: vLLM's engine core carries no trial marker (mode
    engine_core stands for it), and with the server killed it is nobody's child."""
    import json
    import os
    import signal
    import subprocess

    from agent.engine import reap

    fake_mode(mode)
    progress = tmp_path / "progress.json"
    code = ("import sys; from pathlib import Path; from sandbox import server, spec; "
            "from sandbox.worker import run_trial; "
            "server.PASSTHROUGH_ENV = (*server.PASSTHROUGH_ENV, 'FAKE_MODE'); "   # as the fake_mode fixture does here
            "s = spec.from_dict({'model': 'fake', 'workload': {'name': 'long', 'meter_version': 1, "
            "'concurrency': 1, 'num_prompts': 250, 'max_tokens': 64, 'ignore_eos': True, 'temperature': 0.0, "
            "'warmup_requests': 0, 'prompt_split': 'search'}}); "
            f"run_trial(s, Path({str(tmp_path / 'server.log')!r}), Path({str(progress)!r}), "
            f"launcher=({FAKE[0]!r},))")
    worker = subprocess.Popen([sys.executable, "-c", code, "--progress", str(progress)], start_new_session=True,
                              cwd=Path(__file__).resolve().parents[1])
    for _ in range(300):
        if progress.exists() and json.loads(progress.read_text()).get("phase") == "benchmark":
            break
        time.sleep(0.1)
    info = json.loads(progress.read_text())
    assert info["phase"] == "benchmark"
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait()
    assert psutil.pid_exists(info["server_pid"])   # the orphan: still serving after its worker died
    killed = reap(progress)
    assert info["server_pid"] in killed
    assert not psutil.pid_exists(info["server_pid"]) or psutil.Process(info["server_pid"]).status() == "zombie"
    assert server_mod.port_is_free(info["port"])
    assert server_mod.session_members(info["server_pid"]) == []


def test_a_hopeless_benchmark_is_pruned_after_a_few_requests_and_skips_quality(tmp_path, fake_mode):
    fake_mode("ok")
    spec = specs.from_dict({"model": "fake", "workload": "smoke", "deadlines": {"start_s": 30},
                            "stop_rules": {"prune_below": 1e6}, "repeats": 2})   # a threshold no server reaches
    result = run_trial(spec, tmp_path / "server.log", tmp_path / "progress.json", launcher=FAKE)
    assert result.status == "pruned" and result.failure is None
    assert result.pruned["after_requests"] == 3 and result.pruned["of"] == 4
    assert result.pruned["upper"] < 1e6
    assert result.bench.requests == 3 and len(result.bench.repeat_figures) == 1 and result.quality is None
    assert "quality_s" not in result.timings
    assert_clean(result)


def test_a_benchmark_that_can_reach_the_threshold_is_never_pruned(tmp_path, fake_mode):
    fake_mode("ok")
    spec = specs.from_dict({"model": "fake", "workload": "smoke", "deadlines": {"start_s": 30},
                            "stop_rules": {"prune_below": 1.0}})
    result = run_trial(spec, tmp_path / "server.log", tmp_path / "progress.json", launcher=FAKE)
    assert result.status == "ok" and result.bench.requests == 4 and result.quality.ppl > 0


def test_quality_is_measured_only_when_the_speed_could_pass(tmp_path, fake_mode):
    fake_mode("ok")
    spec = specs.from_dict({"model": "fake", "workload": "smoke", "deadlines": {"start_s": 30},
                            "stop_rules": {"quality_above": 1e6}})
    result = run_trial(spec, tmp_path / "server.log", tmp_path / "progress.json", launcher=FAKE)
    assert result.status == "ok" and result.quality is None and "is not above" in result.quality_skipped
    assert result.bench.requests == 4 and "quality_s" not in result.timings


def test_an_instance_is_measured_on_every_repeats_draw_pooled(tmp_path, fake_mode):
    """Each repeat sends other requests; the instance's TPS is its tokens over its time on all of them,
    so two configs are compared on the same requests, not on whichever draw was each one's median."""
    fake_mode("ok")
    spec = specs.from_dict({"model": "fake", "workload": "smoke", "repeats": 3, "quality": "none",
                            "deadlines": {"start_s": 30}})
    result = run_trial(spec, tmp_path / "server.log", tmp_path / "progress.json", launcher=FAKE)
    bench = result.bench
    assert result.status == "ok" and len(bench.repeat_figures) == 3 and len(set(bench.draw_hashes)) == 3
    assert bench.requests == 12 and bench.output_tokens == 12 * 32 and bench.finish == {"length": 12}
    assert bench.tps == pytest.approx(bench.output_tokens / bench.wall_s, rel=0.001)


def test_the_server_receives_no_held_out_request_in_search_and_none_twice(tmp_path, fake_mode, monkeypatch):
    """What the server was sent, read from its side: a search trial's warm-ups, repeats and quality
    requests hold no held-out request, and no streamed request reaches the server twice."""
    import json

    from sandbox.traffic import load as load_traffic

    fake_mode("ok")
    record = tmp_path / "received.jsonl"
    monkeypatch.setattr(server_mod, "PASSTHROUGH_ENV", (*server_mod.PASSTHROUGH_ENV, "FAKE_MODE", "FAKE_RECORD"))
    monkeypatch.setenv("FAKE_RECORD", str(record))
    traffic = tmp_path / "mine.jsonl"
    traffic.write_text("".join(json.dumps({"prompt": f"request number {i}", "max_tokens": 4 + i % 3}) + "\n"
                               for i in range(100)))
    workload = {"name": "mine", "meter_version": 3, "concurrency": 2, "num_prompts": 16, "warmup_requests": 2,
                "prompt_split": "search", "traffic": str(traffic)}
    spec = specs.from_dict({"model": "fake", "workload": workload, "repeats": 3, "deadlines": {"start_s": 30}})
    result = run_trial(spec, tmp_path / "server.log", tmp_path / "progress.json", launcher=FAKE)
    assert result.status == "ok", result.failure
    heldout = {r.body["prompt"] for r in load_traffic(traffic).split("heldout")}
    sent = [json.loads(line) for line in record.read_text().splitlines()]
    streamed = [s["body"]["prompt"] for s in sent if s["body"].get("stream")]
    quality = [s["body"]["prompt"] for s in sent
               if not s["body"].get("stream") and isinstance(s["body"].get("prompt"), str)]
    assert len(streamed) == 4 + 3 * 16 == len(set(streamed))   # warm-ups: twice the concurrency
    assert quality and not (set(streamed) | set(quality)) & heldout


def _shape(value, path=()):
    """(key path, type) of every leaf of nested dicts, lists taken as leaves; numbers as one type."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _shape(v, (*path, k))
    else:
        yield path, ("number" if isinstance(value, (int, float)) and not isinstance(value, bool)
                     else type(value).__name__)


def test_the_fake_engines_results_have_the_real_workers_shape(tmp_path, fake_mode):
    """The loop and gate tests run on tests/fake_engine.py's results: every field it writes must be
    one the real worker writes, with the same type (the worker here runs against the stand-in server)."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from fake_engine import FakeEngine

    fake_mode("ok")
    spec = {"model": "fake", "flags": {}, "env": {}, "workload": "smoke", "heldout_bench": True,
            "deadlines": {"start_s": 30}}
    real = run_trial(specs.from_dict(spec), tmp_path / "server.log", tmp_path / "progress.json", launcher=FAKE)
    assert real.status == "ok", real.failure
    real_shape = dict(_shape(results.to_json(real)))
    fake = FakeEngine(delay_s=0).evaluate(spec, tmp_path / "fake", 60)
    assert isinstance(fake, results.TrialResult)
    for path, kind in _shape(results.to_json(fake)):
        if kind == "NoneType" or path[:1] in (("engine",), ("hardware",)):   # the runner adds these two
            continue
        assert path in real_shape, f"the fake writes {'.'.join(path)}, which the worker never does"
        assert real_shape[path] in (kind, "NoneType"), f"{'.'.join(path)}: fake {kind}, worker {real_shape[path]}"
    # And the other way: what the worker writes at the top of a result and of its figures, the fake
    # writes too, so no loop or gate test runs on a result missing a field the agent reads.
    fake_shape = dict(_shape(results.to_json(fake)))
    fake_tops = {p[:2] if p[0] in ("bench", "quality") else p[:1] for p in fake_shape}
    missing = sorted(".".join(top) for top in {p[:2] if p[0] in ("bench", "quality") else p[:1]
                                               for p, kind in real_shape.items() if kind != "NoneType"}
                     - fake_tops - {("engine",), ("hardware",)})
    assert missing == [], f"the worker writes {missing}, which the fake never does"


def test_a_result_file_reads_back_as_the_result_written_and_a_foreign_one_is_refused_by_name(tmp_path, fake_mode):
    """sandbox/result.py's pair: what the worker writes is what the agent reads, field for field; a file
    of another version or with a field this agent does not know is refused, not half read."""
    fake_mode("ok")
    spec = specs.from_dict({"model": "fake", "flags": {}, "env": {}, "workload": "smoke", "heldout_bench": True,
                            "deadlines": {"start_s": 30}})
    written = run_trial(spec, tmp_path / "server.log", tmp_path / "progress.json", launcher=FAKE)
    results.write(tmp_path / "result.json", written)
    read = results.read(tmp_path / "result.json")
    assert read == written and read.bench.value == written.bench.figure and read.bench_heldout.hash
    assert json.loads((tmp_path / "result.json").read_text())["bench"]["tps"] == written.bench.tps
    failed = results.failed("oom", "out of memory", "OOM killed")
    assert results.from_json(results.to_json(failed)).failure == failed.failure
    assert results.to_json(failed)["failure"]["class"] == "oom"
    data = results.to_json(written)
    with pytest.raises(results.ResultError, match="result_version 2 is not 1"):
        results.from_json({**data, "result_version": 2})
    with pytest.raises(results.ResultError, match=r"unknown field\(s\) \['speed'\] for Figures"):
        results.from_json({**data, "bench": {**data["bench"], "speed": 1.0}})
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(results.ResultError, match="bad.json: not JSON"):
        results.read(tmp_path / "bad.json")


def test_a_trials_processes_are_its_servers_session_only_while_the_record_says_it_is_that_server(tmp_path):
    """agent.engine.trial_processes: a session is taken for a trial that did not finish, whole while
    its live leader is the recorded server, else only members started in the trial's window."""
    import os
    import signal
    import subprocess

    from agent.engine import trial_processes

    child = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
             "time.sleep(60)")
    leader = subprocess.Popen([sys.executable, "-c", child], start_new_session=True, env={"PATH": os.environ["PATH"]})
    try:
        for _ in range(100):
            members = server_mod.session_members(leader.pid)
            if len(members) == 2:
                break
            time.sleep(0.1)
        assert len(members) == 2
        started = psutil.Process(leader.pid).create_time()
        progress = tmp_path / "progress.json"

        def found(phase, recorded):
            progress.write_text(json.dumps({"phase": phase, "server_pid": leader.pid, "server_started": recorded,
                                            "token": "not-set-anywhere"}))
            return sorted(p.pid for p in trial_processes(progress))

        every = sorted(p.pid for p in members)
        assert found("benchmark", started) == every          # the recorded server leads it: the whole session
        assert found("done", started) == []                  # a finished trial checked its own teardown
        assert found("benchmark", started + 3600) == []      # another process under a reused pid: not ours
        leader.kill()
        leader.wait()
        (orphan,) = [p.pid for p in server_mod.session_members(leader.pid)]
        assert found("benchmark", started) == [orphan]       # the leader gone: its member, started in the window
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()

