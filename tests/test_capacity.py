"""What a config is worth (issue 58): a ladder of loads measured by the real worker on the stand-in
server with a known curve, the knee, the SLO limit, cost and servers, and ladders in the layout of
`vllm bench sweep serve`, both ways (vLLM's own plotting code loads what is exported)."""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fake_engine import FakeEngine

from agent import branch_worth, budget, capacity, gitops, morning, recovery, sweep
from agent import space as spaces
from agent.capacity import Curve, Repeat, Rung
from agent.capacity_run import Ask, command
from agent.context import RunContext, Seams, Settings
from agent.ledger import Ledger, Run, Trial
from agent.loop import run_search
from sandbox import server as server_mod
from sandbox import spec as specs
from sandbox.ladders import Ladder
from sandbox.worker import run_trial

pytestmark = pytest.mark.process   # starts processes (tests/conftest.py: not in `pytest -m unit`)

FAKE = (str(Path(__file__).with_name("fake_server.py")),)


def rep(tps: float, e2e_p99: float, ttft_p99: float = 50.0, itl_p99: float = 10.0, rate: float = 1.0,
        input_tokens: int = 1000, duration: float = 10.0) -> Repeat:
    return Repeat(output_tps=tps, total_tps=tps + input_tokens / duration, request_rate=rate, input_tokens=input_tokens,
                  output_tokens=round(tps * duration), requests=round(rate * duration), duration_s=duration,
                  ttft_ms={"p50": ttft_p99 / 2, "p90": ttft_p99 * 0.9, "p99": ttft_p99, "n": 10},
                  itl_ms={"p50": itl_p99 / 2, "p99": itl_p99, "n": 100},
                  latency_ms={"p50": e2e_p99 / 2, "p90": e2e_p99 * 0.9, "p99": e2e_p99, "n": 10})


def curve(*points: tuple[float, float, float], subject: str = "defaults") -> Curve:
    """(streams, output tok/s, p99 e2e ms) rung by rung, one repeat each."""
    return Curve(subject, "concurrency", tuple(Rung(c, (rep(tps, e2e, rate=tps / 100),)) for c, tps, e2e in points))


# ---- the arithmetic, on curves whose answers are known ------------------------------------------

def test_the_knee_is_below_the_first_rung_where_latency_rises_faster_than_throughput():
    # 1 -> 2: tokens/s +90%, latency +10%; 2 -> 4: +20% against +60%: the knee is at 2 streams.
    bent = curve((1, 100, 1000), (2, 190, 1100), (4, 228, 1760), (8, 230, 3500))
    assert capacity.knee(bent).load == 2
    # Throughput rising as fast as latency, or faster, all the way: no knee within the ladder, said so.
    straight = curve((1, 100, 1000), (2, 200, 1000), (4, 400, 1100))
    assert capacity.knee(straight) is None
    judged = capacity.worth(straight, {})
    assert (judged.point_is, judged.point.load) == ("top of the ladder", 4)


def test_the_slo_limit_is_the_highest_load_before_the_first_break_and_decides_the_operating_point():
    bent = curve((1, 100, 1000), (2, 190, 1100), (4, 228, 1760), (8, 230, 3500))
    assert capacity.slo_limit(bent, {"e2e_p99_ms": 2000}).load == 4
    assert capacity.slo_limit(bent, {"e2e_p99_ms": 900}) is None          # the lowest load breaks it
    assert capacity.slo_limit(bent, {}) is None                            # no bound given
    assert capacity.slo_limit(bent, {"ttft_p99_ms": 49}) is None           # TTFT p99 is 50 at every rung
    judged = capacity.worth(bent, {"e2e_p99_ms": 2000})
    assert (judged.point_is, judged.point.load, judged.knee.load) == ("SLO limit", 4, 2)
    assert capacity.worth(bent, {"e2e_p99_ms": 900}).point is None


def test_cost_per_million_tokens_input_and_output_apart_and_servers_for_a_target_rate():
    # At the knee (2 streams): 190 output tok/s, 100 input tok/s (1000 tokens over 10 s), 1.9 req/s.
    bent = curve((1, 100, 1000), (2, 190, 1100), (4, 228, 1760))
    judged = capacity.worth(bent, {}, price_per_hour=3.8, target_rate=10)
    assert judged.point.load == 2
    assert judged.tokens_per_device_hour == pytest.approx(190 * 3600)
    assert judged.cost_per_m_output == pytest.approx(3.8 / (190 * 3600 / 1e6))     # $5.556
    assert judged.cost_per_m_input == pytest.approx(3.8 / (100 * 3600 / 1e6))      # $10.556
    assert judged.servers == math.ceil(10 / 1.9) == 6
    two_gpus = capacity.worth(Curve("tp2", "concurrency", bent.rungs, devices=2), {})
    assert two_gpus.tokens_per_device_hour == pytest.approx(190 * 3600 / 2)
    assert capacity.worth(bent, {}).cost_per_m_output is None   # no price given: no cost


def test_a_rung_where_requests_failed_is_no_operating_point():
    failing = Rung(8, (Repeat(**{**rep(300, 1500).__dict__, "errors": 3}),))
    broken = Curve("defaults", "concurrency", curve((1, 100, 1000), (2, 190, 1000), (4, 370, 1000)).rungs + (failing,))
    judged = capacity.worth(broken, {"e2e_p99_ms": 5000})
    assert (judged.point_is, judged.point.load) == ("SLO limit", 4)
    assert capacity.worth(broken, {}).point.load == 4 and capacity.knee(broken) is None


def test_repeats_that_disagree_beyond_the_noise_are_said_to():
    rung = Rung(2, (rep(100, 1000), rep(130, 1000)))
    assert rung.disagrees(noise_sd=0.05) and not rung.disagrees(noise_sd=0.2)
    assert not Rung(2, (rep(100, 1000),)).disagrees(noise_sd=0.0001)   # one repeat cannot say


@pytest.mark.parametrize("raw, needle", [
    ({"kind": "streams", "loads": [1]}, "kind: 'streams' is not one of"),
    ({"kind": "concurrency", "loads": [4, 2]}, "is not 1 to 12 rising loads"),
    ({"kind": "concurrency", "loads": [1.5]}, "whole streams"),
    ({"kind": "rate", "loads": [0]}, "rising loads above 0"),
    ({"kind": "rate", "loads": [1], "slo": {"ttft_p99_ms": -1}}, "slo:"),
])
def test_a_ladder_out_of_bounds_is_refused_naming_the_value(raw, needle):
    with pytest.raises(ValueError, match=needle):
        Ladder.from_dict(raw, "spec.ladder")
    with pytest.raises(specs.SpecError, match="spec.ladder"):
        specs.from_dict({"model": "m", "ladder": raw})


# ---- the real worker's ladder on the stand-in ----------------------------------------------------

def ladder_trial(tmp_path: Path, monkeypatch, slots: int, loads: list, slo: dict | None = None, kind="concurrency"):
    """One real worker on the stand-in: 10 tokens of 10 ms a request, `slots` decoding at once, so at
    C streams it serves min(C, slots) * 100 tokens/s and each request waits C / slots times as long.
    Every request the stand-in receives is recorded in tmp_path / received.jsonl."""
    monkeypatch.setattr(server_mod, "PASSTHROUGH_ENV", (*server_mod.PASSTHROUGH_ENV, "FAKE_SLOTS", "FAKE_TOKEN_S",
                                                        "FAKE_RECORD"))
    monkeypatch.setenv("FAKE_RECORD", str(tmp_path / "received.jsonl"))
    monkeypatch.setenv("FAKE_SLOTS", str(slots))
    monkeypatch.setenv("FAKE_TOKEN_S", "0.01")
    traffic = tmp_path / "t.jsonl"
    traffic.write_text("".join(json.dumps({"prompt": f"request {i}", "max_tokens": 10}) + "\n" for i in range(600)))
    workload = {"name": "ladder", "meter_version": 5, "concurrency": 1, "num_prompts": 8, "warmup_requests": 1,
                "prompt_split": "search", "traffic": str(traffic)}
    spec = specs.from_dict({"model": "fake", "workload": workload, "repeats": 2, "deadlines": {"start_s": 30},
                            "quality": "none", "ladder": {"kind": kind, "loads": loads, "slo": slo or {}}})
    out = tmp_path / f"s{slots}"
    out.mkdir(exist_ok=True)
    return run_trial(spec, out / "server.log", out / "progress.json", launcher=FAKE)


def test_the_worker_climbs_until_throughput_stops_rising_and_the_knee_is_where_the_slots_fill(tmp_path, monkeypatch):
    result = ladder_trial(tmp_path, monkeypatch, slots=2, loads=[1, 2, 4])
    assert result.status == "ok", result.failure
    ladder = result.ladder
    assert [r["load"] for r in ladder["rungs"]] == [1, 2, 4]   # 4 streams gain nothing on 2 slots: it says so
    assert "output tokens/s stopped rising at concurrency 4" in ladder["stopped"]
    rungs = [Rung(r["load"], tuple(capacity.repeat_from_bench(b) for b in r["repeats"])) for r in ladder["rungs"]]
    tps = [r.median.output_tps for r in rungs]
    assert 70 < tps[0] < 105 and 1.7 < tps[1] / tps[0] < 2.1 and 0.85 < tps[2] / tps[1] < 1.05
    # Every rung's phase the same size, 8 x the top load: a like mix of requests at each.
    assert all(len(r.repeats) == 2 and r.median.requests == 32 for r in rungs)
    assert all(r.median.input_tokens == 5 * r.median.requests for r in rungs)   # the stand-in's usage record
    assert capacity.knee(Curve("defaults", "concurrency", tuple(rungs))).load == 2
    # No request reached the server twice, warm-ups included: each rung drew fresh ones from one cursor.
    sent = [json.loads(line)["body"]["prompt"] for line in (tmp_path / "received.jsonl").read_text().splitlines()
            if json.loads(line)["path"] == "/v1/completions"]
    measured = sum(b["requests"] for r in ladder["rungs"] for b in r["repeats"])
    assert len(sent) > measured == 6 * 32 and len(set(sent)) == len(sent)


def test_the_climb_stops_where_a_p99_breaks_the_slo_and_names_it(tmp_path, monkeypatch):
    # One slot: at 4 streams a request waits for 3 others (about 300 ms end to end at p99 and more).
    result = ladder_trial(tmp_path, monkeypatch, slots=1, loads=[1, 4, 8], slo={"e2e_p99_ms": 250})
    assert result.status == "ok", result.failure
    assert [r["load"] for r in result.ladder["rungs"]] == [1, 4]
    assert "p99 end-to-end" in result.ladder["stopped"] and "broke the SLO's 250 ms at concurrency 4" \
        in result.ladder["stopped"]


def test_open_loop_rates_climb_too(tmp_path, monkeypatch):
    result = ladder_trial(tmp_path, monkeypatch, slots=4, loads=[2.0, 8.0], kind="rate")
    assert result.status == "ok", result.failure
    first, second = (r["repeats"][0] for r in result.ladder["rungs"])
    assert first["requests"] >= 20 and second["requests"] >= 80    # 10 s of arrivals at each rate
    assert 1.5 < second["phase_tps"] / first["phase_tps"] < 5      # the offered load, served


# ---- vLLM's sweep layout, both ways --------------------------------------------------------------

def two_curves() -> list[Curve]:
    first = curve((1, 100, 1000), (2, 190, 1100), (4, 228, 1760))
    second = Curve("agent/r/3", "concurrency", tuple(Rung(r.load, (rep(r.median.output_tps * 1.3, 900),
                                                                   rep(r.median.output_tps * 1.25, 950)))
                                                     for r in first.rungs), "output tokens/s stopped rising")
    return [first, second]


def test_an_export_reads_back_to_equal_figures_and_vllms_sweep_plotting_loads_it(tmp_path):
    curves = two_curves()
    written = sweep.export(curves, tmp_path / "sweep", model="gemma-3-270m")
    assert len(written) == 6 and (tmp_path / "sweep" / "summary.csv").exists()
    assert sorted(p.name for p in written[0].parent.iterdir()) == ["run=0.json", "summary.json"]
    assert sweep.read(tmp_path / "sweep") == curves
    # vLLM's own loader and record preparation (vllm/benchmarks/sweep/plot_pareto.py), where it imports.
    pareto = pytest.importorskip("vllm.benchmarks.sweep.plot_pareto")
    from vllm.benchmarks.sweep.plot import _json_load_bytes

    records = [r for path in sorted((tmp_path / "sweep").rglob("summary.json")) for r in _json_load_bytes(path)]
    prepared, skipped = pareto._prepare_records(records, user_count_var="max_concurrency", gpu_count_var=None)
    assert skipped == 0 and len(prepared) == 9
    four = next(p for p in prepared if p["config"] == "defaults" and p["max_concurrency"] == 4)
    assert four["tokens_per_user"] == pytest.approx(228 / 4) and four["tokens_per_gpu"] == pytest.approx(228)


def test_a_sweep_run_by_hand_is_read_with_vllms_own_fields(tmp_path):
    """What `vllm bench sweep serve` writes (no agent_* fields): the load from max_concurrency, the
    config from the folder's SERVE- part, percentiles as vLLM names them."""
    folder = tmp_path / "exp" / "SERVE--tp1-BENCH--max_concurrency=8"   # "-".join(("SERVE-", s, "BENCH-", b))
    folder.mkdir(parents=True)
    run = {"max_concurrency": 8, "request_rate": "inf", "duration": 20.0, "completed": 64, "failed": 0,
           "total_input_tokens": 6400, "total_output_tokens": 8000, "request_throughput": 3.2,
           "output_throughput": 400.0, "total_token_throughput": 720.0, "median_ttft_ms": 40.0, "p99_ttft_ms": 90.0,
           "mean_ttft_ms": 45.0, "median_itl_ms": 12.0, "p99_itl_ms": 30.0, "median_e2el_ms": 2400.0,
           "p99_e2el_ms": 3100.0, "run_number": 0}
    (folder / "summary.json").write_text(json.dumps([run]))
    (got,) = sweep.read(tmp_path / "exp")
    assert (got.subject, got.kind, [r.load for r in got.rungs]) == ("tp1", "concurrency", [8])
    m = got.rungs[0].median
    assert (m.output_tps, m.input_tps, m.ttft_ms["p99"], m.latency_ms["p50"], m.latency_ms["n"]) == (
        400.0, 320.0, 90.0, 2400.0, 64)
    # No serve parameters: the folder is BENCH--... alone, and the run's label (else "sweep") names the config.
    bare = tmp_path / "bare" / "BENCH--max_concurrency=8"
    bare.mkdir(parents=True)
    (bare / "summary.json").write_text(json.dumps([{**run, "label": "by hand"}]))
    assert [c.subject for c in sweep.read(tmp_path / "bare")] == ["by hand"]
    # A rate sweep capped at a concurrency is open loop; vLLM's parallel sizes count the devices.
    rated = [{**run, "request_rate": r, "max_concurrency": 64, "tensor_parallel_size": 2, "run_number": 0}
             for r in (1.0, 2.0)]
    for r, data in zip((1, 2), rated, strict=True):
        (tmp_path / "rated" / f"SERVE--tp2-BENCH--request_rate={r}").mkdir(parents=True)
        (tmp_path / "rated" / f"SERVE--tp2-BENCH--request_rate={r}" / "summary.json").write_text(json.dumps([data]))
    (curve,) = sweep.read(tmp_path / "rated")
    assert (curve.kind, [r.load for r in curve.rungs], curve.devices) == ("rate", [1.0, 2.0], 2)
    (folder / "summary.json").write_text(json.dumps([{**run, "max_concurrency": None}]))
    with pytest.raises(sweep.SweepError, match=r"summary.json\[0\]: neither max_concurrency"):
        sweep.read(tmp_path / "exp")
    with pytest.raises(sweep.SweepError, match="no summary.json under it"):
        sweep.read(tmp_path / "empty")


# ---- `agent capacity`'s command: measured, stored, tabulated, exported and imported -----------------

class StandIn:
    """The engine seam (agent.engine.WorkerEngine: allow, evaluate, close) running the real worker in
    this process on the stand-in server; the real engine's ladder is tested in test_engine.py."""

    def allow(self, rules: dict) -> None:
        self.rules = rules

    def evaluate(self, spec: dict, trial_dir: Path, timeout_s: float):
        trial_dir.mkdir(parents=True, exist_ok=True)
        return run_trial(specs.from_dict(spec), trial_dir / "server.log", trial_dir / "progress.json", launcher=FAKE)

    def close(self) -> None:
        pass


def test_agent_capacity_measures_stores_and_prints_the_defaults_side_by_side(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENT_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(server_mod, "PASSTHROUGH_ENV", (*server_mod.PASSTHROUGH_ENV, "FAKE_SLOTS", "FAKE_TOKEN_S"))
    monkeypatch.setenv("FAKE_SLOTS", "2")
    monkeypatch.setenv("FAKE_TOKEN_S", "0.01")
    traffic = tmp_path / "t.jsonl"
    traffic.write_text("".join(json.dumps({"prompt": f"request {i}", "max_tokens": 10}) + "\n" for i in range(600)))
    workload = {"name": "ladder", "meter_version": 5, "concurrency": 1, "num_prompts": 8, "warmup_requests": 1,
                "prompt_split": "search", "traffic": str(traffic)}
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.add(Run(id="r", deadline_at="2099-01-01T00:00:00+00:00", model="fake", space_path="vllm-cpu",
                   space_hash="h", workload="ladder", repo=str(tmp_path), noise=0.03,
                   settings={"model": "fake", "workload": workload, "repeats": 1, "gate": {}}))
    ledger.add(Trial(run_id="r", number=0, source="baseline", status="ok", params={}, flags={}, env={}))
    said: list[str] = []
    lines = command(ledger, None, Ask(loads=(1, 2, 4)), [], False, tmp_path / "out", None, said.append,
                    engine=StandIn())
    assert any("defaults: fresh server 1/1" in s for s in said)
    (stored,) = ledger.capacities("r")
    assert (stored.subject, stored.source, stored.kind, stored.knee, stored.point_is) == (
        "defaults", "measured", "concurrency", 2, "knee")
    assert stored.output_tps == pytest.approx(capacity.from_dict(stored.curve).rungs[1].median.output_tps)
    assert any(line.startswith("| defaults | 2 stream(s) |") for line in lines)
    assert any("defaults: knee 2 stream(s); SLO limit no SLO given" in line for line in lines)
    assert any("written as a `vllm bench sweep serve` folder" in line for line in lines)
    # The folder read back joins the run's measured curves.
    again = command(ledger, "r", Ask(), [], False, None, tmp_path / "out", said.append, engine=StandIn())
    assert [c.source for c in ledger.capacities("r")] == ["measured", f"imported from {tmp_path / 'out'}"]
    assert sum(line.startswith("| defaults | 2 stream(s)") for line in again) == 2


def test_the_docs_table_and_plot_come_from_an_exported_folder(tmp_path):
    """bench/capacity_table.py: docs/results.md's capacity table and SVG from committed raw files."""
    import subprocess
    import sys

    sweep.export(two_curves(), tmp_path / "sweep", model="m")
    done = subprocess.run([sys.executable, "bench/capacity_table.py", str(tmp_path / "sweep"), "--svg",
                           str(tmp_path / "c.svg"), "--price-per-hour", "1"], capture_output=True, text=True,
                          cwd=Path(__file__).parents[1], timeout=120)
    assert done.returncode == 0, done.stderr
    assert "| agent/r/3 | 2 stream(s) | 247.00 (237.5-247.0) | " in done.stdout   # the upper of two repeats
    assert "agent/r/3: knee none within the ladder" in done.stdout   # its latency never rose
    assert "defaults: knee 2 stream(s); SLO limit no SLO given; at its knee (2 stream(s)) 190.00 output tok/s" \
        in done.stdout and "$1.46 per million output tokens" in done.stdout
    picture = (tmp_path / "c.svg").read_text()
    assert picture.count("<polyline") == 2 and picture.count('stroke="crimson"') == 1   # the defaults' knee


# ---- `agent run --capacity`: the night's first branch and the defaults, written into the branch ------

class TrialsFakeLaddersReal(FakeEngine):
    """The night's trials from the deterministic engine; the ladders --capacity asks for from the real
    worker on the stand-in (StandIn)."""

    def __init__(self):
        super().__init__()
        self.ladders: list[dict] = []

    def evaluate(self, spec, trial_dir, timeout_s, on_phase=lambda phase: None):
        if spec.get("ladder"):
            self.ladders.append(spec)
            return StandIn().evaluate(spec, trial_dir, timeout_s)
        return super().evaluate(spec, trial_dir, timeout_s, on_phase)


def capacity_night(tmp_path: Path, monkeypatch, engine: FakeEngine, ledger: Ledger | None = None):
    monkeypatch.setenv("AGENT_HOME", str(tmp_path))
    monkeypatch.setattr(server_mod, "PASSTHROUGH_ENV", (*server_mod.PASSTHROUGH_ENV, "FAKE_SLOTS", "FAKE_TOKEN_S"))
    monkeypatch.setenv("FAKE_SLOTS", "2")
    monkeypatch.setenv("FAKE_TOKEN_S", "0.002")
    ledger = ledger or Ledger(tmp_path / "ledger.sqlite")
    space = spaces.load("vllm-cpu")
    run = ledger.run("rc") or ledger.add(Run(
        id="rc", deadline_at=(datetime.now(UTC) + timedelta(hours=1)).isoformat(), model="m",
        space_path=space.path, space_hash=space.hash, workload="smoke", repo=str(tmp_path / "p"),
        settings={"home": str(tmp_path), "capacity": "1,2", "price_per_hour": 1.2, "target_rate": 5.0}))
    repo = gitops.open_repo(tmp_path / "p", create=True)
    settings = Settings(model="m", workload="smoke", max_trials=3, facts={"cpus": 2, "concurrency": 1})
    said: list[tuple[str, dict]] = []
    finished = run_search(RunContext(run, settings, space),
                          Seams(ledger, engine, repo, lambda e, **i: said.append((e, i))),
                          f"sqlite:///{tmp_path / 'o.sqlite'}")
    return ledger, repo, finished, said


def test_run_capacity_measures_the_first_branch_and_the_defaults_once_and_commits_it_into_the_branch(
        tmp_path, monkeypatch):
    engine = TrialsFakeLaddersReal()
    ledger, repo, run, said = capacity_night(tmp_path, monkeypatch, engine)
    branched = sorted((t for t in ledger.trials("rc") if t.branch), key=lambda t: t.number)
    assert branched, "the fake night commits a branch"
    first = branched[0]
    # Two ladders, each on its own server: the defaults' flags, then the branch's; never again.
    assert [(s["flags"], s["env"]) for s in engine.ladders] == [
        (next(t for t in ledger.trials("rc") if t.source == "baseline").flags,
         next(t for t in ledger.trials("rc") if t.source == "baseline").env), (first.flags, first.env)]
    assert all(s["ladder"]["loads"] == [1, 2] and s["quality"] == "none" for s in engine.ladders)
    rows = ledger.capacities("rc")
    assert [(c.subject, c.trial_number, c.source) for c in rows] == [
        ("defaults", None, branch_worth.SOURCE), (first.branch, first.number, branch_worth.SOURCE)]
    # The branch moved on by one commit, from the accepted config's, and the ledger names it.
    head = repo.heads[first.branch].commit
    assert head.hexsha == first.commit and len(head.parents) == 1
    assert f"{branch_worth.TRAILER}: concurrency 1,2" in head.message
    assert f"Agent-Trial: {first.number}" in head.parents[0].message
    changed = sorted(d.a_path for d in head.parents[0].diff(head))
    assert changed == ["serving/README.md", "serving/results.json"]
    results = morning.read(repo, first.branch)
    worth = results.capacity
    assert worth is not None and worth.kind == "concurrency" and worth.loads == [1, 2]
    for stored, curve in zip(rows, (worth.defaults, worth.config), strict=True):
        assert [r.load for r in curve.rungs] == [r["load"] for r in stored.curve["rungs"]]
        assert curve.tokens_per_device_hour == pytest.approx(stored.tokens_per_device_hour, rel=1e-3)
        assert curve.cost_per_m_output == pytest.approx(1.2 / (curve.tokens_per_device_hour / 1e6), rel=1e-3)
        assert curve.servers == stored.servers and curve.servers is not None
    assert worth.again == f"agent capacity {first.branch} --run rc --concurrency 1,2 --price-per-hour 1.2 " \
                          f"--target-rate 5"
    readme = (head.tree / "serving" / "README.md").data_stream.read().decode()
    assert "What it is worth under load" in readme and "per million output tokens at $1.2 an hour" in readme
    # Only the first branch carries it; the ledger, study and git agree.
    assert all(t.commit == repo.heads[t.branch].commit.hexsha and branch_worth.TRAILER not in
               repo.heads[t.branch].commit.message for t in branched[1:])
    assert recovery.problems(ledger, run, f"sqlite:///{tmp_path / 'o.sqlite'}", repo) == []
    assert any(e == "capacity" and f"written into {first.branch}" in i["line"] for e, i in said)


@pytest.mark.parametrize("cut", ["before the commit", "after the commit"])
def test_a_crash_around_the_capacity_commit_loses_nothing_and_measures_nothing_twice(tmp_path, monkeypatch, cut):
    real = gitops.add_commit

    def crash(*args, **kwargs):
        if cut == "after the commit":
            real(*args, **kwargs)
        raise KeyboardInterrupt

    engine = TrialsFakeLaddersReal()
    monkeypatch.setattr(gitops, "add_commit", crash)
    with pytest.raises(KeyboardInterrupt):
        capacity_night(tmp_path, monkeypatch, engine)
    monkeypatch.setattr(gitops, "add_commit", real)
    ledger, storage = Ledger(tmp_path / "ledger.sqlite"), f"sqlite:///{tmp_path / 'o.sqlite'}"
    repo = gitops.open_repo(tmp_path / "p")
    done = recovery.repair(ledger, ledger.run("rc"), storage, repo)
    assert any("worth under load was committed just before the crash" in line for line in done) == (
        cut == "after the commit")
    ledger, repo, run, _ = capacity_night(tmp_path, monkeypatch, engine, ledger)
    first = min((t for t in ledger.trials("rc") if t.branch), key=lambda t: t.number)
    assert len(engine.ladders) == 2     # the rows were kept: the resume committed from them
    assert len(ledger.capacities("rc")) == 2
    head = repo.heads[first.branch].commit
    assert head.hexsha == first.commit and branch_worth.TRAILER in head.message
    assert sum(branch_worth.TRAILER in c.message for c in repo.iter_commits(first.branch)) == 1
    assert recovery.problems(ledger, run, storage, repo) == []


def test_the_plan_line_says_what_capacity_costs_and_the_estimate_brackets_the_ladder():
    from sandbox.contract import load_workload

    workload = load_workload("smoke")   # 4 requests a phase at one stream
    ladder = Ladder.from_dict({"kind": "concurrency", "loads": [1, 2]}, "t")
    timings = {"start_s": 60.0, "teardown_s": 5.0, "benchmark_s": 16.0}    # 2 s a request, 2 repeats
    low, high = capacity.estimate_s(timings, workload, 2, ladder)
    # Each rung sends 16 requests a phase (8 x the top load) after its warm-ups (1, then 4 at 2 streams).
    assert high == pytest.approx(2 * (65 + 2 * (1 + 32) + 2 * (4 + 32)))          # 406 s
    assert low == pytest.approx(2 * (65 + 2 * (1 + 32) + 2 * (4 + 32) / 2))      # 334 s
    plan = budget.plan(timings, 1, True, 3600, 0)
    line = budget.plan_line({**plan, "capacity_of": "concurrency 1,2", "capacity_s": [round(low), round(high)]})
    assert "--capacity then measures the defaults and the first branch up concurrency 1,2: about 6 min to 7 min" in line
    same = budget.plan_line({**plan, "capacity_of": "concurrency 1", "capacity_s": [190, 200]})
    assert same.endswith("up concurrency 1: about 3 min")


def test_capacity_options_are_checked_before_a_run_starts(tmp_path):
    from agent.request import RunError, RunRequest, prepare_run

    ledger = Ledger(tmp_path / "l.sqlite")
    for request, needle in ((RunRequest(budget_text="1h", capacity="1,x"), "--capacity: '1,x' is not loads"),
                            (RunRequest(budget_text="1h", capacity="4,2"), "--capacity.loads: [4, 2]"),
                            (RunRequest(budget_text="1h", price_per_hour=2.0),
                             "--price-per-hour: 2 is for --capacity")):
        with pytest.raises(RunError, match=re.escape(needle)):
            prepare_run(request, ledger, tmp_path, 0, "sqlite", lambda s: None)
    assert ledger.runs() == []
