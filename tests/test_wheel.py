"""A wheel install finds what the agent ships: its spaces (package data agent/spaces, from the checkout's
search_space/) and the harness's workloads, with nothing of the checkout beside it."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process   # starts processes (tests/conftest.py: not in `pytest -m unit`)

ROOT = Path(__file__).resolve().parents[1]


def test_a_wheel_install_finds_its_spaces_and_workloads(tmp_path):
    source = tmp_path / "source"
    for part in ("agent", "sandbox", "search_space"):
        shutil.copytree(ROOT / part, source / part, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path / "dist"), str(source)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("agent-*.whl")
    site = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
                                str(wheel)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-2000:]
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "AGENT_HOME": str(tmp_path / "home"),
           "HOME": str(tmp_path)}
    probe = ("import agent, sandbox; from agent import space; from agent.checks import shipped_files\n"
             "print(agent.__file__); print(sandbox.__file__); print(space.SPACES)\n"
             "print(sorted(p.stem for p in space.SPACES.glob('*.yaml'))); print(shipped_files())")
    found = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=120)
    assert found.returncode == 0, found.stderr[-2000:]
    agent_file, sandbox_file, spaces_dir, names, problems = found.stdout.splitlines()
    assert agent_file.startswith(str(site)) and sandbox_file.startswith(str(site))   # the wheel's, not the checkout's
    assert spaces_dir == str(site / "agent" / "spaces")
    assert names == "['vllm-cpu', 'vllm-gpu']" and problems == "[]"
    helped = subprocess.run([sys.executable, "-m", "agent.cli", "run", "--help"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0 and "--capacity" in helped.stdout, helped.stderr[-2000:]
