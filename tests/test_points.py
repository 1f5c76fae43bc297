"""One point type: the loop, the study and the planner key on agent.points.Point, and the rule for
points a crash cut is written once."""

from pathlib import Path
from types import SimpleNamespace

import optuna

from agent import points
from agent import study as studies
from agent.points import Point

ROOT = Path(__file__).resolve().parents[1]


def row(params: dict, status: str = "ok", number: int = 0):
    return SimpleNamespace(params=params, status=status, number=number)


def test_a_point_is_its_knobs_and_values_in_any_order():
    assert Point.of({"a": 1, "b": "x"}) == Point.of({"b": "x", "a": 1})
    assert Point.of({"a": 1}) != Point.of({"a": 2}) and Point.of({"a": 1}) != Point.of({"a": 1, "b": 1})
    assert Point.of(None) == Point.of({}) == Point.of_row(row({}))


def test_a_point_cut_once_is_not_tried_and_does_not_count_cut_twice_it_is_and_does():
    once, twice, ran = {"k": 1}, {"k": 2}, {"k": 3}
    history = [row(once, "interrupted"), row(twice, "interrupted"), row(twice, "interrupted"), row(ran, "failed")]
    assert points.tried(history) == {Point.of(twice), Point.of(ran)}
    assert points.counted(history) == 2            # the failed one and the second cut
    assert points.counted([*history, row(once, "ok")]) == 3


def test_the_study_says_what_it_knows_by_point():
    study = optuna.create_study(direction="maximize")
    study.enqueue_trial({"x": 1})
    trial = study.ask({"x": optuna.distributions.IntDistribution(0, 4)})
    study.tell(trial, 2.5)
    seen, _ = studies.told_so_far(study, 1)
    assert list(seen) == [Point.of({"x": 1})] and seen[Point.of({"x": 1})][0] == 2.5


def test_no_module_keys_a_point_by_hand():
    """Every key of a point goes through Point: no `repr(sorted(...))` of params left in the agent."""
    found = [f"{p.name}:{n}" for p in sorted((ROOT / "agent").glob("*.py")) if p.name != "points.py"
             for n, line in enumerate(p.read_text().splitlines(), 1) if "repr(sorted(" in line]
    assert found == []
