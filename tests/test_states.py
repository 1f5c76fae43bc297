"""A trial's writes go along its lifecycle (agent.states): a move the lifecycle does not allow, or a
field that is not a column, is an error at the write instead of a row that silently says otherwise."""

import pytest

from agent import states
from agent.ledger import Ledger, Run, Trial
from agent.states import Decision, Source, Status


@pytest.fixture
def ledger(tmp_path):
    ledger = Ledger(tmp_path / "l.sqlite")
    ledger.add(Run(id="r", deadline_at="2099-01-01T00:00:00+00:00", model="m", space_path="s", space_hash="h",
                   workload="w", repo=""))
    return ledger


def trial(ledger, source=Source.PLANNER):
    return ledger.add_trial(Trial(run_id="r", source=source, params={}))


def test_a_trial_moves_along_its_lifecycle_and_reads_back_as_the_strings_old_ledgers_hold(ledger):
    row = trial(ledger)
    ledger.transition(row, status=Status.OK, figure=10.0)
    ledger.transition(row, decision=Decision.AWAITING_RECHECK)
    ledger.transition(row, decision=Decision.ACCEPTED, branch="agent/r/0")
    (back,) = Ledger(ledger.path).trials("r")
    assert (back.status, back.decision, back.source, back.figure) == ("ok", "accepted", "planner", 10.0)
    assert type(back.status) is str   # stored as the plain string: users' SQL and old readers see no change


@pytest.mark.parametrize("first, then, field", [
    ({"status": "ok"}, {"status": "running"}, "status"),            # a finished trial never runs again
    ({"status": "failed"}, {"status": "ok"}, "status"),
    ({"status": "ok", "decision": "accepted"}, {"decision": "refused"}, "decision"),
    ({"status": "ok", "decision": "refused"}, {"decision": "accepted"}, "decision"),
    ({"status": "ok"}, {"decision": "acepted"}, "decision"),        # not a decision at all
])
def test_a_move_the_lifecycle_does_not_allow_is_refused_and_nothing_is_written(ledger, first, then, field):
    row = trial(ledger)
    ledger.transition(row, **first)
    with pytest.raises(ValueError, match=field if "acepted" not in str(then) else "acepted"):
        ledger.transition(row, **then)
    (back,) = Ledger(ledger.path).trials("r")
    assert getattr(back, field) == first.get(field)


def test_a_misspelt_field_is_an_error_not_a_value_never_saved(ledger):
    row = trial(ledger)
    with pytest.raises(ValueError, match="no column 'heldout_ratoi'"):
        ledger.transition(row, status="ok", heldout_ratoi=1.2)
    assert Ledger(ledger.path).trials("r")[0].status == "running"
    with pytest.raises(ValueError, match="no column 'baseline_tsp'"):
        ledger.update(ledger.run("r"), baseline_tsp=1.0)
    with pytest.raises(TypeError, match="transition"):
        ledger.update(row, status="ok")


def test_the_source_groups_cover_every_source_once():
    assert states.CANDIDATES == {"planner", "sampler"}
    assert states.DEFAULTS == {"baseline", "aa", "drift", "extra", "device"}
    assert states.DEFAULTS_ON_SEARCH == {"baseline", "aa", "drift", "device"}
    assert states.candidate(Trial(source="sampler")) and states.of_defaults(Trial(source="drift"))
