"""Ledgers written by every commit that changed the ledger's schema, as that commit's own code wrote
them, for tests/test_migrations.py: each one must open, migrate and read under today's code.

    python3 tests/ledger_fixtures.py            # writes tests/data/ledgers/<date>-<commit>.sqlite

For each commit that touched agent/ledger.py, a detached worktree of it writes one run (its settings
in the shape that commit's `agent run` stored: the Settings dataclass from e652c7b; before, its
`run` command's options flat, at their defaults)
and three trials (the defaults, an accepted candidate with a branch, a failed one), filling every
column its schema has. Commits whose tables have the same columns as the one before are skipped.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "ledgers"
STORED_AS_USED = "e652c7b"   # the commit from which a run row stores the Settings dataclass as used

WRITE = r'''
import json, sys
from pathlib import Path
sys.path.insert(0, ".")
from agent.ledger import Ledger, Run, Trial
out = Path(sys.argv[1])
ledger = Ledger(out)
if sys.argv[2] == "flat":
    # Before e652c7b (2026-12-03) `agent run` stored its own options flat, as _new_run wrote them:
    # a few by name, then the rest of the `run` command's options at their defaults.
    import inspect
    from agent import cli
    given = {"home": "/old/home", "budget_s": 1800, "budget": "30m", "quality": "default", "sampler": "tpe",
             "planner": "builtin", "draft_models": [], "model_given": False, "storage": "sqlite"}
    taken = {"resume", "budget_text", "storage", "model", "space_name", "space", "workload", "repo", "quality",
             "sampler", "draft_model", "planner"}
    run_command = next((c.callback for c in cli.app.registered_commands
                        if (c.name or c.callback.__name__) == "run"), None)   # 018002f had no `agent run` yet
    options = {name: getattr(p.default, "default", p.default)
               for name, p in inspect.signature(run_command).parameters.items()
               if name not in taken} if run_command else {}
    settings = {**given, **{k: v for k, v in options.items()
                            if isinstance(v, (str, int, float, bool, list, type(None)))}}
else:
    from agent.context import Settings, stored
    settings = stored(Settings(model="m", workload="smoke", home=Path("/old/home")))
run_cols = set(Run.__table__.columns.keys())
run = Run(id="old", deadline_at="2026-11-29T23:00:00+00:00", model="m", space_path="vllm-cpu",
          space_hash="h", workload="smoke", repo="/old/home/proposals", settings=settings, status="finished",
          finished_at="2026-11-29T23:00:00+00:00",
          **{k: v for k, v in {"baseline_tps": 18.0, "baseline_figure": 18.0, "baseline_ppl": 8.0,
                               "noise": 0.03}.items()
             if k in run_cols})
ledger.add(run)
cols = set(Trial.__table__.columns.keys())
NOW = {"tps": "figure", "tps_ratio": "search_ratio", "baseline_tps": "baseline_figure"}   # named by unit, 2026-12-06
def trial(number, **values):
    values = {k if k in cols else NOW.get(k, k): v for k, v in values.items()}
    values = {k: v for k, v in values.items() if k in cols}
    row = Trial(run_id="old", number=number, **values)
    ledger.add(row)
trial(0, source="baseline", status="ok", tps=18.0, ppl=8.0, decision="baseline", params={}, flags={}, env={})
trial(1, source="planner", status="ok", tps=22.0, tps_ratio=1.222, ppl=8.0, ppl_change=0.0, gate_passed=True,
      decision="accepted", branch="agent/old/1", commit="0" * 40, params={"max-num-seqs": 16},
      flags={"max-num-seqs": 16}, env={}, heldout_ratio=1.2, heldout_interval=[1.1, 1.3], rationale="because")
trial(2, source="sampler", status="failed", failure_class="oom", failure_message="out of memory",
      params={"max-num-seqs": 512}, flags={"max-num-seqs": 512}, env={}, gate_passed=False, decision="failed")
ledger.engine.dispose()
import sqlite3
db = sqlite3.connect(out)   # one self-contained file: the write-ahead log folded in
db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
db.execute("PRAGMA journal_mode=DELETE")
db.close()
print(json.dumps({t.name: sorted(t.columns.keys()) for t in Run.metadata.sorted_tables}))
'''


def main() -> None:
    commits = subprocess.run(["git", "log", "--reverse", "--format=%h %ad", "--date=short", "--", "agent/ledger.py"],
                             cwd=ROOT, capture_output=True, text=True, check=True).stdout.split("\n")
    OUT.mkdir(parents=True, exist_ok=True)
    seen = None
    with tempfile.TemporaryDirectory() as tmp:
        for line in filter(None, commits):
            sha, date = line.split()
            tree = Path(tmp) / sha
            subprocess.run(["git", "worktree", "add", "--detach", str(tree), sha], cwd=ROOT, check=True,
                           capture_output=True)
            try:
                target = Path(tmp) / f"{sha}.sqlite"
                flat = sha != STORED_AS_USED and subprocess.run(
                    ["git", "merge-base", "--is-ancestor", sha, STORED_AS_USED], cwd=ROOT).returncode == 0
                done = subprocess.run([sys.executable, "-c", WRITE, str(target), "flat" if flat else "stored"],
                                      cwd=tree, capture_output=True, text=True)
                if done.returncode:
                    print(f"{sha} {date}: failed: {done.stderr.strip().splitlines()[-1]}")
                    continue
                schema = json.loads(done.stdout.strip().splitlines()[-1])
                if schema == seen:
                    print(f"{sha} {date}: same columns as the one before, skipped")
                    continue
                seen = schema
                (OUT / f"{date}-{sha}.sqlite").write_bytes(target.read_bytes())
                print(f"{sha} {date}: written ({sum(len(c) for c in schema.values())} columns)")
            finally:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)


if __name__ == "__main__":
    main()
