"""The one seam to Optuna: the run's study with its sampler, and what each trial is told.

Optuna learns three things from a finished trial: its value, its state and its constraint (0:
feasible, 1: failed or lost quality). TPE stores the constraint when the trial is told, through
the sampler's constraints function; a trial told without one ranks below every other trial, and
a pruned trial without an intermediate value below every other pruned one. So every tell goes
through `tell` here, with the value and the constraint its ledger row holds (`told`), whichever
process tells it: the loop after measuring, a worker stopped between its record and its tell
(`recorded` and `tell_row`), or a resume after a crash.
"""

from __future__ import annotations

import warnings

import optuna

from agent import states
from agent.ledger import Trial
from agent.points import Point
from agent.states import Source, Status

# multivariate/group/constraints TPE are marked experimental; they are what this loop needs.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
optuna.logging.set_verbosity(optuna.logging.WARNING)

STARTUP_TRIALS = 4  # TPE's random start-up points, taken by one-knob changes from the defaults instead
State = optuna.trial.TrialState
Study = optuna.Study
StorageError = optuna.exceptions.StorageInternalError


def sampler(seed: int, kind: str = "tpe") -> optuna.samplers.BaseSampler:
    """The run's sampler; a finished trial's constraint is read from the user attribute `tell` sets
    (`recorded` reads the ledger's column instead: both are the one value computed per trial)."""
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    # Failures are told as infeasible through the constraint, so TPE learns which regions do not run.
    # A narrowed knob is sampled on its own (Optuna's documented fallback), hence no warning for it.
    # constant_liar: with several workers, the points in flight count as bad ones, so two workers are
    # not sent to the same place (with one worker nothing is in flight when it asks).
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, n_startup_trials=STARTUP_TRIALS,
                                      warn_independent_sampling=False, constant_liar=True,
                                      constraints_func=lambda t: t.user_attrs.get("constraint", [1.0]))


def open(run_id: str, storage, seed: int, kind: str = "tpe") -> optuna.Study:
    """The run's study, created by the first process that asks (the others load it)."""
    for _ in range(3):
        try:
            return optuna.create_study(study_name=run_id, storage=storage, direction="maximize",
                                       load_if_exists=True, sampler=sampler(seed, kind))
        except optuna.exceptions.DuplicatedStudyError:   # created by another worker in the same instant
            continue
    return optuna.load_study(study_name=run_id, storage=storage, sampler=sampler(seed, kind))


def recorded(run_id: str, storage, rows: list[Trial]) -> optuna.Study | None:
    """The run's study loaded to tell finished ledger rows what they recorded: the sampler reads each
    trial's constraint from its row. None when the study is missing (a ledger copied without it)."""
    by_number = {t.optuna_number: t for t in rows if t.optuna_number is not None}

    def constraints(ft: optuna.trial.FrozenTrial) -> list[float]:
        row = by_number.get(ft.number)
        return [row.constraint if row is not None and row.constraint is not None
                else ft.user_attrs.get("constraint", [1.0])[0]]

    try:
        return optuna.load_study(study_name=run_id, storage=storage,
                                 sampler=optuna.samplers.TPESampler(constraints_func=constraints))
    except KeyError:
        return None


def read(run_id: str, storage) -> optuna.Study | None:
    """The run's study for reading (`agent doctor`, the HTML report); None when it is missing (a
    ledger copied without it)."""
    try:
        return optuna.load_study(study_name=run_id, storage=storage)
    except KeyError:
        return None


def expected_state(status: str) -> State:
    """The state a finished ledger row's Optuna trial must be in once told."""
    return State.PRUNED if status == "pruned" else State.COMPLETE


def importances(study: optuna.Study) -> dict[str, float]:
    """How much each knob moved the value, by Optuna's PED-ANOVA evaluator (ValueError or
    RuntimeError while too few trials are finished)."""
    return optuna.importance.get_param_importances(study, evaluator=optuna.importance.PedAnovaImportanceEvaluator())


def told(row: Trial) -> tuple[float, float]:
    """What Optuna is told of a finished trial: (value, constraint), both from its ledger row."""
    value = row.claimed_ratio if row.status in (Status.OK, Status.PRUNED) else 0.0
    return value, row.constraint if row.constraint is not None else 1.0


def tell(study: optuna.Study, trial: optuna.Trial, value: float, constraint: float, pruned: bool = False) -> None:
    """A pruned trial is told as Optuna's PRUNED, its partial ratio reported as its last value."""
    trial.set_user_attr("constraint", [constraint])
    if pruned:
        trial.report(value, step=0)
        study.tell(trial, state=State.PRUNED)
    else:
        study.tell(trial, value)


def tell_row(study: optuna.Study, number: int, row: Trial) -> None:
    """Tell Optuna trial `number` what a finished ledger row says, as the loop would have."""
    # A trial asked by another process is reached by its id; Study has no public way from a number.
    trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
    tell(study, optuna.trial.Trial(study, trial_id), *told(row), pruned=row.status == Status.PRUNED)


def fail(study: optuna.Study, number: int) -> bool:
    """Tell a trial FAIL (its process is gone); False when it was told already."""
    try:
        study.tell(number, state=State.FAIL)
        return True
    except (ValueError, RuntimeError, optuna.exceptions.UpdateFinishedTrialError):
        return False


def running(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(State.RUNNING,))


def waiting(study: optuna.Study) -> bool:
    return bool(study.get_trials(deepcopy=False, states=(State.WAITING,)))


def enqueue(study: optuna.Study, proposals: list) -> None:
    for p in proposals:
        study.enqueue_trial(p.params, user_attrs={"source": Source.PLANNER, "rationale": p.rationale,
                                                  "expected": p.expected, "knobs": list(p.params)})


def told_so_far(study: optuna.Study, sampler_per_planner: int) -> tuple[dict[Point, tuple[float, float]], int]:
    """What the study already knows, so a resumed or repeated call goes on where the last one stopped.

    Returns each told point's (value, constraint) and how many sampler trials followed the last
    planner trial (the planner goes first when there is none).
    """
    done = study.get_trials(deepcopy=False, states=(State.COMPLETE, State.PRUNED))
    seen = {Point.of(t.params): (t.value if t.value is not None else t.intermediate_values.get(0, 0.0),
                                             (t.user_attrs.get("constraint") or
                                              t.system_attrs.get("constraints") or [1.0])[0]) for t in done}
    since = 0
    for t in reversed(done):
        if t.user_attrs.get("source") == Source.PLANNER:
            return seen, since
        since += 1
    return seen, sampler_per_planner


def disagreements(study: optuna.Study, rows: list[Trial]) -> list[str]:
    """Where the study does not hold what the ledger's candidate rows say it was told (state, value,
    constraint), or lacks a trial a row names. The ledger is the record: each is a reason to
    rebuild the study from it."""
    told_now = {ft.number: ft for ft in study.get_trials(deepcopy=False)}
    out = []
    for row in rows:
        if row.optuna_number is None:
            continue
        ft = told_now.get(row.optuna_number)
        if ft is None:
            out.append(f"trial {row.number}: Optuna trial {row.optuna_number} is not in the study")
        elif why := _differs(ft, row):
            out.append(f"trial {row.number}: {why}")
    return out


def _differs(ft: optuna.trial.FrozenTrial, row: Trial) -> str | None:
    if row.status not in states.FINISHED:
        return None   # in flight, or interrupted (told FAIL by whoever noticed)
    if ft.state != expected_state(row.status):
        return f"{row.status} in the ledger but {ft.state.name} in the study"
    value, constraint = told(row)
    got = ft.value if ft.state == State.COMPLETE else ft.intermediate_values.get(0)
    held = (ft.system_attrs.get("constraints") or [None])[0]
    # A worker's candidate is told its search ratio; the coordinator's held-out decision comes later.
    if got is None or min(abs(got - v) for v in (value, row.search_ratio or value)) > 1e-9 or held != constraint:
        return f"the study holds {got} (constraint {held}), the ledger {value} ({constraint})"
    return None


def rebuild(run_id: str, storage, rows: list[Trial], distributions: dict) -> optuna.Study:
    """The run's study made again from the ledger, each trial under its number: one that agrees with
    its row (or that no row holds: a repeat answered from an earlier point) as the old study had it,
    one that does not told what its row says (`told`), a point still waiting enqueued again, and
    the rest FAIL. A param keeps the distribution it was drawn from where the old study has it,
    else the space's (`distributions`)."""
    old = read(run_id, storage)
    before = {ft.number: ft for ft in old.get_trials(deepcopy=True)} if old is not None else {}
    if old is not None:
        optuna.delete_study(study_name=run_id, storage=storage)
    study = optuna.create_study(study_name=run_id, storage=storage, direction="maximize")
    by_number = {t.optuna_number: t for t in rows if t.optuna_number is not None}
    for n in range(max([*by_number, *before], default=-1) + 1):
        row, ft = by_number.get(n), before.get(n)
        if ft is not None and ft.state == State.WAITING:
            study.enqueue_trial(ft.params, user_attrs=ft.user_attrs)
        elif ft is not None and ft.state.is_finished() and (row is None or not _differs(ft, row)):
            study.add_trial(ft)
        elif row is not None and row.status in states.FINISHED:
            study.add_trial(_from_row(row, ft, distributions))
        else:
            study.add_trial(optuna.trial.create_trial(state=State.FAIL))
    return study


def _from_row(row: Trial, ft: optuna.trial.FrozenTrial | None, distributions: dict) -> optuna.trial.FrozenTrial:
    value, constraint = told(row)
    known = {**distributions, **(ft.distributions if ft is not None else {})}
    params = {k: v for k, v in row.params.items() if k in known and _fits(known[k], v)}
    pruned = row.status == states.Status.PRUNED
    return optuna.trial.create_trial(
        state=State.PRUNED if pruned else State.COMPLETE, value=None if pruned else value,
        intermediate_values={0: value} if pruned else None, params=params,
        distributions={k: known[k] for k in params}, system_attrs={"constraints": [constraint]},
        user_attrs={**(ft.user_attrs if ft is not None else {"source": row.source}), "constraint": [constraint]})


def _fits(distribution: optuna.distributions.BaseDistribution, value) -> bool:
    try:
        return distribution._contains(distribution.to_internal_repr(value))
    except (ValueError, TypeError):
        return False
