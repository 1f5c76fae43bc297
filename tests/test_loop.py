"""The loop end to end with a deterministic engine at the worker seam: real Optuna, SQLite, git."""

import time
from datetime import UTC, datetime, timedelta

import optuna
import pytest
import yaml
from fake_engine import FakeEngine

from agent import budget, gitops
from agent import space as spaces
from agent.context import RunContext, Seams, Settings
from agent.defaults import BaselineFailed
from agent.gate import GateSettings
from agent.ledger import Ledger, Run
from agent.loop import run_search
from sandbox.result import failed

pytestmark = pytest.mark.slow   # nights of the loop on the wall clock (tests/conftest.py: not in `pytest -m unit`)

@pytest.fixture(scope="module")
def night(tmp_path_factory):
    """One 12-second night shared by the tests that read it (none writes to it)."""
    tmp_path = tmp_path_factory.mktemp("night")
    ledger = Ledger(tmp_path / "ledger.sqlite")
    repo = gitops.open_repo(tmp_path / "proposals", create=True)
    space = spaces.load("vllm-cpu", cpu_flags={"avx512f"})   # a host where fp8 KV caches run: every choice
    now = datetime.now(UTC)
    run = ledger.add(Run(id="r1", deadline_at=budget.deadline_after(12, now).isoformat(), model="m",
                         space_path=space.path, space_hash=space.hash, workload="smoke", repo=str(repo.working_dir),
                         settings={"home": str(tmp_path)}))
    engine = FakeEngine()
    events = []
    settings = Settings(model="m", workload="smoke", gate=GateSettings(), facts={"cpus": 2, "concurrency": 1})
    finished = run_search(RunContext(run, settings, space),
                          Seams(ledger, engine, repo, lambda e, **i: events.append((e, i))),
                          f"sqlite:///{tmp_path / 'optuna.sqlite'}")
    return ledger, repo, finished, tmp_path, events


def test_baseline_first_then_sampler_trials_until_the_deadline(night):
    ledger, _, run, tmp_path, _ = night
    trials = ledger.trials("r1")
    assert [t.source for t in trials[:3]] == ["baseline", "baseline", "aa"]
    assert {t.source for t in trials[3:]} <= {"planner", "sampler", "drift", "extra"} and len(trials) > 10
    assert {"planner", "sampler", "drift"} <= {t.source for t in trials[3:]}
    assert run.status == "finished" and run.baseline_figure > 0 and 0 < run.noise < 0.02
    # The fake's trials take milliseconds, so the run ends within a moment of its deadline.
    assert datetime.fromisoformat(run.finished_at) <= datetime.fromisoformat(run.deadline_at) + timedelta(seconds=5)


def test_failures_are_classified_and_fed_back_to_the_sampler(night):
    ledger, _, _, tmp_path, _ = night
    oom = [t for t in ledger.trials("r1") if t.failure_class == "oom"]
    skipped = [t for t in ledger.trials("r1") if t.status == "skipped"]
    assert oom and all(t.status == "failed" and t.gate_passed is False for t in oom)
    # The space's rules, or a rule learned from a pre-flight refusal: about 20 of 100 trials here.
    assert skipped and all("excluded by the space's rules" in t.failure_message
                           or "contains learned rule" in t.failure_message for t in skipped)
    # The pre-flight is on, as in `agent run`: the fake's refusal came back in vLLM's words, never started.
    refused = [t for t in ledger.trials("r1") if t.failed_phase == "preflight"]
    assert refused and all(t.failure_cause.startswith("1 validation error for VllmConfig") for t in refused)
    study = optuna.load_study(study_name="r1", storage=f"sqlite:///{tmp_path / 'optuna.sqlite'}")
    by_number = {t.number: t for t in study.trials}
    for t in oom + skipped + refused:
        told = by_number[t.optuna_number]
        assert told.value == 0.0 and told.user_attrs["constraint"] == [1.0]


class EagerFirst:
    """A planner whose first proposals are the fake engine's 0.8x knob and a 0.95x one (the
    sampler may draw neither alone within a short run on a slow machine), then none."""

    name = "eager-first"

    def propose(self, space, run, history, facts, k):
        from agent.planner import Proposal

        if any(t.params == {"enforce-eager": True} for t in history):
            return []
        return [Proposal({"enforce-eager": True}, "eager: no compile", "slower"),
                Proposal({"enable-prefix-caching": False}, "no prefix cache: 0.95x here", "slower")]

    def narrow(self, space, history):
        return []


def test_hopeless_configs_are_pruned_told_to_optuna_as_pruned_and_the_run_stays_consistent(tmp_path):
    from agent import recovery

    settings = Settings(model="m", workload="smoke", max_trials=4, facts={"cpus": 2, "concurrency": 1})
    engine = FakeEngine(factors={("enable-prefix-caching", False): 0.95})   # slower, yet above the pruning line
    ledger, run = _run(tmp_path, "rp", engine, settings, planner=EagerFirst())
    repo = gitops.open_repo(tmp_path / "p")
    trials = ledger.trials("rp")
    pruned = [t for t in trials if t.status == "pruned"]
    assert pruned and all(t.params.get("enforce-eager") for t in pruned)   # the fake's 0.8x knob, nothing else
    assert all(t.decision == "pruned" and t.ppl is None and t.search_ratio < 0.9 and "pruned after 3 of 4" in
               t.gate_reasons[0] for t in pruned)
    # Never the defaults' instances, and never a config that is as fast as the defaults.
    assert not any(t.status == "pruned" for t in trials if t.source in ("baseline", "aa", "drift", "extra"))
    assert not any(t.status == "pruned" and not t.params.get("enforce-eager") for t in trials)
    study = optuna.load_study(study_name="rp", storage=f"sqlite:///{tmp_path / 'o.sqlite'}")
    states = {t.number: t for t in study.trials}
    for t in pruned:
        told = states[t.optuna_number]
        assert told.state == optuna.trial.TrialState.PRUNED and told.intermediate_values == {0: t.search_ratio}
    assert recovery.problems(ledger, run, f"sqlite:///{tmp_path / 'o.sqlite'}", repo) == []
    # Measured to the end but no faster than the defaults: quality is not measured, and it says so.
    slower = [t for t in trials if t.decision == "speed-only"]
    assert any(t.params == {"enable-prefix-caching": False} for t in slower)
    assert all(t.status == "ok" and t.ppl is None and t.search_ratio <= 1.0 and "speed only" in t.gate_reasons[0]
               for t in slower)
    assert all(t.ppl is not None for t in trials
               if t.status == "ok" and t.decision != "speed-only" and t.source in ("planner", "sampler"))


def test_gate_rejects_lossy_quality_loss_and_broken_lossless_claims(night):
    ledger, _, _, _, _ = night
    ran = [t for t in ledger.trials("r1") if t.status == "ok" and t.source in ("planner", "sampler")
           and t.decision != "speed-only"]   # quality measured: faster than the defaults
    fp8 = [t for t in ran if str(t.params.get("kv-cache-dtype", "auto")).startswith("fp8")]
    assert fp8 and all(not t.gate_passed and any("perplexity" in r for r in t.gate_reasons) for t in fp8)
    # The fake's block size 128 flips a clear token: a lossless claim it breaks. Sampled points at
    # the engine's default dtypes are lossless claims too (the defaults are read from the engine).
    flipped = [t for t in ran if t.lossless and t.params.get("block-size") == 128]
    assert flipped and any(t.source == "sampler" for t in flipped)
    assert all(not t.gate_passed and any("broken lossless claim" in r for r in t.gate_reasons) for t in flipped)
    branched = [t for t in ran if t.branch]
    assert branched and all(t.heldout_interval[0] > 1 and t.decision == "accepted" for t in branched)


def test_every_accepted_trial_has_a_branch_holding_its_config(night):
    ledger, repo, _, _, _ = night
    accepted = [t for t in ledger.trials("r1") if t.decision == "accepted"]
    assert accepted, "the fake's OMP binding gives 1.5x; the search should find it in 12 seconds"
    assert sorted(t.branch for t in accepted) == gitops.branches(repo)
    assert all(t.branch is None for t in ledger.trials("r1") if t.decision == "dominated")
    for t in accepted:
        config = yaml.safe_load(repo.git.show(f"{t.branch}:serving/config.yaml"))
        assert config == t.flags and repo.commit(t.branch).hexsha == t.commit
        message = repo.commit(t.branch).message
        assert f"trial {t.number}: {t.figure:.2f} tok/s" in message and "Agent-Run: r1" in message
    rejected = [t for t in ledger.trials("r1") if t.gate_passed is False]
    assert all(t.branch is None for t in rejected)


def test_the_repeats_table_holds_every_server_of_a_decision_numbered_by_instance(night):
    ledger, _, _, _, _ = night
    decided = [t for t in ledger.trials("r1") if t.heldout_instances]
    assert decided, "the fake's OMP binding reaches a held-out decision in 12 seconds"
    for t in decided:
        by = {}
        for r in ledger.repeats(t.id):
            by.setdefault(r.instance, []).append(r.figure)
        # instance 0: the trial's own server, its 3 phases; then one entry per fresh held-out server
        assert sorted(by) == list(range(len(t.heldout_instances) + 1)) and len(by[0]) == 3
        assert all(len(by[k]) == 3 for k in by if k > 0)


def test_cli_reads_the_ledger(night, monkeypatch):
    ledger, _, _, tmp_path, _ = night
    monkeypatch.setenv("AGENT_HOME", str(tmp_path))
    from typer.testing import CliRunner

    from agent.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["ledger", "--run", "r1", "--csv"])
    assert result.exit_code == 0 and result.stdout.count("\n") == len(ledger.trials("r1")) + 1
    result = runner.invoke(app, ["ledger", "show", "0", "--run", "r1"])
    assert result.exit_code == 0 and '"source": "baseline"' in result.stdout
    result = runner.invoke(app, ["ledger", "sql", "select count(*) as n from trials where status = 'failed'"])
    assert result.exit_code == 0
    result = runner.invoke(app, ["ledger", "sql", "delete from trials"])
    assert result.exit_code == 2 and "readonly" in result.stderr.replace(" ", "").lower()
    # Cells are data, not Rich markup: brackets print as they are and never crash the table.
    result = runner.invoke(app, ["ledger", "sql", "select '[rank0]: CUDA error' as a, 'path [/usr/lib/x]' as b"])
    assert result.exit_code == 0, result.output
    assert "[rank0]: CUDA error" in result.stdout and "path [/usr/lib/x]" in result.stdout.replace("\n", "")
    result = runner.invoke(app, ["branches", "--run", "r1"])
    assert result.exit_code == 0 and "agent/r1/" in result.stdout
    result = runner.invoke(app, ["report", "--run", "r1"])
    best = max((t for t in ledger.trials("r1") if t.branch), key=lambda t: t.heldout_ratio)
    assert result.exit_code == 0 and "run r1: finished" in result.stdout
    assert ("failures:" in result.stdout) == any(t.status == "failed" for t in ledger.trials("r1"))
    low, high = best.heldout_interval
    assert f"{best.branch}: {best.heldout_ratio:.3f}x held-out [{low:.3f}, {high:.3f}]" in result.stdout
    assert "A/A check: no loss, no gain" in result.stdout and "greedy rule calibrated: tau" in result.stdout


class StopAt(FakeEngine):
    """Raises KeyboardInterrupt (what Ctrl-C and SIGTERM become) on the n-th evaluation."""

    def __init__(self, n):
        super().__init__()
        self.n = n

    def evaluate(self, spec, trial_dir, timeout_s, on_phase=lambda phase: None):
        if self.calls + 1 == self.n:
            raise KeyboardInterrupt
        return super().evaluate(spec, trial_dir, timeout_s, on_phase)


def _run_to_resume(tmp_path, run_id):
    """A run's row with a minute to go, and the ledger, space, repository and study storage a stop and
    its resume share."""
    ledger = Ledger(tmp_path / "ledger.sqlite")
    space = spaces.load("vllm-cpu")
    repo = gitops.open_repo(tmp_path / "p", create=True)
    run = ledger.add(Run(id=run_id, deadline_at=budget.deadline_after(60).isoformat(), model="m",
                         space_path=space.path, space_hash=space.hash, workload="smoke", repo=str(repo.working_dir),
                         settings={"home": str(tmp_path)}))
    return ledger, space, repo, f"sqlite:///{tmp_path / 'o.sqlite'}", run


def test_a_sampler_point_cut_by_a_crash_is_measured_again_after_the_resume(tmp_path):
    """The sampler alone, cut inside its seventh candidate (past TPE's random start-up, so a resumed
    sampler would draw another point): after the repair the same point is measured again, once."""
    from agent import recovery
    from agent.planner import NoPlanner

    ledger, space, repo, storage, run = _run_to_resume(tmp_path, "r8")
    settings = Settings(model="m", workload="smoke", max_trials=9, facts={"cpus": 2, "concurrency": 1})
    class StopInSeventhCandidate(FakeEngine):   # a candidate's own measurement carries its prune threshold
        started = 0

        def evaluate(self, spec, trial_dir, timeout_s, on_phase=lambda phase: None):
            self.started += "prune_below" in spec.get("stop_rules", {})
            if self.started == 7 and "prune_below" in spec.get("stop_rules", {}):
                raise KeyboardInterrupt
            return super().evaluate(spec, trial_dir, timeout_s, on_phase)

    with pytest.raises(KeyboardInterrupt):
        run_search(RunContext(run, settings, space), Seams(ledger, StopInSeventhCandidate(), repo), storage,
                   planner=NoPlanner())
    recovery.repair(ledger, ledger.run("r8"), storage, repo)
    (cut,) = [t for t in ledger.trials("r8") if t.status == "interrupted"]
    assert cut.source == "sampler"
    run_search(RunContext(ledger.update(ledger.run("r8"), status="running"), settings, space),
               Seams(ledger, FakeEngine(), repo), storage, planner=NoPlanner())
    again = [t for t in ledger.trials("r8") if t.params == cut.params and t.number > cut.number]
    assert len(again) == 1 and again[0].status in ("ok", "pruned", "failed") and again[0].source == "sampler"
    assert "cut by a crash" in again[0].rationale
    assert recovery.problems(ledger, ledger.run("r8"), storage, repo) == []


def test_interrupt_ends_the_trial_in_flight_and_stops_cleanly(tmp_path):
    from agent.part import close_interrupted

    ledger = Ledger(tmp_path / "ledger.sqlite")
    space = spaces.load("vllm-cpu")
    run = ledger.add(Run(id="r2", deadline_at=budget.deadline_after(60).isoformat(), model="m",
                         space_path=space.path, space_hash=space.hash, workload="smoke", repo="",
                         settings={"home": str(tmp_path)}))
    with pytest.raises(KeyboardInterrupt):
        run_search(RunContext(run, Settings(model="m", workload="smoke"), space),
                   Seams(ledger, StopAt(3), gitops.open_repo(tmp_path / "p", create=True)),
                   f"sqlite:///{tmp_path / 'o.sqlite'}")
    close_interrupted(ledger, "r2", "stopped")
    statuses = [t.status for t in ledger.trials("r2")]
    assert statuses[-1] == "interrupted" and "running" not in statuses
    assert ledger.run("r2").status == "stopped" and ledger.run("r2").finished_at


def test_a_candidate_interrupted_by_a_stop_is_measured_again_after_the_resume(tmp_path):
    """Stopped inside core binding, the night's best move (the 4th evaluation: two baseline instances,
    the A/A, then the planner's first candidate), then resumed as `agent run --resume` does (repair,
    then the loop again): the interrupted row stays, and the same point is measured under a new
    trial number before the deadline."""
    from agent import recovery

    ledger, space, repo, storage, run = _run_to_resume(tmp_path, "r7")
    settings = Settings(model="m", workload="smoke", max_trials=2, facts={"cpus": 2, "concurrency": 1})
    with pytest.raises(KeyboardInterrupt):
        run_search(RunContext(run, settings, space), Seams(ledger, StopAt(4), repo), storage)
    recovery.repair(ledger, ledger.run("r7"), storage, repo)
    (cut,) = [t for t in ledger.trials("r7") if t.status == "interrupted"]
    assert cut.source == "planner" and list(cut.params) == ["VLLM_CPU_OMP_THREADS_BIND"]
    run_search(RunContext(ledger.update(ledger.run("r7"), status="running"), settings, space),
               Seams(ledger, FakeEngine(), repo), storage)
    again = [t for t in ledger.trials("r7") if t.params == cut.params and t.number > cut.number]
    assert again and again[0].status == "ok" and again[0].source == "planner"
    assert ledger.trial("r7", cut.number).status == "interrupted"   # the row of the cut trial stays
    assert recovery.problems(ledger, ledger.run("r7"), storage, repo) == []


def test_verify_re_measures_a_branch_against_the_defaults(night):
    from agent.verify import Rounds, verify

    ledger, repo, run, tmp_path, _ = night
    best = max((t for t in ledger.trials("r1") if t.branch), key=lambda t: t.heldout_ratio)
    report = verify(ledger, repo, best.branch, FakeEngine(), tmp_path / "verify", Rounds(max_rounds=4),
                    say=lambda m: None)
    # The fake's instances differ by under 1%: a claim it reproduces is decided within the rounds.
    assert report["verdict"] == "holds" and report["rounds"] <= 4 and report["split"] == "heldout"
    assert report["claimed_ratio"] == best.heldout_ratio
    assert report["band"][0] <= report["interval"][0] and report["interval"][1] <= report["band"][1]
    # A claim the branch does not reproduce is called so, not "inside a wide interval".
    class Slower(FakeEngine):   # the branch's binding now costs 30%
        def evaluate(self, spec, trial_dir, timeout_s, on_phase=lambda phase: None):
            result = super().evaluate(spec, trial_dir, timeout_s, on_phase)
            if spec["env"].get("VLLM_CPU_OMP_THREADS_BIND", "auto") != "auto":
                result.bench.tps *= 0.7
            return result

    report = verify(ledger, repo, best.branch, Slower(speculation_heldout=1.1), tmp_path / "verify2",
                    Rounds(max_rounds=4), say=lambda m: None)
    assert report["verdict"] == "does not hold" and report["interval"][1] < report["band"][0]


def test_a_branch_an_older_agent_wrote_still_verifies(night):
    """Branches committed before results.json had a schema (2efafb4, the golden run's as it was then:
    tests/data/results-2efafb4.json), and before the figures were named by unit (tps, tps_ratio, ...):
    `agent verify` reads both through the mapping onto version 1."""
    import json
    from pathlib import Path

    import git

    from agent.verify import Rounds, verify

    ledger, repo, run, tmp_path, _ = night
    best = max((t for t in ledger.trials("r1") if t.branch), key=lambda t: t.heldout_ratio)
    flat = json.loads((Path(__file__).parent / "data" / "results-2efafb4.json").read_text())
    flat.update(run="r1", trial=best.number, flags=best.flags, env=best.env, search_ratio=best.search_ratio,
                heldout_ratio=best.heldout_ratio)
    tps_named = {("tps_ratio" if k == "search_ratio" else "tps" if k == "figure" else k): v for k, v in flat.items()}
    for name, older in (("older-agent", flat), ("oldest-agent", tps_named)):
        tree = tmp_path / name
        repo.git.worktree("add", "-b", name, str(tree), best.branch)
        (tree / "serving" / "results.json").write_text(json.dumps(older, indent=2))
        git.Repo(tree).git.execute(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qam",
                                    "old"])
        report = verify(ledger, repo, name, FakeEngine(), tmp_path / f"verify-{name}",
                        Rounds(max_rounds=4, split="search"), say=lambda m: None)
        assert report["claimed_ratio"] == best.search_ratio and report["verdict"] == "holds", (name, report)
        assert report["unit"] == "tok/s" and len(report["defaults_figures"]) == report["rounds"]


def test_a_malformed_branch_is_one_line_not_a_traceback(night):
    from agent.verify import Rounds, VerifyError, verify

    ledger, repo, run, tmp_path, _ = night
    best = next(t for t in ledger.trials("r1") if t.branch)
    tree = tmp_path / "broken"
    repo.git.worktree("add", "-b", "broken", str(tree), best.branch)
    for text, said in (("{not json", "not JSON"), ('{"trial": 3}', "not a results file this agent reads")):
        (tree / "serving" / "results.json").write_text(text)
        repo.git.execute(["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@example.com", "commit",
                          "-qam", "broken"])
        with pytest.raises(VerifyError) as e:
            verify(ledger, repo, "broken", FakeEngine(), tmp_path / "verify-broken", Rounds(), say=lambda m: None)
        assert said in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_planner_goes_first_builds_on_the_best_and_says_why(night):
    ledger, _, _, _, _ = night
    trials = ledger.trials("r1")
    first = trials[3]
    assert first.source == "planner" and first.params == {"VLLM_CPU_OMP_THREADS_BIND": "0-" + first.params[
        "VLLM_CPU_OMP_THREADS_BIND"].split("-")[1]}
    assert "cores" in first.rationale and first.gate_passed   # the fake gives 1.5x for it
    ngram = next(t for t in trials if t.source == "planner" and "speculative-config.method" in t.params)
    assert ngram.params["VLLM_CPU_OMP_THREADS_BIND"] == first.params["VLLM_CPU_OMP_THREADS_BIND"]
    assert "ngram" in ngram.rationale and f"trial {first.number}" in ngram.rationale
    assert all(t.rationale for t in trials if t.source == "planner")


def _run(tmp_path, run_id, engine, settings, planner=None, ledger=None, hours=1):
    ledger = ledger or Ledger(tmp_path / "ledger.sqlite")
    space = spaces.load("vllm-cpu")
    run = ledger.run(run_id) or ledger.add(Run(
        id=run_id, deadline_at=(datetime.now(UTC) + timedelta(hours=hours)).isoformat(), model="m",
        space_path=space.path, space_hash=space.hash, workload="smoke", repo="", settings={"home": str(tmp_path)}))
    repo = gitops.open_repo(tmp_path / "p", create=True)
    return ledger, run_search(RunContext(run, settings, space), Seams(ledger, engine, repo),
                              f"sqlite:///{tmp_path / 'o.sqlite'}", planner=planner)


def test_max_trials_stops_early_and_a_second_call_goes_on_where_the_first_stopped(tmp_path):
    engine = FakeEngine()
    settings = Settings(model="m", workload="smoke", max_trials=3, facts={"cpus": 2, "concurrency": 1})
    ledger, run = _run(tmp_path, "r3", engine, settings)
    ran = [t for t in ledger.trials("r3") if t.source in ("planner", "sampler") and t.status != "skipped"]
    assert len(ran) == 3 and run.status == "finished"
    calls = engine.calls
    settings.max_trials = 5
    ledger, _ = _run(tmp_path, "r3", engine, settings, ledger=ledger)
    ran = [t for t in ledger.trials("r3") if t.source in ("planner", "sampler") and t.status != "skipped"]
    # The baseline is not measured again, and no point is run twice across the two calls.
    later = engine.specs[calls:]
    assert len(ran) == 5 and not any(s.get("heldout_bench") for s in later)
    assert len([s for s in later if s.get("quality") != "none"]) == 2  # held-out re-checks measure no quality
    assert len({repr(sorted(t.params.items())) for t in ran}) == 5
    # The planner/sampler alternation carries over: the planner had the last trial before the
    # restart, so the sampler has the first one after it (a fresh start would give it to the planner).
    sources = [t.source for t in ran]
    assert sources[:3] == ["planner", "sampler", "planner"] and sources[3] == "sampler", sources


def test_planner_off_leaves_every_trial_to_the_sampler(tmp_path):
    from agent.planner import NoPlanner

    settings = Settings(model="m", workload="smoke", max_trials=4, sampler="random")
    ledger, _ = _run(tmp_path, "r4", FakeEngine(), settings, planner=NoPlanner())
    assert {t.source for t in ledger.trials("r4")} <= {"baseline", "aa", "sampler", "extra"}
    assert not [t for t in ledger.trials("r4") if t.source == "planner"]


def test_one_knob_start_takes_the_samplers_first_points_then_the_sampler_walks_the_space(tmp_path):
    from agent.planner import NoPlanner

    settings = Settings(model="m", workload="smoke", max_trials=6, one_knob_start=True)
    ledger, _ = _run(tmp_path, "r5", FakeEngine(), settings, planner=NoPlanner())
    sampled = [t for t in ledger.trials("r5") if t.source == "sampler"]
    assert len(sampled) >= 6   # points the space's rules exclude are recorded and do not count
    first, later = sampled[:4], sampled[4:]
    assert all(t.rationale == "one knob changed from the engine's defaults" for t in first)
    assert all(len(t.params) == 1 or t.params.get("speculative-config.method") == "ngram" for t in first)
    assert all(t.rationale is None and len(t.params) > 4 for t in later)


class OOMAbove(FakeEngine):
    """Runs out of memory above a max-num-seqs threshold, like a real server with a small KV cache."""

    def evaluate(self, spec, trial_dir, timeout_s, on_phase=lambda phase: None):
        if spec["flags"].get("max-num-seqs", 0) > 40:
            self.calls += 1
            return failed("oom", "fake: OOM")
        return super().evaluate(spec, trial_dir, timeout_s, on_phase)


def test_the_planner_narrows_a_range_after_capacity_failures_and_the_sampler_keeps_to_it(tmp_path):
    settings = Settings(model="m", workload="smoke", max_trials=40, facts={"cpus": 2, "concurrency": 1})
    ledger, _ = _run(tmp_path, "r5", OOMAbove(), settings)
    changes = [c for c in ledger.narrowings("r5") if c.knob == "max-num-seqs"]
    assert changes, "max-num-seqs failed with oom above 40 while smaller values ran"
    assert changes[0].high < 256 and "oom" in changes[0].rationale
    last = changes[-1]
    later = [t for t in ledger.trials("r5") if t.source == "sampler" and t.number > last.after_trial
             and "max-num-seqs" in t.params]
    assert later and all(t.params["max-num-seqs"] <= last.high for t in later)
    # Only knobs that size memory are narrowed: the failure says nothing about the others.
    assert {c.knob for c in ledger.narrowings("r5")} <= {"max-num-seqs", "max-num-batched-tokens"}


class CutAtTheDeadline(FakeEngine):
    """Instances of the defaults take 0.5 s until the third, which runs into the deadline and is ended
    there, as the real worker ends a server past its timeout."""

    def evaluate(self, spec, trial_dir, timeout_s, on_phase=lambda phase: None):
        if self.calls < 2:
            time.sleep(0.5)
            return super().evaluate(spec, trial_dir, timeout_s, on_phase)
        self.calls += 1
        time.sleep(timeout_s)
        return failed("interrupted", "worker received SIGTERM during start", timings={"start_s": timeout_s})


def test_a_budget_that_ends_before_the_baseline_says_so_rather_than_blame_the_defaults(tmp_path):
    settings = Settings(model="m", workload="smoke", facts={"cpus": 2, "concurrency": 1})
    with pytest.raises(BaselineFailed) as e:
        _run(tmp_path, "short", CutAtTheDeadline(), settings, hours=3 / 3600)
    assert "the budget ended while the defaults were measured (2 instance(s) done" in str(e.value)
    assert "need 3 before any candidate; give a longer --budget" in str(e.value)
    assert "the defaults failed" not in str(e.value)


class DeclaredLostMidTrial(FakeEngine):
    """On its first candidate after the defaults, another process declares this one lost: it records the trial
    in flight as
    interrupted and tells Optuna FAIL (as agent.crew.bury does) while the server is still measuring."""

    def __init__(self, ledger_path, storage):
        super().__init__()
        self.ledger_path, self.storage, self.victim = ledger_path, storage, None

    def evaluate(self, spec, trial_dir, timeout_s, on_phase=lambda phase: None):
        other = Ledger(self.ledger_path)
        running = [t for t in other.trials(status="running") if t.source in ("planner", "sampler")]
        if self.victim is None and self.calls >= 4 and running:
            from agent import crew

            row = running[0]
            study = optuna.load_study(study_name=row.run_id, storage=self.storage)
            assert crew.interrupt(other, row, study, None, "its worker fell silent")
            self.victim = row.number
        return super().evaluate(spec, trial_dir, timeout_s, on_phase)


def test_a_result_that_comes_after_the_trial_was_recorded_interrupted_is_dropped(tmp_path):
    """Recorded once: the late result neither turns the interrupted row back to ok nor tells Optuna twice."""
    engine = DeclaredLostMidTrial(tmp_path / "ledger.sqlite", f"sqlite:///{tmp_path / 'o.sqlite'}")
    settings = Settings(model="m", workload="smoke", max_trials=4, facts={"cpus": 2, "concurrency": 1})
    ledger, run = _run(tmp_path, "lost", engine, settings)
    assert run.status == "finished" and engine.victim is not None
    row = ledger.trial("lost", engine.victim)
    assert row.status == "interrupted" and row.figure is None and "fell silent" in row.failure_message
    study = optuna.load_study(study_name="lost", storage=f"sqlite:///{tmp_path / 'o.sqlite'}")
    assert study.trials[row.optuna_number].state == optuna.trial.TrialState.FAIL
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]


def test_the_first_instance_says_what_the_budget_fits(night):
    """Once, after the first instance of the defaults: its cost, the instances still needed before the
    first candidate, and when that candidate and its first decision can be expected."""
    from agent.status import describe

    ledger, _, run, tmp_path, events = night
    plans = [i for e, i in events if e == "plan"]
    assert run.calibration["plan"] == plans[0]   # kept with the run: agent status shows it
    assert sum(line.startswith("  plan: an instance of the defaults took") for line in
               describe(run, ledger.trials("r1"), tmp_path)) == 1
    assert len(plans) == 2 and plans[0]["before_candidate"] == 2   # the second baseline instance and the A/A
    # Once more after the baseline, at the noise its instances measured: what a gain near it takes.
    names = [e for e, _ in events]
    assert plans[1]["before_candidate"] == 0 and names.index("baseline") < len(names) - names[::-1].index("plan") - 1
    assert plans[0]["near_noise"] != plans[1]["near_noise"]   # the space's prior first, then the instances' own
    first_trial = next(i for e, i in events if e == "trial")
    assert names.index("plan") > names.index("trial")
    assert plans[0]["instance_s"] >= 0 and plans[0]["left_s"] <= 12 and first_trial["number"] == 0


@pytest.mark.parametrize("left, fits, tail", [
    (1400, "decision", "; 23 min left"),
    (1000, "candidate", "a first candidate fits, its decision likely not (a --budget of about 23 min would)"),
    (600, "nothing", "no candidate fits (a --budget of about 23 min would reach a first decision)"),
])
def test_the_plan_line_names_what_fits_and_what_budget_would(left, fits, tail):
    from agent.log import plan_line

    first = {"total_s": 280.0, "start_s": 150.0, "warmup_s": 5.0, "benchmark_s": 40.0, "teardown_s": 5.0}
    plan = budget.plan(first, 1, True, left, spent_s=280.0)
    # The second baseline instance (280 s) and the A/A, which measures the held-out prompts too (320 s);
    # then the candidate (280 s) and one held-out instance of it (start, warm-up, benchmark, teardown: 200 s).
    assert plan["fits"] == fits and plan["candidate_in_s"] == 600 and plan["decided_in_s"] == 1080
    line = plan_line(plan)
    assert line.startswith("plan: an instance of the defaults took 5 min here; 2 more before the first "
                           "candidate (in about 10 min), its first decision in about 18 min; ") and line.endswith(tail)
    # A cold first start (the H200's 241 s against 64-133 s warm) makes the plan an upper bound: the
    # hopeful one, with later starts a quarter of it, is what a run must miss before it stops.
    hopeful = budget.plan(first, 1, True, left, 280.0, start_scale=budget.WARM_START)
    assert hopeful["decided_in_s"] == 1080 - 4 * 150 * 0.75


def test_the_plan_line_counts_the_looks_a_gain_near_the_noise_takes():
    """A first decision is one held-out look only for a gain well above the noise; the line says how many
    looks one near it takes (gate.looks_needed) and when that decision would come: each further look one
    held-out instance of the candidate and one of the defaults (200 s each here)."""
    from agent.gate import GateSettings, looks_needed
    from agent.log import plan_line
    from agent.stats import Noise

    first = {"total_s": 280.0, "start_s": 150.0, "warmup_s": 5.0, "benchmark_s": 40.0, "teardown_s": 5.0}
    looks = looks_needed(1.13, Noise(0.058, 6), GateSettings())
    plan = budget.decision_looks(budget.plan(first, 1, True, 3600, spent_s=280.0), first, looks, 1.13, 0.058)
    assert looks == 5 and plan["near_decided_in_s"] == 1080 + 8 * 200
    line = plan_line(plan)
    assert "its first decision in about 18 min (one held-out look: a gain well above the noise)" in line
    assert ("a 1.13x gain at ±5.8% noise takes about 5 held-out instances of the candidate and 4 more of the "
            "defaults (first decision in about 45 min)") in line
    beyond = plan_line(budget.decision_looks(plan, first, None, 1.02, 0.058))
    assert "a 1.02x gain at ±5.8% noise cannot be decided within the held-out instances allowed" in beyond


def test_a_goodput_plan_counts_the_held_out_phase_by_its_rate_points():
    """The shipped trace on 2 cores: 5 rate points on the search split (300 s), 2 on the held-out one.
    The plan of the first instance counts the A/A's held-out phase and the decision's held-out
    instance at 2/5 of the search benchmark; an A/A's own held-out phase counts as measured."""
    first = {"total_s": 418.0, "start_s": 61.0, "warmup_s": 40.0, "benchmark_s": 300.0, "quality_s": 14.0,
             "teardown_s": 2.0}
    whole = budget.plan(first, 1, True, 3600, 418.0, points=5)
    share = budget.plan(first, 1, True, 3600, 418.0, points=5, heldout_share=0.4)
    assert whole["decided_in_s"] - share["decided_in_s"] == 2 * 300 * 0.6   # the A/A's and the decision's
    assert budget.heldout_instance_s(first, 0.4) == 61 + 40 + 2 + 120
    aa = {**first, "heldout_s": 78.0, "total_s": 500.0}
    assert budget.heldout_instance_s(aa) == budget.heldout_instance_s(aa, 0.4) == 61 + 40 + 2 + 78


def test_a_goodput_plan_hopes_for_a_candidate_search_of_two_rate_points():
    """The shipped trace's first instance of the run of 2026-12-04 17:52 (7.3 min, 5 points, 300 s of
    them): 23 minutes left. Counting the candidate as a whole instance of the defaults, warm starts or
    not, no decision fits and the run stopped; a candidate's search decides in two points (core
    binding's took 2.6 min), so the hopeful plan, the one a run must miss before it stops, fits."""
    first = {"total_s": 438.0, "start_s": 61.0, "warmup_s": 40.0, "benchmark_s": 300.0, "quality_s": 35.0,
             "teardown_s": 2.0}
    args = (first, 1, True, 23 * 60, 438.0, 5)
    whole = budget.plan(*args, start_scale=budget.WARM_START, heldout_share=0.4)
    hopeful = budget.plan(*args, start_scale=budget.WARM_START, heldout_share=0.4,
                          candidate_share=budget.CANDIDATE_POINTS / 5)
    assert whole["decided_in_s"] - hopeful["decided_in_s"] == 300 * 3 / 5   # three of the five points
    assert whole["fits"] != "decision" and hopeful["fits"] == "decision"
    assert whole["candidate_in_s"] == hopeful["candidate_in_s"]   # the defaults' cost unchanged


def test_a_budget_too_short_for_a_first_decision_stops_after_the_first_instance(tmp_path):
    """Each instance takes a second here: after the first, a decision needs about four more, and 3 s
    are left. The run says so and stops, instead of measuring the defaults until the deadline."""
    from agent.defaults import BudgetTooShort

    ledger = Ledger(tmp_path / "ledger.sqlite")
    space = spaces.load("vllm-cpu")
    run = ledger.add(Run(id="r5", deadline_at=budget.deadline_after(4).isoformat(), model="m", space_path=space.path,
                         space_hash=space.hash, workload="smoke", repo="", settings={"home": str(tmp_path)}))
    settings = Settings(model="m", workload="smoke", facts={"cpus": 2, "concurrency": 1})
    with pytest.raises(BudgetTooShort, match=r"no candidate fits \(a --budget of about \d+ s would reach a first "
                                             r"decision\); stopped here rather than spend the rest"):
        run_search(RunContext(run, settings, space), Seams(ledger, FakeEngine(delay_s=1.0),
                   gitops.open_repo(tmp_path / "p", create=True)), f"sqlite:///{tmp_path / 'o.sqlite'}")
    assert [t.source for t in ledger.trials("r5")] == ["baseline"] and budget.seconds_left(run.deadline_at) > 1


def test_the_aa_instance_measures_the_held_out_prompts_that_the_first_decision_compares_with(night):
    ledger, _, run, _, _ = night
    trials = ledger.trials("r1")
    baseline, aa = [t for t in trials if t.source == "baseline"], next(t for t in trials if t.source == "aa")
    assert baseline and all(t.heldout_figure is None for t in baseline) and aa.heldout_figure > 0
    first = next(t for t in trials if t.decision == "accepted")
    # Decided at the first look: one fresh instance of the candidate against the A/A's held-out figure,
    # with no instance of the defaults measured for it.
    assert first.heldout_instances and len(first.heldout_instances) == 1
    assert not [t for t in trials if t.source == "extra" and t.number < first.number + 2]


def test_max_trials_does_not_count_a_points_first_cut_by_a_crash_but_counts_the_next():
    from agent.ledger import Trial
    from agent.loop import spent

    def row(status, params, source="planner"):
        return Trial(run_id="r", source=source, status=status, params=params)

    settings = 2   # --max-trials
    bind = {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}
    base = [row("ok", {}, "baseline"), row("skipped", {"block-size": 32})]
    assert not spent(base + [row("interrupted", bind), row("ok", bind)], settings)   # the cut one is free
    assert spent(base + [row("interrupted", bind), row("ok", bind), row("ok", {"max-num-seqs": 8})], settings)
    # Cut twice: the second cut counts, so a run whose trials keep being cut still stops.
    assert spent(base + [row("interrupted", bind), row("interrupted", bind), row("ok", bind)], settings)


@pytest.mark.parametrize("spent, whole, why", [
    (100, 3600, None),                                          # 100 + 120 s of 3600: a tenth
    (1100, 3600, "more than 33% of the budget"),                # 1100 + 120 s: past a third
    (100, 400, "then no first decision would fit the budget"),  # a decision needs about 360 s, 300 left
])
def test_more_instances_of_the_defaults_stop_at_their_share_of_the_budget(spent, whole, why):
    """A noisy host's defaults get more instances while a decision fits after them and the defaults have
    used less than a third of the budget; past it, the candidates keep the rest (DEFAULTS_SHARE)."""
    from agent.defaults import no_more_defaults
    from agent.ledger import Trial

    now = datetime.now(UTC)
    run = Run(id="r", started_at=(now - timedelta(seconds=spent)).isoformat(),
              deadline_at=(now + timedelta(seconds=whole - spent)).isoformat())
    aa = Trial(timings={"start_s": 30, "warmup_s": 10, "benchmark_s": 60, "heldout_s": 30, "quality_s": 15,
                        "teardown_s": 5, "total_s": 150})   # an instance without its held-out phase: 120 s
    found = no_more_defaults(run, aa)
    assert found is None if why is None else why in found


def test_an_extra_instance_of_the_defaults_is_timed_by_the_warm_ones_not_the_cold_first():
    """The H200's run of 2026-12-04: a cold first start of 213 s stood for an extra instance (247 s)
    and refused a third held-out look with 184 s left, where the warm instances took 84-104 s."""
    from agent.judging import defaults_like
    from agent.ledger import Trial

    def instance(number, source, start_s, **more):
        return Trial(number=number, source=source, status="ok", timings={"start_s": start_s, "warmup_s": 5,
                     "benchmark_s": 26, "teardown_s": 3, **more})

    cold, warm, aa = instance(0, "baseline", 213), instance(1, "baseline", 68), instance(2, "aa", 53, heldout_s=25)
    assert defaults_like([cold, warm, aa]) is warm and budget.heldout_instance_s(warm.timings) == 102
    assert defaults_like([cold]) is cold


def test_under_goodput_every_search_after_the_defaults_first_starts_at_their_figure_so_far(tmp_path):
    """The defaults' first instance brackets from the profile's rate; every later instance of them, and
    every candidate, starts at the defaults' goodput so far (their figures' geometric mean), and a
    held-out instance at its config's own search figure: the same search for all but the first."""
    import math

    engine = FakeEngine()
    settings = Settings(model="m", workload="trace-cpu", max_trials=3, facts={"cpus": 2, "concurrency": 1})
    ledger, _ = _run(tmp_path, "gs", engine, settings)
    trials = {t.number: t for t in ledger.trials("gs")}
    searched = [s for s in engine.specs if load_split(s) == "search"]
    start = {i: s.get("stop_rules", {}).get("goodput_start") for i, s in enumerate(engine.specs)}
    assert "stop_rules" not in searched[0] and all(start[i] for i in range(1, len(engine.specs)))
    defaults = [t.figure for t in ledger.trials("gs") if t.source in ("baseline", "aa")]
    assert len(defaults) == 3 and len(searched) > 3
    for i, spec in enumerate(searched[1:3], start=1):   # the second baseline instance, then the A/A
        assert math.isclose(spec["stop_rules"]["goodput_start"], math.exp(sum(map(math.log, defaults[:i])) / i),
                            rel_tol=1e-5)
    assert all(math.isclose(s["stop_rules"]["goodput_start"], math.exp(sum(map(math.log, defaults)) / 3), rel_tol=1e-5)
               for s in searched[3:])   # candidates (no drift or extra instance of the defaults here)
    heldout = [s for s in engine.specs if load_split(s) == "heldout"]   # the candidates' held-out instances
    config = lambda s: repr((s["flags"], s["env"]))  # noqa: E731
    own = {config(vars(t)): t.figure for t in trials.values() if t.source in ("planner", "sampler") and t.figure}
    assert len(heldout) >= 2 and all(s["stop_rules"]["goodput_start"] == own[config(s)] for s in heldout)
    assert not any(t.source == "extra" for t in trials.values())


def load_split(spec: dict) -> str:
    from sandbox.workload import load_workload

    return load_workload(spec["workload"]).prompt_split


def test_a_planners_range_outside_its_knob_is_refused_said_and_never_applied(tmp_path):
    """A planner's narrowed range is data like its proposals: one outside the knob's own range (or for a
    knob that is not numeric) is refused with its reason, not recorded, and the sampler keeps the whole
    range."""
    from agent.planner import Narrowing, NoPlanner

    class Wide(NoPlanner):
        name = "wide"

        def narrow(self, space, history):
            return [Narrowing("max-num-seqs", 1, 10**9, "wider than the knob"),
                    Narrowing("enforce-eager", 0, 1, "not a numeric knob")]

    ledger = Ledger(tmp_path / "ledger.sqlite")
    space = spaces.load("vllm-cpu")
    run = ledger.add(Run(id="n", deadline_at=(datetime.now(UTC) + timedelta(hours=1)).isoformat(), model="m",
                         space_path=space.path, space_hash=space.hash, workload="smoke", repo="",
                         settings={"home": str(tmp_path)}))
    events = []
    settings = Settings(model="m", workload="smoke", max_trials=3, facts={"cpus": 2, "concurrency": 1})
    run_search(RunContext(run, settings, space),
               Seams(ledger, FakeEngine(), gitops.open_repo(tmp_path / "p", create=True),
                     lambda e, **i: events.append((e, i))),
               f"sqlite:///{tmp_path / 'o.sqlite'}", planner=Wide())
    refused = [i["reason"] for e, i in events if e == "narrow_refused"]
    assert refused and any("[1, 1000000000] is not inside max-num-seqs's range" in r for r in refused), refused
    assert any("'enforce-eager' is not a numeric knob" in r for r in refused), refused
    assert ledger.narrowings("n") == [] and not [e for e, _ in events if e == "narrow"]


def test_every_trial_line_after_the_first_branch_names_the_best_so_far_drift_checks_too(night):
    """A drift check's line read "no accepted config yet" after a branch had been committed (the README's
    run of 2026-12-07, trial 18): the defaults' instances said best=None whatever the night held."""
    ledger, _, _, _, events = night
    first = min(t.number for t in ledger.trials("r1") if t.branch)
    later = [info for e, info in events if e == "trial" and info["number"] > first]
    drifts = [info for info in later if info["source"] == "drift"]
    assert drifts and all(info["best"] for info in later)
