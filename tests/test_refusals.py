"""Refusals vLLM states are learned once: a refused point is reduced to its cause, later points
that contain it are never started, and the planner and the ledger are told.

The engine here is the deterministic fake with two refusals of the kinds vLLM has: one its config
classes raise (so the pre-flight catches it, like async scheduling with plain ngram speculation),
one only engine initialisation raises (like FlashInfer with sliding-window layers on SM90).
"""

from datetime import UTC, datetime

import pytest
from fake_engine import FakeEngine, refused_at_preflight

from agent import budget, gitops, refusals
from agent import space as spaces
from agent.context import RunContext, Seams, Settings
from agent.gate import GateSettings
from agent.ledger import LearnedRule, Ledger, Run
from agent.loop import run_search
from agent.screening import facts_for
from sandbox.result import failed

pytestmark = pytest.mark.slow   # nights of the loop on the wall clock (tests/conftest.py: not in `pytest -m unit`)

START_REFUSAL = "NotImplementedError: CPU_ATTN with prefix caching needs a block size of 64 or more, got 32"


def refused_at_start(flags: dict) -> bool:
    return flags.get("block-size") == 32 and flags.get("enable-prefix-caching") is True


class RefusingEngine(FakeEngine):
    def __init__(self):
        super().__init__(delay_s=0.01)
        self.starts = []

    def evaluate(self, spec, trial_dir, timeout_s, on_phase=lambda phase: None):
        self.starts.append(spec["flags"])
        if refused_at_start(spec["flags"]):
            trial_dir.mkdir(parents=True, exist_ok=True)
            result = failed("invalid_config", f"server exited with code 1 during start: {START_REFUSAL}",
                            START_REFUSAL, failed_phase="start", workload={"name": spec["workload"]})
            result.failure.cause = START_REFUSAL
            return result
        return super().evaluate(spec, trial_dir, timeout_s, on_phase)


@pytest.fixture(scope="module")
def night(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("refusals")
    ledger = Ledger(tmp / "ledger.sqlite")
    repo = gitops.open_repo(tmp / "proposals", create=True)
    space = spaces.load("vllm-cpu", cpu_flags={"avx512f"})
    # A count of trials, not a clock, ends this night: seeded random draws then meet both refusals on a
    # loaded machine as on an idle one (a 10 s deadline drew no init-only refusal once in CI).
    run = ledger.add(Run(id="r1", deadline_at=budget.deadline_after(600, datetime.now(UTC)).isoformat(),
                         model="m", space_path=space.path, space_hash=space.hash, workload="smoke",
                         repo=str(repo.working_dir), settings={"home": str(tmp)}))
    engine, events = RefusingEngine(), []
    settings = Settings(model="m", workload="smoke", gate=GateSettings(), facts={"cpus": 2, "concurrency": 1},
                        sampler="random", seed=0, max_trials=24)
    run_search(RunContext(run, settings, space), Seams(ledger, engine, repo, lambda e, **i: events.append((e, i))),
               f"sqlite:///{tmp / 'optuna.sqlite'}")
    return ledger, engine, events


def test_a_config_refusal_is_caught_at_preflight_reduced_to_its_cause_and_never_started(night):
    ledger, engine, _ = night
    assert not any(refused_at_preflight(f) for f in engine.starts)   # not one start for it
    rules = [r for r in ledger.learned_rules("r1") if r.stage == "pre-flight"]
    assert len(rules) == 1, [r.settings for r in rules]
    (rule,) = rules
    assert rule.settings == {"enforce-eager": True, "speculative-config.method": "ngram"}
    assert rule.how == "minimised at pre-flight" and rule.checks >= 1
    first = ledger.trial("r1", rule.from_trial)
    assert first.status == "failed" and first.failure_class == "invalid_config"
    assert first.failure_message.startswith("refused at pre-flight: 1 validation error for VllmConfig")
    assert first.failure_cause.startswith("1 validation error for VllmConfig") and first.failed_phase == "preflight"


def test_an_init_only_refusal_costs_one_start_and_its_rule_names_the_settings_vllm_named(night):
    ledger, engine, _ = night
    assert sum(refused_at_start(f) for f in engine.starts) == 1
    (rule,) = [r for r in ledger.learned_rules("r1") if r.stage == "start"]
    assert rule.settings == {"block-size": 32, "enable-prefix-caching": True}
    assert rule.how == "named in vLLM's message" and rule.message == START_REFUSAL
    first = ledger.trial("r1", rule.from_trial)
    assert first.failure_cause == START_REFUSAL and first.failed_phase == "start"


def test_later_points_with_a_learned_rule_are_skipped_and_told_to_optuna_as_infeasible(night):
    ledger, _, events = night
    skipped = [t for t in ledger.trials("r1") if t.failure_message and "contains learned rule" in t.failure_message]
    assert skipped, "the run drew no point containing a learned rule: too short to test this"
    assert all(t.status == "skipped" and t.constraint == 1.0 for t in skipped)
    assert {e for e, _ in events} >= {"learned"}


def test_the_planner_is_shown_what_vllm_refused():
    settings = Settings(model="m", workload="w", facts={"cpus": 2})
    rule = LearnedRule(settings={"block-size": 32, "enable-prefix-caching": True}, message=START_REFUSAL)
    facts = facts_for(settings.facts, [rule])
    assert facts["cpus"] == 2
    assert facts["refused_by_vllm_this_run"] == [f"block-size=32, enable-prefix-caching=True: {START_REFUSAL}"]
    assert facts_for(settings.facts, []) == {"cpus": 2}


def test_reduction_keeps_only_what_is_still_refused_for_the_same_cause():
    changes = {"a": 1, "b": 2, "c": 3}
    said = lambda sub: "needs a and c (got 7)" if {"a", "c"} <= set(sub) else None  # noqa: E731
    assert refusals.minimise(changes, "needs a and c (got 3)", said) == ({"a": 1, "c": 3}, 3)
    # dropping b changes the refusal: b stays
    other = lambda sub: "needs a and c" if "b" in sub else "a different refusal"  # noqa: E731
    assert refusals.minimise(changes, "needs a and c", other)[0] == {"b": 2}


def test_named_settings_are_read_from_the_message():
    changes = {"attention-backend": "FLASHINFER", "max-num-seqs": 64, "async-scheduling": True}
    said = "FlashInfer backend on SM90 currently crashes with sliding-window attention layers."
    assert refusals.named(changes, said) == {"attention-backend": "FLASHINFER"}
    said = "Currently, async scheduling is only supported with EAGLE/MTP kind of speculative decoding"
    assert refusals.named(changes, said) == {"async-scheduling": True}
