"""A trial's writes go along its lifecycle (agent.states): a move the lifecycle does not allow, or a
field that is not a column, is an error at the write instead of a row that silently says otherwise."""

import ast
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy.exc import StatementError

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
    assert (back.status, back.decision, back.source, back.figure) == (Status.OK, Decision.ACCEPTED, Source.PLANNER,
                                                                      10.0)
    assert isinstance(back.status, Status) and isinstance(back.decision, Decision)   # read back as its kind
    # stored as the plain string: users' SQL and old readers see no change
    raw = sqlite3.connect(ledger.path).execute("SELECT status, decision, source FROM trials").fetchall()
    assert raw == [("ok", "accepted", "planner")] and type(raw[0][0]) is str


def test_a_string_no_member_has_is_refused_at_the_write_and_nothing_is_written(ledger):
    row = trial(ledger)
    with pytest.raises(StatementError, match="oom_killer"):
        ledger.transition(row, status=Status.FAILED, failure_class="oom_killer")   # as an untyped caller could
    assert Ledger(ledger.path).trials("r")[0].status == Status.RUNNING
    with pytest.raises(StatementError, match="chief"):
        ledger.add(Trial(run_id="r", number=7, source="chief", params={}))
    assert [t.number for t in Ledger(ledger.path).trials("r")] == [0]


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


STATE_FIELDS = {"status", "decision", "failure_class", "source", "role"}
NOT_STATES = {"llm_planner.py": {"role"}}   # a chat message's role, not a worker's
AGENT = Path(__file__).parent.parent / "agent"


def literal_states(tree: ast.AST) -> list[tuple[int, str]]:
    """Where a string literal is given as a state: a keyword argument named for a state column, or a
    dict entry with such a key, whose value is (or may be, through `a if c else b`) a string constant."""
    def strings(node: ast.AST) -> bool:
        if isinstance(node, ast.IfExp):
            return strings(node.body) or strings(node.orelse)
        return isinstance(node, ast.Constant) and isinstance(node.value, str)

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            found += [(node.lineno, k.arg) for k in node.keywords if k.arg in STATE_FIELDS and strings(k.value)]
        if isinstance(node, ast.Dict):
            found += [(node.lineno, k.value) for k, v in zip(node.keys, node.values, strict=True)
                      if isinstance(k, ast.Constant) and k.value in STATE_FIELDS and strings(v)]
    return found


def test_no_state_is_written_as_a_string_literal_anywhere_in_the_agent():
    assert literal_states(ast.parse('ledger.transition(row, decision="accepted" if ok else Decision.REFUSED)'))
    assert literal_states(ast.parse('ledger.claim(Worker, 1, {"status": "running"}, note="x")'))
    assert not literal_states(ast.parse('ledger.claim(Worker, 1, {"status": Status.RUNNING}, status=Status.OK)'))
    found = {f"{path.name}:{line} {field}": None for path in sorted(AGENT.glob("*.py"))
             for line, field in literal_states(ast.parse(path.read_text()))
             if field not in NOT_STATES.get(path.name, set())}
    assert not found, sorted(found)


def test_a_result_whose_failure_class_no_member_has_is_recorded_as_a_worker_error_naming_it(ledger):
    from agent.recording import record
    from sandbox.result import Failure, TrialResult

    row = trial(ledger)
    result = TrialResult(status="failed", failure=Failure("gpu_melted", "the card is gone", "tail"), workload={})
    record(ledger, row, result)
    (back,) = Ledger(ledger.path).trials("r")
    assert (back.status, back.failure_class) == (Status.FAILED, "worker_error")
    assert back.failure_message == "(failure class gpu_melted) the card is gone"
