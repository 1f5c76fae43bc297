"""Numbers a user can trust: noise, drift, held-out re-checks and SLOs, with a deterministic engine."""

from datetime import datetime, timedelta, timezone

import pytest

from agent import gitops, space as spaces
from agent.gate import Baseline, GateSettings, check
from agent.ledger import Ledger, Run
from agent.loop import Settings, run_search
from fake_engine import GREEDY, FakeEngine

BASE = Baseline(tps=10.0, ppl=8.0, greedy=GREEDY, noise=0.04)


def result(tps, ppl=8.0, greedy=GREEDY, ttft=50.0, itl=40.0):
    return {"status": "ok", "bench": {"tps": tps, "errors": 0, "ttft_ms": {"p99": ttft}, "itl_ms": {"p99": itl}},
            "quality": {"ppl": ppl, "greedy": [{"token_ids": g} for g in greedy]}}


def test_a_gain_inside_the_noise_is_not_accepted_and_one_beyond_it_is():
    inside = check(result(10.35), BASE, lossless=True)
    assert not inside.passed and "does not clear the noise" in inside.reasons[0]
    assert check(result(10.5), BASE, lossless=True).passed
    assert not check(result(10.5), BASE, lossless=True, settings=GateSettings(min_gain=0.02)).passed


def test_drift_divides_out_of_the_ratio_and_slo_bounds_refuse_fast_but_slow_to_answer_configs():
    slowed = Baseline(**{**vars(BASE), "drift": 0.8})
    assert check(result(12.0), slowed, lossless=True).tps_ratio == pytest.approx(1.5)
    slo = GateSettings(ttft_p99_ms_max=100)
    refused = check(result(15.0, ttft=250.0), BASE, lossless=True, settings=slo)
    assert not refused.passed and "SLO: p99 time to first token 250 ms" in refused.reasons[0]


def night(tmp_path, engine, **settings):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    space = spaces.load("vllm-cpu")
    run = ledger.add(Run(id="t", deadline_at=(datetime.now(timezone.utc) + timedelta(hours=1)).isoformat(),
                         model="m", space_path=space.path, space_hash=space.hash, workload="smoke", repo="",
                         settings={"home": str(tmp_path)}))
    repo = gitops.open_repo(tmp_path / "p", create=True)
    s = Settings(model="m", workload="smoke", facts={"cpus": 2, "concurrency": 1}, **settings)
    run_search(run, s, space, ledger, engine, repo, f"sqlite:///{tmp_path / 'o.sqlite'}")
    return ledger, repo


def test_a_machine_that_slows_down_is_caught_by_the_drift_check_and_corrected(tmp_path):
    ledger, _ = night(tmp_path, FakeEngine(slowdown=(5, 0.8)), drift_every=3, max_trials=12)
    trials = ledger.trials("t")
    checks = [t for t in trials if t.source == "drift"]
    assert checks and checks[-1].drift == pytest.approx(0.8, rel=0.02)
    caught = next(c for c in checks if c.drift != 1.0)
    after = [t for t in trials if t.number > caught.number and t.status == "ok" and t.source != "drift"]
    assert after and all(t.tps_corrected == pytest.approx(t.tps / t.drift, rel=1e-3) for t in after)
    # Corrected, a config runs at the ratio it had before the slowdown: binding every core is 1.5x.
    bound = [t for t in after if t.params.get("VLLM_CPU_OMP_THREADS_BIND", "auto") != "auto"
             and len(t.params) == 1]
    assert all(t.tps_ratio == pytest.approx(1.5, rel=0.03) for t in bound)


def test_a_steady_machine_gets_no_correction(tmp_path):
    ledger, _ = night(tmp_path, FakeEngine(), drift_every=2, max_trials=6)
    checks = [t for t in ledger.trials("t") if t.source == "drift"]
    assert len(checks) >= 2 and all(c.drift == 1.0 and "no correction" in c.gate_reasons[0] for c in checks)


def test_a_gain_that_vanishes_on_held_out_prompts_is_not_committed(tmp_path):
    ledger, repo = night(tmp_path, FakeEngine(speculation_heldout=0.9), max_trials=6)
    ngram = [t for t in ledger.trials("t") if t.params.get("speculative-config.method") == "ngram"
             and t.status == "ok" and t.heldout_ratio is not None]
    assert ngram, "the planner proposes ngram speculation on a single-stream workload"
    for t in ngram:
        assert t.gate_passed is False and t.branch is None
        allowed = 0.05 + 2 * ledger.run("t").noise
        assert any("held-out re-check" in r for r in t.gate_reasons) and t.heldout_ratio < t.tps_ratio * (1 - allowed)
    # A config whose gain holds on held-out prompts is committed with both figures.
    kept = [t for t in ledger.trials("t") if t.branch]
    allowed = 0.05 + 2 * ledger.run("t").noise
    assert kept and all(t.heldout_ratio >= t.tps_ratio * (1 - allowed) for t in kept)
    assert all(f"agent/t/{t.number}" in gitops.branches(repo) for t in kept)


def test_kl_divergence_from_the_baselines_top_k_catches_a_shift_that_keeps_greedy_outputs():
    same = [[{" a": -0.1, " b": -2.5}, {" c": -0.2, " d": -1.8}] for _ in GREEDY]
    shifted = [[{" a": -0.7, " b": -0.9}, {" c": -0.6, " d": -0.9}] for _ in GREEDY]
    base = Baseline(**{**vars(BASE), "top_logprobs": same})
    strict = GateSettings(kl_max=0.01)

    def with_tops(tops):
        r = result(11.0)
        for g, t in zip(r["quality"]["greedy"], tops):
            g["top_logprobs"] = t
        return r

    kept = check(with_tops(same), base, lossless=False, settings=strict)
    assert kept.passed and kept.kl == 0.0
    moved = check(with_tops(shifted), base, lossless=False, settings=strict)
    assert not moved.passed and moved.kl > 0.05 and "KL divergence" in moved.reasons[0]
    assert moved.agreement == 1.0   # greedy outputs alone would not have caught it
    blind = check(result(11.0), base, lossless=False, settings=strict)
    assert not blind.passed and "not measurable" in blind.reasons[0]
    assert check(result(11.0), base, lossless=False).passed   # off unless asked for


def test_intervals_widen_with_spread_and_fall_back_to_the_noise_with_one_measurement():
    from agent.gate import interval

    tight, loose = interval([10.0, 10.1, 9.9], 0.0), interval([8.0, 12.0, 10.0], 0.0)
    assert tight[0] < 10.0 < tight[1] and (loose[1] - loose[0]) > 5 * (tight[1] - tight[0])
    assert interval([10.0], 0.05) == pytest.approx((9.0, 11.0))
