"""The harness's allow-list (sandbox.allowed): the worker serves only the flags, JSON keys and variables
of the run's space, typed and bounded, from a file whose hash is on its command line; the spec's own
checks (a deny-list of what the worker owns) let through what nobody listed."""

import json
import re
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

pytestmark = pytest.mark.process   # starts processes (tests/conftest.py: not in `pytest -m unit`)

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


def run_rules(space, workload="smoke", quality="quick", model="m"):
    """The allow-list an `agent run` hands its workers (agent.recording.allowed) for these inputs."""
    from agent.context import Settings
    from agent.recording import allowed as run_allowed

    return run_allowed(space, Settings(model=model, workload=workload, quality=quality))


def the_agents_spec(space, run_workload="smoke", run_quality="quick", **change):
    """A spec as agent.recording.spec_for writes it for the run's settings, then changed."""
    return {**_spec(space, run_workload, run_quality, heldout=False), **change}


def _spec(space, workload: str, quality: str, heldout: bool) -> dict:
    from agent.context import RunContext, Settings
    from agent.ledger import Run, Trial
    from agent.recording import spec_for
    from sandbox.spec import StopRules
    from sandbox.workload import load_workload

    ctx = RunContext(Run(id="r"), Settings(model="m", workload=workload, quality=quality), space)
    flags, env = space.to_flags_env({})
    meter = load_workload(workload).with_split("heldout") if heldout else None
    return spec_for(ctx, Trial(flags=flags, env=env), StopRules(prune_below=3.0), heldout_meter=meter).as_dict()


def held_out_spec(space, workload="smoke"):
    """The held-out instance's spec, as agent.judging.held_out writes it: the heldout split inline, no quality."""
    return _spec(space, workload, "quick", heldout=True)


# Every key of a trial spec (sandbox.spec.TrialSpec, plus quality_text) and what decides it: the run's
# inputs, exactly (the allow-list's hash on the worker's command line), or the agent's per-trial
# instructions, typed and bounded by sandbox.spec. Each row: a value the run did not choose, and the
# words of its refusal.
SPEC_KEYS = {
    "model": ("run", {"model": "/any/other/model"}, "spec.model: '/any/other/model' is not the run's own"),
    "flags": ("run", {"flags": {"scheduler-cls": "evil.Scheduler"}}, "is not a flag of the run's space"),
    "env": ("run", {"env": {"LD_PRELOAD": "/tmp/x.so"}}, "LD_PRELOAD"),
    "fixed": ("run", {"flags": {}, "env": {}}, "is fixed by the run's space and missing"),
    "workload": ("run", {"workload": "edits-c32"}, "spec.workload: edits-c32 (hash"),
    "workload.chat_template": ("run", {"workload": "chat-template"}, "spec.workload: chat-cpu (hash"),
    "workload.traffic": ("run", {"workload": "traffic"}, "spec.workload: chat-cpu (hash"),
    "quality": ("run", {"quality": "default"}, "spec.quality: default (hash"),
    "quality_text": ("run", {"quality_text": "README.md"}, "spec.quality: quick+text (hash"),
    "trust_remote_code": ("run", {"trust_remote_code": True}, "spec.trust_remote_code: True is not the run's own"),
    "repeats": ("run", {"repeats": 7}, "spec.repeats: 7 is not the run's own"),
    "heldout_bench": ("bounded", {"heldout_bench": "yes"}, "heldout_bench: 'yes' is not true or false"),
    "deadlines": ("bounded", {"deadlines": {"start_s": 1e12}}, "deadlines.start_s: 1000000000000.0 is not a number"),
    "stop_rules": ("bounded", {"stop_rules": {"prune_below": -1}}, "prune_below: -1 is not a figure"),
    "ladder": ("bounded", {"ladder": {"kind": "concurrency", "loads": [1, 100000]}}, "spec.ladder.loads: [1, 100000]"),
}


def test_every_key_of_a_trial_spec_is_the_runs_own_or_typed_and_bounded(tmp_path):
    """Before, the worker checked flags and env against the run's allow-list and nothing else: a spec
    with trust_remote_code: true, another model, a chat template or traffic file of anyone's choosing,
    or without the space's fixed flags was served."""
    from dataclasses import fields

    from sandbox.spec import TrialSpec, from_dict
    from sandbox.workload import load_workload

    assert {f.name for f in fields(TrialSpec)} | {"quality_text"} <= set(SPEC_KEYS) | {"fixed"}
    space = spaces.load("vllm-cpu").with_fixed_flag("max-model-len", 4096)
    rules = run_rules(space)
    for spec in (the_agents_spec(space), held_out_spec(space)):   # what the agent itself sends passes
        allowed.check_spec(rules, from_dict(spec))
    chat = load_workload("chat-cpu")
    (tmp_path / "other.jinja").write_text("{{ messages }}")
    custom = {k: getattr(chat, k) for k in chat.__dataclass_fields__}
    traffic = tmp_path / "other.jsonl"   # the run's traffic with one request's words changed
    lines = Path(chat.traffic).read_text().splitlines()
    first = json.loads(lines[0])
    first["messages"][-1]["content"] = "Something else entirely: " + first["messages"][-1]["content"]
    traffic.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    for key, (_decided_by, change, says) in SPEC_KEYS.items():
        if key == "workload.chat_template":   # the run's chat workload, its template swapped
            rules_here = run_rules(space, workload=custom)
            change = {"workload": {**custom, "chat_template": str(tmp_path / "other.jinja")}}
        elif key == "workload.traffic":   # the run's workload, its traffic file swapped
            rules_here = run_rules(space, workload=custom)
            change = {"workload": {**custom, "traffic": str(traffic)}}
        else:
            rules_here = rules
        spec = the_agents_spec(space, **change)
        with pytest.raises(SpecError, match=re.escape(says)):
            allowed.check_spec(rules_here, from_dict(spec))   # from_dict refuses the bounded ones first


def test_the_worker_refuses_a_spec_outside_its_allow_list_before_any_server(tmp_path):
    rules = run_rules(spaces.load("vllm-cpu"))
    text = json.dumps(rules, sort_keys=True)
    (tmp_path / "allowed.json").write_text(text)
    spec = {"model": "m", "flags": {"scheduler-cls": "evil.Scheduler"}, "env": {},
            "workload": "smoke", "quality": "none"}
    (tmp_path / "trial.yaml").write_text(yaml.safe_dump(spec))
    # The agent's own spec with one key changed that the flags' check never saw: refused by name too.
    own = the_agents_spec(spaces.load("vllm-cpu"))
    (tmp_path / "trusting.yaml").write_text(yaml.safe_dump({**own, "trust_remote_code": True}))

    def worker(sha, spec="trial.yaml"):
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "sandbox.worker", str(tmp_path / spec), "--out",
                               str(tmp_path / "result.json"), "--allowed", str(tmp_path / "allowed.json"),
                               "--allowed-sha", sha], capture_output=True, text=True, cwd=ROOT, timeout=120)
        result = json.loads((tmp_path / "result.json").read_text())
        return done.returncode, result["failure"], time.monotonic() - started

    code, failure, took = worker(allowed.digest(text))
    assert code == 2 and failure["class"] == "invalid_config" and took < 60
    assert "scheduler-cls: --scheduler-cls is not a flag of the run's space" in failure["message"]
    code, failure, _ = worker(allowed.digest(text), "trusting.yaml")
    assert code == 2 and "trust_remote_code: True is not the run's own" in failure["message"]
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
    engine.allow(run_rules(spaces.load("vllm-cpu")))
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
