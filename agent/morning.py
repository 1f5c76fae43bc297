"""What the morning reads from branches: each branch's serving/results.json through the typed model
(agent.results_file), as JSON for scripts (`agent branches --json`) and as a diff against the defaults
(`agent branches --diff`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import git

from agent import gitops, results_file
from agent.ledger import Ledger, Run
from agent.states import Source


class BranchError(ValueError):
    pass


def run_of(ledger: Ledger, branch: str) -> Run:
    parts = branch.split("/")
    row = ledger.run(parts[1]) if len(parts) == 3 and parts[0] == "agent" else None
    if row is None:
        raise BranchError(f"{branch!r} is not a branch agent/<run-id>/<trial> of a run in the ledger")
    return row


def read(repo: git.Repo, branch: str) -> results_file.Results:
    """A branch's results, of any version this agent wrote; BranchError in one line otherwise."""
    where = f"{branch}:serving/results.json"
    try:
        text = repo.git.show(where)
    except git.GitCommandError:
        raise BranchError(f"{branch}: no serving/results.json on that branch in {repo.working_dir}") from None
    try:
        return results_file.read(text, where)
    except results_file.ResultsError as e:
        raise BranchError(str(e)) from None


def results(ledger: Ledger, branch: str) -> tuple[Run, results_file.Results]:
    row = run_of(ledger, branch)
    try:
        repo = gitops.open_repo(Path(row.repo))
    except gitops.RepoError as e:
        raise BranchError(f"{branch}: {e}") from None
    return row, read(repo, branch)


def as_json(ledger: Ledger, run_id: str | None) -> list[dict]:
    """Every branch of the run (or of every run), best claim first: its results, with branch and commit."""
    out = []
    for t in ledger.trials(run_id):
        if t.branch:
            _, found = results(ledger, t.branch)
            out.append({"branch": t.branch, "commit": t.commit, **found.model_dump(mode="json")})
    return sorted(out, key=lambda b: -(b["claim"]["heldout_ratio"] or b["claim"]["search_ratio"] or 0))


def diff(ledger: Ledger, branch: str) -> Iterator[str]:
    """The branch's config and env against the defaults', its claim with bounds, the load it was measured under."""
    run, found = results(ledger, branch)
    base = next((t for t in ledger.trials(run.id) if t.source == Source.BASELINE), None)
    flags0, env0 = (dict(base.flags), dict(base.env)) if base else ({}, {})
    c, load = found.claim, found.load
    bounds = (f" [{c.heldout_interval[0]:.3f}, {c.heldout_interval[1]:.3f}]" if c.heldout_interval else "")
    yield (f"{branch}: {c.heldout_ratio if c.heldout_ratio is not None else c.search_ratio}x the defaults' "
           f"{c.unit}{bounds} ({'held out' if c.heldout_ratio is not None else 'search prompts'})")
    yield (f"  load: {load.arrivals}, concurrency {load.concurrency}, rate {load.rate}, {load.requests_per_phase} "
           f"requests a phase, {load.repeats} repeats, {load.warmup_requests} warm-ups")
    for kind, mine, theirs in (("config.yaml", found.serving.flags, flags0), ("env", found.serving.env, env0)):
        for key in sorted(set(mine) | set(theirs)):
            if mine.get(key) != theirs.get(key):
                yield f"  {kind}: {key}: {theirs.get(key, '(unset)')} -> {mine.get(key, '(unset)')}"
    if found.serving.env_only:
        yield "  the whole gain is in the environment: serving/env"
