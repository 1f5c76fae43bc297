"""Where runtime state lives. One variable moves all of it: AGENT_HOME (default ./runs)."""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    return Path(os.environ.get("AGENT_HOME") or "runs").resolve()


def models_dir() -> Path:
    return home() / "models"
