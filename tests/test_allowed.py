"""The harness's allow-list (sandbox.allowed): the worker serves only the flags, JSON keys and variables
of the run's space, typed and bounded, from a file whose hash is on its command line; the spec's own
checks (a deny-list of what the worker owns) let through what nobody listed."""

import json
import subprocess
import sys
import time
from datetime import UTC
from pathlib import Path

import optuna
import pytest
import yaml

from agent import drafts
from agent import space as spaces
from sandbox import allowed
from sandbox.spec import SpecError, check_flags

ROOT = Path(__file__).resolve().parents[1]
SPACES = sorted(p.stem for p in (ROOT / "search_space").glob("*.yaml"))

# What the review (issue 45, item 8) got past the spec's checks, each with a value that would act.
HOSTILE = {
    "otlp-traces-endpoint": "http://attacker.example:4317",
    "allowed-local-media-path": "/",
    "data-parallel-address": "0.0.0.0",
    "kv-transfer-config": {"kv_connector": "x", "kv_connector_module_path": "evil.module"},
    "scheduler-cls": "evil.Scheduler",
    "lora-modules": "x=/etc",
    "speculative-config": {"method": "draft_model", "model": "attacker/any-model", "num_speculative_tokens": 4},
}


@pytest.mark.parametrize("name", SPACES)
def test_every_point_a_space_samples_is_allowed_and_every_hostile_flag_refused(name, tmp_path):
    space = spaces.load(name, cpu_flags={"avx512f"})
    rules = space.allowed()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(300):
        trial = study.ask()
        point = space.sample(trial)
        study.tell(trial, 1.0)
        if space.problems(point):
            continue
        flags, env = space.to_flags_env(point)
        allowed.check(rules, flags, env)   # raises on any the space itself would send
    for flag, value in HOSTILE.items():
        check_flags({flag: value})   # the spec's own check lets each through ...
        with pytest.raises(SpecError, match=flag if flag != "speculative-config" else "model"):
            allowed.check(rules, {flag: value}, {})   # ... the allow-list does not


def test_values_keys_and_variables_outside_the_space_are_refused_by_name():
    space = drafts.add_drafts(spaces.load("vllm-gpu"), ["/models/my-draft"])
    rules = space.allowed()
    draft = {"method": "draft_model", "model": "/models/my-draft", "num_speculative_tokens": 4}
    allowed.check(rules, {"speculative-config": draft}, {})   # the run's own draft: allowed
    for flags, env, says in [
        ({"max-num-seqs": 100000}, {}, "outside"),
        ({"max-num-seqs": 32.0}, {}, "whole number"),
        ({"max-num-seqs": True}, {}, "whole number"),
        ({"block-size": "16"}, {}, "not one of"),
        ({"speculative-config": {**draft, "model": "/models/other"}}, {}, "model"),
        ({"speculative-config": {**draft, "draft_tensor_parallel_size": 8}}, {}, "draft_tensor_parallel_size"),
        ({}, {"LD_PRELOAD": "/tmp/x.so"}, "LD_PRELOAD"),
    ]:
        with pytest.raises(SpecError, match=says):
            allowed.check(rules, flags, env)


def test_the_worker_refuses_a_spec_outside_its_allow_list_before_any_server(tmp_path):
    rules = spaces.load("vllm-cpu").allowed()
    text = json.dumps(rules, sort_keys=True)
    (tmp_path / "allowed.json").write_text(text)
    spec = {"model": "m", "flags": {"scheduler-cls": "evil.Scheduler"}, "env": {},
            "workload": "smoke", "quality": "none"}
    (tmp_path / "trial.yaml").write_text(yaml.safe_dump(spec))

    def worker(sha):
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "sandbox.worker", str(tmp_path / "trial.yaml"), "--out",
                               str(tmp_path / "result.json"), "--allowed", str(tmp_path / "allowed.json"),
                               "--allowed-sha", sha], capture_output=True, text=True, cwd=ROOT, timeout=120)
        result = json.loads((tmp_path / "result.json").read_text())
        return done.returncode, result["failure"], time.monotonic() - started

    code, failure, took = worker(allowed.digest(text))
    assert code == 2 and failure["class"] == "invalid_config" and took < 60
    assert "scheduler-cls: --scheduler-cls is not a flag of the run's space" in failure["message"]
    # The allow-list itself swapped for a wider one: its hash no longer matches what the agent gave.
    wide = {**rules, "flags": {**rules["flags"], "scheduler-cls": {"choices": ["evil.Scheduler"]}}}
    (tmp_path / "allowed.json").write_text(json.dumps(wide, sort_keys=True))
    code, failure, _ = worker(allowed.digest(text))
    assert code == 2 and "the allow-list was changed" in failure["message"]


def test_a_model_that_reads_as_a_flag_is_refused():
    from sandbox.spec import from_dict

    with pytest.raises(SpecError, match="model"):
        from_dict({"model": "--trust-remote-code", "quality": "none"})


def test_the_real_engine_hands_its_worker_the_run_allow_list(tmp_path):
    """agent.engine.WorkerEngine with the run's rules: a hostile flag in a spec ends as invalid_config from
    the worker's own check, in seconds, with no server."""
    from agent.engine import WorkerEngine

    engine = WorkerEngine()
    engine.allow(spaces.load("vllm-cpu").allowed())
    spec = {"model": "m", "flags": {"otlp-traces-endpoint": "http://attacker.example:4317"},
            "env": {}, "workload": "smoke", "quality": "none"}
    try:
        result = engine.evaluate(spec, tmp_path / "t", 120)
    finally:
        engine.close()
    assert result.failure.klass == "invalid_config" and "otlp-traces-endpoint" in result.failure.message
    assert (tmp_path / "t" / "allowed.json").exists() and not (tmp_path / "t" / "server.log").exists()


def test_verify_refuses_a_branch_whose_flags_the_space_does_not_allow(tmp_path):
    """`agent verify` reads a branch's serving/results.json: data, checked against the run's space before
    any server starts (before, its flags went straight into a trial)."""
    from datetime import datetime, timedelta

    from fake_engine import FakeEngine

    from agent import gitops
    from agent.context import RunContext, Seams, Settings
    from agent.ledger import Ledger, Run
    from agent.loop import run_search
    from agent.verify import VerifyError, verify

    ledger, space = Ledger(tmp_path / "ledger.sqlite"), spaces.load("vllm-cpu")
    repo = gitops.open_repo(tmp_path / "p", create=True)
    run = ledger.add(Run(id="v", deadline_at=(datetime.now(UTC) + timedelta(hours=1)).isoformat(), model="m",
                         space_path=space.path, space_hash=space.hash, workload="smoke", repo=str(repo.working_dir),
                         settings={"home": str(tmp_path)}))
    engine = FakeEngine()
    engine.allow(space.allowed())
    run_search(RunContext(run, Settings(model="m", workload="smoke", max_trials=2, facts={"cpus": 2, "concurrency": 1}),
                          space), Seams(ledger, engine, repo), f"sqlite:///{tmp_path / 'o.sqlite'}")
    branch = next(t.branch for t in ledger.trials("v") if t.branch)
    claim = json.loads(repo.git.show(f"{branch}:serving/results.json"))
    claim["serving"]["flags"]["scheduler-cls"] = "evil.Scheduler"
    gitops.commit_branch(repo, "agent/v/99", {"serving/results.json": (json.dumps(claim), False)}, "tampered")
    calls = engine.calls
    with pytest.raises(VerifyError, match="scheduler-cls.*the run's space does not allow it; nothing was started"):
        verify(ledger, repo, "agent/v/99", engine, tmp_path / "verify", say=lambda m: None)
    assert engine.calls == calls
