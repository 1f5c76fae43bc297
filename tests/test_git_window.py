"""The git-error window through the command line (issue 57): a real `agent run` process (the
deterministic engine at its seam), a real SQLite ledger and real git repositories whose refs refuse
a write. An accepted config is never lost to git and never called rejected: the night ends with it
accepted and unbranched, `agent doctor` says what commits it, and `agent run --resume` of the
finished run commits it and does nothing else. A repository no branch could go into is refused
before the night starts, with nothing written."""

import os
import re
import subprocess
import sys
from pathlib import Path

import git
import pytest

from agent.ledger import Ledger

pytestmark = pytest.mark.process   # starts processes (tests/conftest.py: not in `pytest -m unit`)

HERE = Path(__file__).parent
ROOT = HERE.parent

# git runs this hook around every ref update (githooks(5)); a non-zero exit in the "prepared" state
# aborts the transaction, as a full disk, a lock left by another process or a server-side rule would.
REFUSING_HOOK = """#!/bin/sh
if [ "$1" = prepared ] && [ -e "$(dirname "$0")/../refuse" ]; then
  echo "refs are read-only here (test)" >&2
  exit 1
fi
exit 0
"""


def repository(path: Path) -> git.Repo:
    repo = git.Repo.init(path, initial_branch="main")
    (path / "README.md").write_text("serving configs\n")
    repo.git.add("README.md")
    repo.git.commit("-m", "start", env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                                         "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})
    return repo


def seam_agent(env, *args, timeout=300):
    two = ",".join(str(c) for c in sorted(os.sched_getaffinity(0))[:2])
    return subprocess.run(["taskset", "-c", two, sys.executable, str(HERE / "agent_with_seam_engine.py"), *args],
                          env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def agent(env, *args):
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], env=env, capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


@pytest.fixture()
def home_env(tmp_path):
    home = tmp_path / "home"
    return home, {**os.environ, "AGENT_HOME": str(home), "AGENT_TEST_TRIAL_S": "0.02", "COLUMNS": "2000"}


def test_a_night_whose_commits_fail_ends_accepted_and_its_finished_resume_commits_them_and_nothing_else(
        tmp_path, home_env, embedded_model):
    home, env = home_env
    repo = repository(tmp_path / "configs")
    hook = Path(repo.git_dir) / "hooks" / "reference-transaction"
    hook.write_text(REFUSING_HOOK)
    hook.chmod(0o755)
    (Path(repo.git_dir) / "refuse").touch()

    night = seam_agent(env, "run", "--budget", "10m", "--model", str(embedded_model), "--max-trials", "8",
                       "--repo", str(repo.working_dir))
    assert night.returncode == 0, night.stderr[-3000:]
    ledger = Ledger(home / "ledger.sqlite")
    (run,) = ledger.runs()
    accepted = [t for t in ledger.trials(run.id) if t.decision == "accepted"]
    assert accepted and not any(t.branch for t in accepted), [(t.number, t.decision) for t in ledger.trials(run.id)]
    assert all(any("not committed" in r and "read-only here" in r for r in t.gate_reasons) for t in accepted)
    assert not [h.name for h in repo.heads if h.name.startswith("agent/")]
    said = night.stderr.replace("\n", " ")   # the live lines (stderr; wrapped at 220 columns off a terminal)
    for t in accepted:   # the live line and the summary: accepted, waiting for its branch, never "rejected"
        (live,) = re.findall(rf"trial {t.number}: [0-9.]+ tok/s .*?(?= trial \d+|finished: run)", said)
        assert "accepted, not branched yet: not committed" in live and "rejected" not in live, live
        assert f"trial {t.number}: accepted (" in said and f"agent run --resume {run.id} commits it" in said
    assert re.search(rf"finished: run {run.id}, \d+ trials, \d+ failed, {len(accepted)} accepted "
                     rf"\({len(accepted)} not branched yet\)", said), said[-2000:]
    assert "the defaults are the best config" not in said

    listed = agent(env, "branches")
    assert listed.returncode == 0 and "accepted, waiting for its branch" in listed.stdout, listed.stdout
    assert all(f"trial {t.number}: accepted (" in listed.stdout for t in accepted)
    doctor = agent(env, "doctor")
    assert doctor.returncode == 1
    for t in accepted:
        assert (f"trial {t.number}: accepted but no branch was committed: `agent run --resume {run.id}` commits "
                f"it and does nothing else (the run is finished)") in doctor.stdout, doctor.stdout

    still = seam_agent(env, "run", "--resume", run.id)   # the cause not fixed yet: one line, exit 1, nothing lost
    assert still.returncode == 1 and "read-only here" in still.stderr and len(still.stderr.strip().splitlines()) == 1
    assert all(t.decision == "accepted" and not t.branch for t in Ledger(home / "ledger.sqlite").trials(run.id)
               if t.number in {a.number for a in accepted})

    (Path(repo.git_dir) / "refuse").unlink()
    trials_before = len(ledger.trials(run.id))
    resumed = seam_agent(env, "run", "--resume", run.id)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    after = Ledger(home / "ledger.sqlite")
    rows = {t.number: t for t in after.trials(run.id)}
    assert len(rows) == trials_before and after.run(run.id).status == "finished"   # no trial, no baseline
    branched = [rows[t.number] for t in accepted if rows[t.number].branch]
    assert branched, resumed.stderr
    for t in branched:
        assert repo.git.rev_parse(t.branch) == t.commit
        assert f"trial {t.number}: committed {t.branch} at {t.commit[:10]}" in resumed.stderr
    for t in (rows[a.number] for a in accepted if not rows[a.number].branch):   # as the night would have had it
        assert t.decision == "dominated" and f"trial {t.number}: dominated: " in resumed.stderr
    assert "baseline" not in resumed.stderr and "trial" in resumed.stderr
    doctor = agent(env, "doctor")
    assert doctor.returncode == 0 and "consistent" in doctor.stdout, doctor.stdout

    again = seam_agent(env, "run", "--resume", run.id)
    assert again.returncode == 2 and "no accepted config of it is waiting for its branch" in again.stderr


def test_a_repository_with_a_branch_named_agent_is_refused_before_the_night_with_nothing_written(
        tmp_path, home_env, embedded_model):
    """A branch named `agent` keeps every ref agent/<run>/<n> from being created (a ref cannot also be a
    folder of refs): before, every accepted config of the night failed to commit."""
    home, env = home_env
    repo = repository(tmp_path / "configs")
    repo.git.branch("agent")
    done = seam_agent(env, "run", "--budget", "10m", "--model", str(embedded_model), "--repo",
                      str(repo.working_dir), timeout=120)
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert len(line.splitlines()) == 1 and line.startswith("error: --repo: "), line
    assert "its branch 'agent' keeps every branch agent/<run>/<n> from being created" in line, line
    assert not (home / "ledger.sqlite").exists() or Ledger(home / "ledger.sqlite").runs() == []
    assert sorted(h.name for h in repo.heads) == ["agent", "main"]
