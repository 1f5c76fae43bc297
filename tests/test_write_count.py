"""How many write transactions the ledger takes per candidate, by what became of it: the figure a
change to how trials are written (issue 46: typed states, one transition) is held to. Counted on
the ledger's own engine (Optuna's study is another database), a seeded run on the test engine."""

from datetime import UTC, datetime, timedelta

import pytest
from fake_engine import FakeEngine
from sqlalchemy import event

from agent import gitops, loop
from agent import space as spaces
from agent.context import RunContext, Seams, Settings
from agent.ledger import Ledger, Run

# Transactions from a candidate's row being opened to its decision written, at most. Before issue 46
# (2026-12-06): refused 4, failed 3, dominated 7, accepted 7; now 3, 3, 6, 6: a result's figures and
# the phases behind them are one transaction (a crash between the two left a row without its phases).
# A refused candidate: opened, its result recorded, its gate's verdict. A pass adds the held-out
# instances' phases, its decision, and the branch's name.
pytestmark = pytest.mark.slow   # nights of the loop on the wall clock (tests/conftest.py: not in `pytest -m unit`)

MOST = {"refused": 3, "failed": 3, "dominated": 6, "accepted": 6}


def test_the_ledger_writes_per_candidate_do_not_grow(tmp_path, monkeypatch):
    ledger = Ledger(tmp_path / "l.sqlite")
    commits = []
    event.listen(ledger.engine, "commit", lambda conn: commits.append(1))
    counted = []
    judge = loop.judge_candidate

    def counting(ctx, seams, row, *args, **kwargs):
        before = len(commits) - 1   # the row's opening, just before
        row = judge(ctx, seams, row, *args, **kwargs)
        counted.append((row.decision, len(commits) - before))
        return row

    monkeypatch.setattr(loop, "judge_candidate", counting)
    space = spaces.load("vllm-cpu")
    run = ledger.add(Run(id="c", deadline_at=(datetime.now(UTC) + timedelta(hours=1)).isoformat(),
                         model="m", space_path=space.path, space_hash=space.hash, workload="smoke", repo="",
                         settings={"home": str(tmp_path)}))
    loop.run_search(RunContext(run, Settings(model="m", workload="smoke", max_trials=12), space),
                    Seams(ledger, FakeEngine(), gitops.open_repo(tmp_path / "p", create=True)),
                    f"sqlite:///{tmp_path / 'o.sqlite'}")
    seen = {decision for decision, _ in counted}
    assert {"refused", "accepted", "dominated"} <= seen, counted
    for decision, n in counted:
        assert decision in MOST, f"a {decision!r} candidate: no count recorded for it yet ({counted})"
        assert n <= MOST[decision], (decision, n, counted)
