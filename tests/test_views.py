"""Planners and reports get frozen copies of the run and its trials (agent.views): a reader that writes
to what it was handed fails at once, and nothing it changes inside a copied value reaches the ledger's rows."""

from dataclasses import FrozenInstanceError
from datetime import UTC

import pytest

from agent import views
from agent.ledger import Ledger, Run, Trial


def test_a_view_reads_as_the_row_and_cannot_write_it(tmp_path):
    ledger = Ledger(tmp_path / "l.sqlite")
    ledger.add(Run(id="r", deadline_at="2099-01-01T00:00:00+00:00", model="m", space_path="s", space_hash="h",
                   workload="w", repo=""))
    row = ledger.add_trial(Trial(run_id="r", source="baseline", params={"max-num-seqs": 8}))
    ledger.transition(row, status="ok", figure=10.0, measured={"ttft_ms": {"p99": 5.0}}, greedy=[[1]])
    ledger.add_trial(Trial(run_id="r", source="planner", params={}))
    base, cand = views.trials(ledger.history("r", whole={"baseline"}))
    assert (base.status, base.figure, base.params) == ("ok", 10.0, {"max-num-seqs": 8})
    assert not hasattr(base, "greedy") and not hasattr(cand, "top_logprobs")   # the gate's bulk: not a planner's
    with pytest.raises(FrozenInstanceError):
        base.status = "failed"
    base.params["max-num-seqs"] = 512
    base.measured["ttft_ms"]["p99"] = 0.0
    (again, _) = ledger.trials("r")
    assert again.params == {"max-num-seqs": 8} and again.measured == {"ttft_ms": {"p99": 5.0}}
    assert views.run(ledger.run("r")).id == "r"


def test_the_loop_hands_its_planner_views(tmp_path):
    from datetime import datetime, timedelta

    from fake_engine import FakeEngine

    from agent import gitops
    from agent import space as spaces
    from agent.context import RunContext, Seams, Settings
    from agent.loop import run_search
    from agent.planner import BuiltinPlanner

    handed = []

    class Recording(BuiltinPlanner):
        def propose(self, space, run, history, facts, k):
            handed.append((type(run).__name__, {type(t).__name__ for t in history}))
            return super().propose(space, run, history, facts, k)

    ledger, space = Ledger(tmp_path / "l.sqlite"), spaces.load("vllm-cpu")
    run = ledger.add(Run(id="x", deadline_at=(datetime.now(UTC) + timedelta(hours=1)).isoformat(), model="m",
                         space_path=space.path, space_hash=space.hash, workload="smoke", repo="",
                         settings={"home": str(tmp_path)}))
    run_search(RunContext(run, Settings(model="m", workload="smoke", max_trials=3), space),
               Seams(ledger, FakeEngine(), gitops.open_repo(tmp_path / "p", create=True)),
               f"sqlite:///{tmp_path / 'o.sqlite'}", planner=Recording())
    assert handed and all(kind == ("RunView", {"TrialView"}) for kind in handed), handed


def test_the_reports_read_views_and_a_view_derives_the_claim_as_its_row_does(tmp_path, monkeypatch):
    from agent import report_text, status

    ledger = Ledger(tmp_path / "l.sqlite")
    run = ledger.add(Run(id="r", deadline_at="2099-01-01T00:00:00+00:00", model="m", space_path="s", space_hash="h",
                         workload="w", repo="", settings={"home": str(tmp_path)}, baseline_figure=10.0, noise=0.02,
                         noise_df=4))
    row = ledger.add_trial(Trial(run_id="r", source="planner", params={}))
    ledger.transition(row, status="ok", figure=12.0, search_ratio=1.2, heldout_ratio=1.1, heldout_interval=[1.05, 1.2],
                      branch="agent/r/0", ppl_change=0.0)
    (view,) = views.trials(ledger.trials("r"))
    assert (view.claimed_ratio, view.held_out_claim) == (row.claimed_ratio, row.held_out_claim) == \
        (1.1, "1.100x held-out [1.050, 1.200]")
    seen = []
    real = status.describe
    monkeypatch.setattr(status, "describe",
                        lambda run, trials, *a, **k: seen.append((run, trials)) or real(run, trials, *a, **k))
    assert any("agent/r/0" in line for line in status.status(ledger, run, tmp_path))
    assert [type(x).__name__ for x in (seen[0][0], *seen[0][1])] == ["RunView", "TrialView"]
    assert any("1.100x held-out" in line for line in report_text.summary(*views.of_run(ledger, "r")))


@pytest.mark.parametrize("view, row", [(views.TrialView, Trial), (views.RunView, Run)])
def test_a_view_has_each_column_of_its_table_with_the_columns_type_less_the_gates_bulk(view, row):
    from dataclasses import fields

    columns = {c: row.__annotations__[c].removeprefix("Mapped[")[:-1] for c in row.__table__.columns.keys()
               if c not in views.BULK}
    assert {f.name: f.type for f in fields(view)} == columns
    assert [f.name for f in fields(view)] == list(columns)   # in the table's order


def test_a_trial_write_names_only_trial_columns_each_with_the_columns_type():
    """TrialWrite repeats the trial columns a write may give (a TypedDict cannot be derived for mypy):
    held here to the ORM, as the views are, so the three lists cannot drift apart."""
    from typing import get_type_hints

    from agent.ledger import TrialWrite

    columns = {c: Trial.__annotations__[c].removeprefix("Mapped[")[:-1] for c in Trial.__table__.columns.keys()}
    written = {name: getattr(hint, "__forward_arg__", hint) for name, hint in TrialWrite.__annotations__.items()}
    assert set(written) <= set(columns)
    assert {n: columns[n] for n in written} == written
    opened = {"id", "run_id", "number", "source", "optuna_number", "params", "flags", "env", "worker_id",
              "started_at", "rationale"}   # written when the row is opened
    assert set(columns) - set(written) == opened | {"branch", "commit"}   # these through Ledger.set_branch only
    assert get_type_hints(TrialWrite)   # its annotations resolve
