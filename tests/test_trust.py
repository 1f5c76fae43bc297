"""Numbers a user can trust, through the loop with a deterministic engine: the A/A check, drift,
the held-out decision as the committed claim, dominated configs, SLOs."""

from datetime import UTC, datetime, timedelta

import pytest
from fake_engine import FakeEngine

from agent import gitops
from agent import space as spaces
from agent.context import RunContext, Seams, Settings
from agent.gate import GateSettings
from agent.ledger import Ledger, Run
from agent.loop import run_search

pytestmark = pytest.mark.slow   # nights of the loop on the wall clock (tests/conftest.py: not in `pytest -m unit`)

def night(tmp_path, engine, gate=GateSettings(), **settings):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    space = spaces.load("vllm-cpu")
    run = ledger.add(Run(id="t", deadline_at=(datetime.now(UTC) + timedelta(hours=1)).isoformat(),
                         model="m", space_path=space.path, space_hash=space.hash, workload="smoke", repo="",
                         settings={"home": str(tmp_path)}))
    repo = gitops.open_repo(tmp_path / "p", create=True)
    s = Settings(model="m", workload="smoke", gate=gate, facts={"cpus": 2, "concurrency": 1}, **settings)
    run_search(RunContext(run, s, space), Seams(ledger, engine, repo), f"sqlite:///{tmp_path / 'o.sqlite'}")
    return ledger, repo


def test_every_run_judges_the_defaults_as_a_candidate_first(tmp_path):
    ledger, _ = night(tmp_path, FakeEngine(), max_trials=2)
    trials = ledger.trials("t")
    assert [t.source for t in trials[:3]] == ["baseline", "baseline", "aa"]
    aa = trials[2]
    assert aa.decision == "aa-passed" and aa.gate_reasons[0].startswith("A/A check: no loss, no gain")
    run = ledger.run("t")
    assert run.calibration["aa"] == aa.gate_reasons[0] and run.calibration["rule"] == "calibrated"
    assert run.calibration["tau"] > 0 and run.noise_df >= 2
    # The engine's defaults were read once and decide losslessness: a sampled point that sets
    # dtype and kv-cache-dtype to their defaults is still held to greedy equivalence.
    assert run.calibration["engine_defaults"]["kv-cache-dtype"] == ["auto"]
    sampled = [t for t in trials if t.source == "sampler" and t.params.get("kv-cache-dtype") == "auto"
               and t.params.get("dtype") == "bfloat16"]
    assert all(t.lossless == all(spaces.load("vllm-cpu").knobs[k].lossless for k in t.params
                                 if t.params[k] not in (run.calibration["engine_defaults"].get(k) or []))
               for t in sampled)


class FasterDefaults(FakeEngine):
    """The A/A's server happens to be fast: the speed rule would call the defaults a gain."""

    def evaluate(self, spec, trial_dir, timeout_s, on_phase=lambda phase: None):
        result = super().evaluate(spec, trial_dir, timeout_s, on_phase)
        if self.calls == 3 and result.ok:
            result.bench.tps *= 1.3
        return result


def test_an_aa_that_looks_like_a_gain_adds_baseline_instances_and_says_so(tmp_path):
    ledger, _ = night(tmp_path, FasterDefaults(), max_trials=1)
    trials = ledger.trials("t")
    aa = next(t for t in trials if t.source == "aa")
    assert aa.decision == "aa-failed" and "faster than themselves" in aa.gate_reasons[0]
    later = [t for t in trials if t.source == "baseline" and t.number > aa.number]
    assert later and "A/A check called them faster" in later[0].rationale
    first_candidate = next(t for t in trials if t.source in ("planner", "sampler"))
    assert first_candidate.number > later[-1].number


def test_a_machine_that_slows_down_is_caught_by_the_drift_check_and_corrected(tmp_path):
    ledger, _ = night(tmp_path, FakeEngine(slowdown=(6, 0.8)), drift_every=3, max_trials=12)
    trials = ledger.trials("t")
    checks = [t for t in trials if t.source == "drift"]
    assert checks and checks[-1].drift == pytest.approx(0.8, rel=0.02)
    caught = next(c for c in checks if c.drift != 1.0)
    after = [t for t in trials if t.number > caught.number and t.status == "ok" and t.source in ("planner", "sampler")]
    assert after and all(t.figure_corrected == pytest.approx(t.figure / t.drift, rel=1e-3) for t in after)
    # Corrected, a config runs at the ratio it had before the slowdown: binding every core is 1.5x.
    bound = [t for t in after if t.params.get("VLLM_CPU_OMP_THREADS_BIND", "auto") != "auto" and len(t.params) == 1]
    assert all(t.search_ratio == pytest.approx(1.5, rel=0.03) for t in bound)


def test_a_steady_machine_gets_no_correction(tmp_path):
    ledger, _ = night(tmp_path, FakeEngine(), drift_every=2, max_trials=6)
    checks = [t for t in ledger.trials("t") if t.source == "drift"]
    assert len(checks) >= 2 and all(c.drift == 1.0 and "no correction" in c.gate_reasons[0] for c in checks)


def test_the_committed_claim_is_the_held_out_one_and_a_gain_that_vanishes_there_is_refused(tmp_path):
    ledger, repo = night(tmp_path, FakeEngine(speculation_heldout=0.6), max_trials=6)
    trials = ledger.trials("t")
    ngram = [t for t in trials if "speculative-config" in t.flags and t.heldout_ratio is not None]
    assert ngram, "the planner proposes ngram speculation on a single-stream workload"
    for t in ngram:
        assert t.branch is None and t.decision == "refused" and t.heldout_interval[1] < t.search_ratio
        assert "below the search prompts'" in t.gate_reasons[0]
    kept = [t for t in trials if t.branch]
    assert kept
    for t in kept:
        assert t.heldout_interval[0] > 1 and t.decision == "accepted"
        results = repo.git.show(f"{t.branch}:serving/results.json")
        assert f'"heldout_ratio": {t.heldout_ratio}' in results and '"heldout_interval"' in results
        assert f"held-out {t.heldout_ratio:.3f}x" in repo.commit(t.branch).message


def test_a_dominated_config_is_recorded_not_branched(tmp_path):
    # ngram on top of core binding is no faster on held-out prompts than core binding alone.
    ledger, repo = night(tmp_path, FakeEngine(speculation_heldout=1.0), max_trials=8)
    trials = ledger.trials("t")
    dominated = [t for t in trials if t.decision == "dominated"]
    after_heldout = [t for t in dominated if t.heldout_instances]
    assert after_heldout and all(t.branch is None and t.gate_passed for t in after_heldout)
    assert all("not faster beyond the noise" in t.gate_reasons[-1] for t in after_heldout)
    # Slower than a proposed branch on the search prompts beyond the noise: no fresh servers spent.
    on_search = [t for t in dominated if not t.heldout_instances]
    assert on_search and all(not t.gate_passed and "dominated on the search prompts" in t.gate_reasons[-1]
                             for t in on_search)
    assert len(gitops.branches(repo)) == len([t for t in trials if t.branch]) >= 1


def test_slo_bounds_refuse_fast_configs_that_answer_late(tmp_path):
    class Late(FakeEngine):
        def evaluate(self, spec, trial_dir, timeout_s, on_phase=lambda phase: None):
            result = super().evaluate(spec, trial_dir, timeout_s, on_phase)
            if result.bench and spec["env"].get("VLLM_CPU_OMP_THREADS_BIND", "auto") != "auto":
                result.bench.ttft_ms["p99"] = 250.0
            return result

    ledger, _ = night(tmp_path, Late(), gate=GateSettings(slo_ttft_p99_ms=100), max_trials=3)
    bound = [t for t in ledger.trials("t") if t.params.get("VLLM_CPU_OMP_THREADS_BIND", "auto") != "auto"]
    assert bound and all(not t.gate_passed and t.constraint > 0 for t in bound)
    assert any("SLO: p99 time to first token 250 ms" in r for t in bound for r in t.gate_reasons)
