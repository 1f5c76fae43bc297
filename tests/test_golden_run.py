"""A seeded run on the deterministic engine, compared whole with the one committed in tests/data/golden-run.json:
the ledger's rows (ids, timestamps and the run's own id and folders aside), the study's values and
states, and the branch's files. A change of shape (typed states, renamed figures, fewer writes)
must leave all of it as it was; a change of behaviour shows here as a diff, and is regenerated on
purpose with GOLDEN_WRITE=1 (the diff goes into the commit that explains it)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from agent.ledger import Ledger

pytestmark = pytest.mark.process   # starts processes (tests/conftest.py: not in `pytest -m unit`)

HERE = Path(__file__).parent
GOLDEN = HERE / "data" / "golden-run.json"
# The agent's own commit in a branch's results.json: a new one at every commit of this repository. And the
# measuring host's size where a branch marks a value host-specific (the run row's hardware is left out too).
AGENT_COMMIT = re.compile(r'("commit": )"[0-9a-f]{40}"')
HOST_SIZE = re.compile(r"\(\d+ cores\)|\([0-9.]+ GiB of memory\)")
# Differ run to run without meaning anything: when, where, and which process.
VOLATILE = {"id", "run_id", "trial_id", "started_at", "finished_at", "timings", "log_path", "worker_id", "commit",
            "heartbeat_at"}


def test_a_seeded_run_writes_the_ledger_study_and_branch_it_wrote_before(tmp_path, embedded_model):
    home = tmp_path / "home"
    env = {**os.environ, "AGENT_HOME": str(home), "AGENT_TEST_TRIAL_S": "0.02", "COLUMNS": "300"}
    # Two cores, as CI's machines have (the space's thread binding is drawn from the host's cores).
    two = ",".join(str(c) for c in sorted(os.sched_getaffinity(0))[:2])
    proc = subprocess.run(["taskset", "-c", two, sys.executable, str(HERE / "agent_with_seam_engine.py"), "run",
                           "--budget", "10m", "--model", str(embedded_model), "--max-trials", "8"],
                          env=env, capture_output=True, text=True, timeout=300, cwd=HERE.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = snapshot(home, embedded_model)
    if os.environ.get("GOLDEN_WRITE"):
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(GOLDEN.read_text())
    assert len(want["trials"]) >= 10 and any(t["branch"] for t in want["trials"])   # a run with a decision in it
    for number, (w, g) in enumerate(zip(want["trials"], got["trials"], strict=True)):
        assert g == w, (number, {k: (w.get(k), g.get(k)) for k in set(w) | set(g) if w.get(k) != g.get(k)})
    assert got == want


def snapshot(home: Path, model: Path) -> dict:
    ledger = Ledger(home / "ledger.sqlite")
    (run,) = ledger.runs()

    def plain(row) -> dict:
        text = json.dumps({c.name: getattr(row, c.name) for c in row.__table__.columns if c.name not in VOLATILE},
                          default=str, sort_keys=True)
        return json.loads(text.replace(run.id, "RUN").replace(str(home), "HOME").replace(str(model), "MODEL")
                          .replace(str(HERE.parent), "ROOT"))

    study = optuna.load_study(study_name=run.id, storage=f"sqlite:///{home / 'optuna.sqlite'}")
    branches = [t.branch for t in ledger.trials(run.id) if t.branch]
    files = {}
    for branch in branches:
        names = git(home, "ls-tree", "-r", "--name-only", branch).split()
        files[branch.replace(run.id, "RUN")] = {
            name: HOST_SIZE.sub("(HOST)", AGENT_COMMIT.sub(r'\1"COMMIT"', git(home, "show", f"{branch}:{name}")
                                                           .replace(run.id, "RUN").replace(str(home), "HOME")
                                                           .replace(str(model), "MODEL"))) for name in names}
    kept = {k: v for k, v in plain(run).items() if k not in ("deadline_at", "owner", "settings", "hardware")}
    kept["calibration"].pop("plan")   # made from the seconds the test engine's trials took on this machine
    return {"run": kept,
            "trials": [plain(t) for t in ledger.trials(run.id)],
            "repeats": [plain(r) for t in ledger.trials(run.id) for r in ledger.repeats(t.id)],
            "study": [[ft.number, ft.state.name, ft.values, ft.params, ft.system_attrs.get("constraints")]
                      for ft in study.trials],
            "branches": files}


def git(home: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(home / "proposals"), *args], capture_output=True, text=True,
                          check=True).stdout
