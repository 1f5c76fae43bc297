"""A run's settings are stored as the run used them and read back the same, by the same names."""

from dataclasses import fields, replace
from pathlib import Path

import pytest

from agent.context import Settings, settings_of, stored
from agent.gate import GateSettings
from agent.ledger import Ledger, Run
from agent.stats import Noise


def _run(ledger: Ledger, settings: dict) -> Run:
    ledger.add(Run(id="r1", deadline_at="2026-12-03T00:00:00+00:00", model="m", space_path="s", space_hash="h",
                   workload="smoke", repo="r", settings=settings))
    return ledger.run("r1")   # read back from the SQLite file, JSON and all


def _reopened_before(path: Path, migration: str) -> Ledger:
    """The ledger as one written before `migration` is opened: its record of it dropped, so opening applies it."""
    import sqlite3

    db = sqlite3.connect(path)
    db.execute("DELETE FROM migrations WHERE name = ?", (migration,))
    db.commit()
    db.close()
    return Ledger(path)


def test_the_settings_dataclass_goes_into_the_run_row_and_comes_back_equal(tmp_path):
    used = Settings(model="m", workload={"name": "mine", "num_prompts": 7}, quality="quick", quality_text="t.txt",
                    gate=GateSettings(ppl_tolerance=0.02, min_gain=0.05, slo_ttft_p99_ms=300.0, max_instances=9,
                                      noise_prior=Noise(0.07, 4)),
                    baseline_instances=3, repeats=4, seed=5, sampler="random", max_trials=11, recheck=False,
                    drift_every=0, one_knob_start=True, facts={"cpus": 2}, home=tmp_path, sampler_per_planner=2,
                    preflight=False, prune=False)
    # every field differs from its default, so a field dropped on the way shows as a default
    assert all(getattr(used, f.name) != f.default for f in fields(Settings) if f.name not in ("model", "workload"))
    back = settings_of(_run(Ledger(tmp_path / "ledger.sqlite"), {**stored(used), "budget": "1h"}))
    assert back == used and isinstance(back.gate.noise_prior, Noise) and isinstance(back.home, Path)


def test_a_run_row_written_before_the_settings_were_stored_as_used_is_read_with_its_old_names(tmp_path):
    old = {"home": str(tmp_path), "budget": "30m", "quality": "quick", "workload_spec": {"name": "mine"},
           "ppl_tolerance": 0.02, "slo_itl_p99_ms": 100.0, "exact": True, "noise_prior": [0.07, 4], "repeats": 3,
           "one_knob_start": True, "planner": "builtin", "workers": 1}
    _run(Ledger(tmp_path / "ledger.sqlite"), old)
    ledger = _reopened_before(tmp_path / "ledger.sqlite", "m003_settings_as_used")
    assert ledger.migrated == ["m003_settings_as_used"]
    back = settings_of(ledger.run("r1"))
    assert back.workload == {"name": "mine"} and back.quality == "quick" and back.repeats == 3
    assert back.gate == GateSettings(ppl_tolerance=0.02, slo_itl_p99_ms=100.0, exact=True, noise_prior=Noise(0.07, 4))
    assert back.one_knob_start and back.seed == 0 and back.home == tmp_path
    # older still: no workload spec, no prior: the run's workload name and no prior
    older = settings_of(Run(id="r0", workload="smoke", settings={"home": str(tmp_path)}))
    assert older.workload == "smoke" and older.gate.noise_prior == Noise(0.0, 0)


def test_slos_the_first_m003_left_beside_the_gate_are_moved_into_it(tmp_path):
    """A flat row from between 480ecef and the settings stored as used kept its SLOs as
    slo_itl_p99_ms; the first m003 left them beside the gate, where no run reads them."""
    _run(Ledger(tmp_path / "ledger.sqlite"), {"home": str(tmp_path), "slo_itl_p99_ms": 100.0, "model": "m",
                                               "workload": "smoke", "gate": {"ppl_tolerance": 0.02}})
    ledger = _reopened_before(tmp_path / "ledger.sqlite", "m005_flat_slos_into_the_gate")
    assert ledger.migrated == ["m005_flat_slos_into_the_gate"]
    back = settings_of(ledger.run("r1"))
    assert back.gate == GateSettings(ppl_tolerance=0.02, slo_itl_p99_ms=100.0) and "slo_itl_p99_ms" not in \
        ledger.run("r1").settings


def test_a_postgresql_password_given_as_a_query_parameter_is_never_printed(tmp_path):
    """SQLAlchemy hides a password before the host but keeps ?password=: every line that names the
    database hides both."""
    from agent import storage as storages
    from agent.ledger import safe_url

    url = "postgresql://agent@db.example:5432/runs?password=s3cret-pw&sslmode=require"
    said = [storages.resolve(url, tmp_path).describe(), safe_url(url),
            safe_url("postgresql://agent:s3cret-pw@db.example/runs")]
    assert not [line for line in said if "s3cret" in line], said
    assert "db.example" in said[0] and "sslmode=require" in said[0]


MALFORMED_URLS = [
    "postgresql://user:p@ss:S3CRET@127.0.0.1/db",      # an unencoded '@' in the password
    "postgresql://user:S3CRET@db.example:notaport/db",  # a port that is no number
    "postgresql://user:S3CRET@[::1/db",                 # an unclosed IPv6 bracket
    "postgresql://user:S3CRET",                         # no host at all
    "postgres ql://user:S3CRET@db.example/db",          # not a URL SQLAlchemy reads
    "postgresql://user@db.example/db?password=S3CRET&port=x",
]


@pytest.mark.slow   # 3.6 s each: the storage's own checks, through the command line
@pytest.mark.parametrize("url", MALFORMED_URLS)
def test_a_malformed_storage_url_is_one_line_that_prints_no_part_of_its_password(tmp_path, monkeypatch, url):
    """Before, an '@' in the password gave a traceback with the password in it (storage.resolve caught
    only ArgumentError). Through the command line, as AGENT_STORAGE and as --storage."""
    from typer.testing import CliRunner

    from agent.cli import app

    monkeypatch.setenv("AGENT_HOME", str(tmp_path))
    runner = CliRunner()
    monkeypatch.setenv("AGENT_STORAGE", url)
    results = [runner.invoke(app, ["status"]), runner.invoke(app, ["doctor"]), runner.invoke(app, ["ledger"])]
    monkeypatch.delenv("AGENT_STORAGE")
    results.append(runner.invoke(app, ["run", "--storage", url, "--budget", "1m"]))
    for result in results:
        said = result.stdout + result.stderr + repr(result.exception or "")
        assert "S3CRET" not in said and "p@ss" not in said, said
        assert result.exit_code in (1, 2) and isinstance(result.exception, SystemExit | None), said
        lines = result.stderr.strip().splitlines()
        assert lines and lines[-1].startswith("error: ") and "--storage" in lines[-1], said


def test_a_model_folder_given_relative_to_here_is_made_absolute_even_where_it_looks_like_a_hub_id(tmp_path,
                                                                                                  monkeypatch):
    """Trials run from the agent's source root, so "models/tiny" must not be read there, nor fetched
    from the Hub as the id models/tiny: the folder here wins, as its absolute path."""
    from agent import hub
    from agent.request import model_ready

    (tmp_path / "models" / "tiny").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(hub, "fetch", lambda *a, **k: (_ for _ in ()).throw(AssertionError("fetched from the Hub")))
    assert model_ready("models/tiny", say=print) == (str(tmp_path / "models" / "tiny"), None)


def test_the_run_s_inputs_beside_its_settings_come_back_typed_and_an_older_row_reads_their_defaults(tmp_path):
    """What `agent run` keeps beside Settings (budget, workers, planner, drafts, context length, the host's
    choices, ...) is one dataclass, Inputs, stored flat beside the settings' keys and read back by
    inputs_of: no reader takes them out of the row by string."""
    from dataclasses import asdict

    from agent.context import Inputs, inputs_of

    given = Inputs(budget="8h", budget_s=28800.0, workers=4, planner="off", planner_base_url="http://h/v1",
                   draft_models=["/models/d"], model_given="org/m", max_model_len=4096, longest_request=702,
                   choices={"VLLM_CPU_OMP_THREADS_BIND": ["auto", "0-1"]}, quality_text_hash="abc",
                   traffic={"name": "mine"}, traffic_source={"path": "t.jsonl"}, storage="postgresql",
                   arrivals="rate:4", objective="goodput", num_prompts=50, slo_e2e_p99_ms=900.0, capacity="1,2,4",
                   price_per_hour=1.2, target_rate=20.0)
    assert all(v != Inputs.__dataclass_fields__[k].default for k, v in asdict(given).items()
               if not isinstance(v, (list, dict)))   # a field dropped on the way would read as its default
    ledger = Ledger(tmp_path / "ledger.sqlite")
    used = Settings(model="m", workload="smoke")
    run = _run(ledger, stored(used, given))
    assert inputs_of(run) == given and settings_of(run) == replace(used, home=None)
    older = ledger.add(Run(id="r0", deadline_at="2026-12-03T00:00:00+00:00", model="m", space_path="s",
                           space_hash="h", workload="smoke", repo="r", settings={"budget": "1h"}))
    assert inputs_of(older) == Inputs(budget="1h")
