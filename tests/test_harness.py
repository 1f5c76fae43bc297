"""The fixed harness stands alone: spec in, result out, nothing of the agent imported."""

import subprocess
import sys
from pathlib import Path

import pytest

from sandbox import model

pytestmark = pytest.mark.process   # starts processes (tests/conftest.py: not in `pytest -m unit`)

ROOT = Path(__file__).resolve().parents[1]


def test_no_harness_module_imports_the_agent():
    modules = sorted(f"sandbox.{p.stem}" for p in (ROOT / "sandbox").glob("*.py") if p.stem != "__init__")
    assert "sandbox.worker" in modules and "sandbox.model" in modules
    code = (f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
            "print(sorted(m for m in sys.modules if m == 'agent' or m.startswith('agent.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_shipped_texts_are_the_harness_own_package_data():
    from sandbox.workload import DATA, load_quality, load_workload

    assert DATA == ROOT / "sandbox" / "data"
    assert load_workload("smoke").name == "smoke" and load_quality().documents()


@pytest.mark.parametrize("version", ["5.17.0", "4.57.1", "5.18.2.dev0"])
def test_a_transformers_that_builds_a_broken_tokenizer_is_named_with_the_fix(version):
    with pytest.raises(model.ModelError) as e:
        model.check_transformers(version)
    assert version in str(e.value) and "transformers>=5.19" in str(e.value)


@pytest.mark.parametrize("version", ["5.19.0", "5.19.1", "6.0.0"])
def test_a_recent_transformers_passes(version):
    model.check_transformers(version)
