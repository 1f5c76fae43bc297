"""`agent run`'s request: one dataclass, checked by prepare_run without typer, its fields the command's options."""

from dataclasses import fields
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from agent.cli import app
from agent.ledger import Ledger
from agent.request import RunError, RunRequest, prepare_run


def _refused(tmp_path: Path, **options) -> RunError:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    with pytest.raises(RunError) as refused:
        prepare_run(RunRequest(**{"budget_text": "10m", **options}), ledger, tmp_path, gpus=0, storage_kind="sqlite",
                    say=print)
    assert ledger.runs() == []   # refused before the run's row was written
    assert not [p for p in tmp_path.iterdir() if p.is_dir() and p.name[:8].isdigit()]   # nor its folder
    return refused.value


@pytest.mark.parametrize("options, said", [
    ({"sampler": "grid"}, "--sampler: 'grid' is not tpe or random"),
    ({"budget_text": "ten minutes"}, "--budget: "),
    ({"workload": "no-such-profile"}, "--workload: workload 'no-such-profile' is neither a shipped profile"),
    ({"multi_turn": True}, "--multi-turn: replays a --traffic file's conversations"),
    ({"traffic": Path("/nonexistent/traffic.jsonl")}, "--traffic: /nonexistent/traffic.jsonl is not a file"),
    ({"planner_base_url": "https://host/v1?api_key=sk-secret"}, "--planner-base-url: it carries a credential"),
    ({"model": "not a model!"}, "--model: 'not a model!' is neither a folder nor a Hugging Face id"),
    ({"exact": True}, "--exact: batch-invariant serving (VLLM_BATCH_INVARIANT) needs an NVIDIA GPU"),
    ({"workers": 0}, "--workers: 0 is not a positive number"),
    ({"quality": "none-such"}, "--quality: "),
])
def test_a_bad_option_is_one_line_naming_it_and_nothing_is_written(tmp_path, options, said):
    error = _refused(tmp_path, **options)
    assert str(error).startswith(said) and "\n" not in str(error) and error.code == 2
    assert "sk-secret" not in str(error)


def test_the_command_line_is_the_request_s_fields_and_says_what_prepare_run_says(tmp_path, monkeypatch):
    """Each field of RunRequest is an option of `agent run` (declared once, on the dataclass), and the
    command passes what it parsed to prepare_run: the same refusal, as the one line and exit status 2."""
    monkeypatch.setenv("AGENT_HOME", str(tmp_path))
    command = typer.main.get_command(app).commands["run"]
    assert [p.name for p in command.params] == [f.name for f in fields(RunRequest)]
    for param, f in zip(command.params, fields(RunRequest), strict=True):
        assert param.opts[0] == (f.metadata["flags"] or ("--" + f.name.replace("_", "-"),))[0]
        assert param.default == f.default and param.help == f.metadata["help"]
    result = CliRunner().invoke(app, ["run", "--budget", "10m", "--sampler", "grid", "--repeats", "3"])
    assert result.exit_code == 2 and "error: --sampler: 'grid' is not tpe or random" in result.output
    result = CliRunner().invoke(app, ["run", "--budget", "10m", "--repeats", "0"])   # typer's own bound check
    assert result.exit_code == 2 and "--repeats" in result.output
    assert Ledger(tmp_path / "ledger.sqlite").runs() == []


def test_every_option_lands_where_it_should():
    """Each RunRequest field is the gate's, the run's settings' or prepare_run's own, exactly one; the
    gate's and the settings' land under their names with the value given (not the default)."""
    from agent.context import Settings
    from agent.gate import GateSettings
    from agent.request import PREPARED, TO_GATE, TO_SETTINGS, gate_from, settings_from
    from agent.stats import Noise

    names = [f.name for f in fields(RunRequest)]
    assert sorted(names) == sorted([*TO_GATE, *TO_SETTINGS, *PREPARED])
    assert len(set(TO_GATE) | set(TO_SETTINGS) | set(PREPARED)) == len(names)
    given = {}
    for f in fields(RunRequest):
        if f.name not in (*TO_GATE, *TO_SETTINGS):
            continue
        kind = str(f.type)
        given[f.name] = (not f.default if "bool" in kind else "random" if f.name == "sampler"
                         else 7 if "int" in kind else 0.123)
        assert given[f.name] != f.default, f.name
    request = RunRequest(**given)
    gate = gate_from(request, Noise(0.05, 3))
    settings = settings_from(request, model="m", workload={}, quality="quick", quality_text=None, home=Path("h"),
                             gate=gate, facts={})
    assert {n: getattr(gate, n) for n in TO_GATE} == {n: given[n] for n in TO_GATE}
    assert {n: getattr(settings, n) for n in TO_SETTINGS} == {n: given[n] for n in TO_SETTINGS}
    assert gate.noise_prior == Noise(0.05, 3) and settings.gate is gate
    assert set(TO_GATE) <= {f.name for f in fields(GateSettings)} and set(TO_SETTINGS) <= {f.name for f in
                                                                                           fields(Settings)}
