import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # tests/ helpers: fake_engine, fake_server

import pytest


@pytest.fixture(scope="session")
def embedded_model():
    """The prepared Gemma 3 270M folder (built once, about 2 minutes, then cached under runs/)."""
    from sandbox.model import prepare

    return prepare()
