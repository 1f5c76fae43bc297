"""A traffic file for users who have no logs yet: requests drawn from prompt and output length
distributions, by vLLM's own random dataset (`vllm bench serve --dataset-name random`).

Each request's prompt and output lengths are integer-uniform within `range_ratio` of the means
(vLLM's rule); its prompt is vLLM's reproducible token sequence for that length, decoded to text
and re-encoded to the exact count. What is written is an ordinary traffic file (OpenAI completions
bodies, one a line), so a night reads, hashes, splits and measures it as it would the user's own.

A synthetic file says how long requests are, not what they say: random tokens give a speculator
nothing to look up and a prefix cache nothing to share, so configs that win on real text (n-gram
speculation, prefix caching) are judged here by their cost alone. Replace it with real traffic as
soon as there is some (docs/traffic.md: capturing it). With a rate, each request also gets a
`timestamp` (gamma gaps, seeded, as `vllm bench serve` draws them): a trace for `--arrivals trace`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Shape:
    input_len: int = 256
    output_len: int = 128
    range_ratio: float = 0.0   # lengths drawn uniformly in [len * (1 - r), len * (1 + r)], as vLLM draws them
    num_prompts: int = 1000
    seed: int = 0
    ignore_eos: bool = True    # the output lengths as drawn (random prompts end anywhere otherwise)
    temperature: float | None = None   # None: the server's default, as vllm bench serve sends it
    rate: float | None = None  # requests/s: each request gets a timestamp (a trace), gaps as vLLM draws them
    burstiness: float = 1.0    # the gaps' gamma shape (1: Poisson), as vllm bench serve --burstiness

    def check(self) -> None:
        for name in ("input_len", "output_len", "num_prompts"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(self, name)})")
        if not 0 <= self.range_ratio < 1:
            raise ValueError(f"--range-ratio must be in [0, 1) (got {self.range_ratio})")
        if self.temperature is not None and self.temperature < 0:
            raise ValueError(f"--temperature must not be negative (got {self.temperature})")
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"--rate must be above 0 requests/s (got {self.rate})")
        if not self.burstiness > 0:
            raise ValueError(f"--burstiness must be above 0 (got {self.burstiness})")


def bodies(shape: Shape, model_dir: str) -> list[dict]:
    """The requests as OpenAI completions bodies, drawn by vLLM's RandomDataset with the model's tokenizer."""
    from transformers import AutoTokenizer
    from vllm.benchmarks.datasets import RandomDataset

    shape.check()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    drawn = RandomDataset(random_seed=shape.seed).sample(
        tokenizer=tokenizer,  # type: ignore[arg-type]  # a transformers tokenizer is vLLM's TokenizerLike
        num_requests=shape.num_prompts, range_ratio=shape.range_ratio,
        input_len=shape.input_len, output_len=shape.output_len)
    extra: dict[str, bool | float] = {"ignore_eos": True} if shape.ignore_eos else {}
    if shape.temperature is not None:
        extra["temperature"] = shape.temperature
    out: list[dict[str, Any]] = [{"prompt": r.prompt, "max_tokens": int(r.expected_output_len), **extra}
                                 for r in drawn]
    if shape.rate is not None:   # a trace: send times as `vllm bench serve --request-rate --burstiness` draws them
        from sandbox.contract import unit_times

        for body, at in zip(out, unit_times(len(out), shape.burstiness, shape.seed), strict=True):
            body["timestamp"] = round(at / shape.rate, 3)
    return out


def write(shape: Shape, model_dir: str, out: Path) -> list[dict]:
    found = bodies(shape, model_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(b) + "\n" for b in found))
    return found


def described(written: list[dict], shape: Shape) -> str:
    """The file written, in a line: requests, output lengths, prompt lengths, seed, timestamps."""
    lengths = sorted(b["max_tokens"] for b in written)
    timed = (f"; timestamps over {written[-1]['timestamp']:.0f} s ({shape.rate:g} requests/s, burstiness "
             f"{shape.burstiness:g})" if shape.rate else "")
    return (f"{len(written)} requests, output {lengths[0]}-{lengths[-1]} tokens (mean "
            f"{sum(lengths) / len(lengths):.0f}), prompts about {shape.input_len} tokens (range ratio "
            f"{shape.range_ratio}), seed {shape.seed}{timed}")
