"""Workload profiles and quality sets: the fixed harness a trial is measured with.

Profiles and texts are data under sandbox/data/ (the agent reads them from here too). Each loaded profile carries a hash of everything
that decides its figures (the profile's fields and the exact prompts), so two figures are only
ever compared when they came from the same meter.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml

DATA = Path(str(files("sandbox").joinpath("data")))
WORKLOAD_FIELDS = {
    "name": str, "meter_version": int, "concurrency": int, "num_prompts": int,
    "max_tokens": int, "ignore_eos": bool, "temperature": float, "warmup_requests": int,
    "prompt_split": str,
}
SPLITS = ("search", "heldout")


@dataclass(frozen=True)
class Workload:
    name: str
    meter_version: int
    concurrency: int
    num_prompts: int
    max_tokens: int
    ignore_eos: bool
    temperature: float
    warmup_requests: int
    prompt_split: str

    def prompts(self) -> list[str]:
        """The measured prompts, in order; cycles through the split if it is shorter."""
        pool = split_prompts(self.prompt_split)
        return [pool[i % len(pool)] for i in range(self.num_prompts)]

    def warmup_prompts(self) -> list[str]:
        # Taken from the end of the split so warm-ups never prime the prefix cache for the
        # measured prompts.
        pool = split_prompts(self.prompt_split)
        return [pool[-1 - (i % len(pool))] for i in range(self.warmup_requests)]

    @property
    def hash(self) -> str:
        payload = json.dumps({"profile": asdict(self), "prompts": self.prompts()}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def with_split(self, split: str) -> "Workload":
        return Workload(**{**asdict(self), "prompt_split": split})


@dataclass(frozen=True)
class Quality:
    name: str
    perplexity_text: str
    window_tokens: int
    greedy_prompts: list[dict]
    greedy_max_tokens: int
    greedy_count: int | None = None    # the first N prompts only (None: all)

    def documents(self) -> list[str]:
        """Perplexity documents: the text's paragraphs."""
        return [p.strip() for p in self.perplexity_text.split("\n\n") if p.strip()]

    @property
    def hash(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def split_prompts(split: str) -> list[str]:
    if split not in SPLITS:
        raise ValueError(f"prompt_split {split!r} is not one of {', '.join(SPLITS)}")
    return [r["prompt"] for r in _read_jsonl(DATA / "texts" / "prompts.jsonl") if r["split"] == split]


def load_workload(ref: str | dict[str, Any]) -> Workload:
    """A workload from a shipped profile name, a YAML path, or an inline mapping."""
    if isinstance(ref, str):
        path = DATA / "workloads" / f"{ref}.yaml"
        if not path.exists():
            path = Path(ref)
        if not path.exists():
            shipped = sorted(p.stem for p in (DATA / "workloads").glob("*.yaml"))
            raise ValueError(f"workload {ref!r} is neither a shipped profile ({', '.join(shipped)}) nor a file")
        raw, where = yaml.safe_load(path.read_text()), str(path)
    else:
        raw, where = ref, "workload"
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping")
    unknown = sorted(set(raw) - set(WORKLOAD_FIELDS))
    if unknown:
        raise ValueError(f"{where}: unknown field {unknown[0]!r}")
    missing = sorted(set(WORKLOAD_FIELDS) - set(raw))
    if missing:
        raise ValueError(f"{where}: missing field {missing[0]!r}")
    values = {}
    for key, kind in WORKLOAD_FIELDS.items():
        value = raw[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValueError(f"{where}.{key}: {value!r} is not a {kind.__name__}")
        if kind is int and value < (0 if key == "warmup_requests" else 1):
            raise ValueError(f"{where}.{key}: {value!r} is out of range")
        values[key] = value
    workload = Workload(**values)
    split_prompts(workload.prompt_split)  # validates the split name
    return workload


def load_quality(name: str = "default") -> Quality:
    """A shipped quality set: 'default' (sandbox/data/quality.yaml) or 'quick' (quality-quick.yaml)."""
    path = DATA / ("quality.yaml" if name == "default" else f"quality-{name}.yaml")
    if not isinstance(name, str) or not path.exists():
        raise ValueError(f"quality set {name!r} is not shipped (default, quick)")
    raw = yaml.safe_load(path.read_text())
    paragraphs = [p.strip() for p in (DATA / raw["perplexity_text"]).read_text().split("\n\n") if p.strip()]
    return Quality(
        name=raw["name"],
        perplexity_text="\n\n".join(paragraphs[:raw.get("documents")]),
        window_tokens=int(raw["window_tokens"]),
        greedy_prompts=_read_jsonl(DATA / raw["greedy_prompts"]),
        greedy_max_tokens=int(raw["greedy_max_tokens"]),
        greedy_count=raw.get("greedy_prompts_used"),
    )
