"""The cheap instances of the real engine a whole `agent run` uses in tests/test_run_real.py and
bench/kill_soak.py: the shipped CPU space with enforce-eager fixed, and a one-paragraph quality text."""

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]

QUALITY_TEXT = ("It was the best of times, it was the worst of times, it was the age of wisdom, it was the age "
                "of foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season "
                "of Light, it was the season of Darkness, it was the spring of hope, it was the winter of despair.")


def eager_space(folder: Path) -> Path:
    """The shipped CPU space with enforce-eager fixed rather than searched."""
    raw = yaml.safe_load((ROOT / "search_space/vllm-cpu.yaml").read_text())
    raw["fixed"]["flags"]["enforce-eager"] = True
    del raw["knobs"]["enforce-eager"]
    path = folder / "vllm-cpu-eager.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def quality_text(folder: Path) -> Path:
    path = folder / "quality.txt"
    path.write_text(QUALITY_TEXT + "\n")
    return path
