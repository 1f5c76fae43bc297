"""Workload profiles and quality sets: the fixed harness a trial is measured with.

Profiles and texts are data under sandbox/data/ (the agent reads them from here too). Each loaded profile
carries a hash of everything
that decides its figures (the profile's fields and the exact prompts), so two figures are only
ever compared when they came from the same meter.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from dataclasses import asdict, dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml

from sandbox.arrivals import Arrivals, mean_rate, stretch
from sandbox.arrivals import parse as parse_arrivals
from sandbox.traffic import HELDOUT_SHARE, Request, Traffic, TrafficError, draw, keys_hash, seeded, shares
from sandbox.traffic import load as load_traffic

DATA = Path(str(files("sandbox").joinpath("data")))
# name: (types, required). A traffic workload takes its requests (and their lengths, sampling and
# stopping) from its file; a template workload (no traffic) builds them from the shipped prompts
# with max_tokens, temperature and ignore_eos, as the challenge meters do.
WORKLOAD_FIELDS = {
    "name": ((str,), True), "meter_version": ((int,), True), "concurrency": ((int,), True),
    "num_prompts": ((int,), True), "warmup_requests": ((int,), True), "prompt_split": ((str,), True),
    "max_tokens": ((int, type(None)), False), "ignore_eos": ((bool, type(None)), False),
    "temperature": ((float, type(None)), False), "traffic": ((str, type(None)), False),
    "chat_template": ((str, type(None)), False),
    # How requests arrive and what ranks configs (sandbox.arrivals, sandbox.goodput; docs/arrivals.md).
    "arrivals": ((str,), False), "objective": ((str,), False),
    "slo_ttft_p99_ms": ((float, type(None)), False), "slo_itl_p99_ms": ((float, type(None)), False),
    "slo_e2e_p99_ms": ((float, type(None)), False),
}
ARRIVAL_FIELDS = ("arrivals", "objective", "slo_ttft_p99_ms", "slo_itl_p99_ms", "slo_e2e_p99_ms")
# A latency percentile as the objective: lower is better, so an instance's figure is its inverse,
# 1000 / the percentile in ms (per second), and a ratio of 1.25 reads "1.25 times shorter".
LATENCIES = {"ttft": "ttft_ms", "itl": "itl_ms", "e2e": "latency_ms", "tpot": "tpot_ms"}
LATENCY_OBJECTIVES = tuple(f"{m}-{q}" for m in LATENCIES for q in ("p50", "p90", "p99"))
# output tokens/s at the fixed concurrency; requests/s within the SLOs; a latency percentile
OBJECTIVES = ("tps", "goodput", *LATENCY_OBJECTIVES)


@dataclass(frozen=True)
class Slo:
    """The user's p99 latency bounds (ms), each None where not set: what goodput holds to."""
    ttft_p99_ms: float | None = None
    itl_p99_ms: float | None = None   # the gap between two streamed chunks (docs/arrivals.md: not TPOT)
    e2e_p99_ms: float | None = None

    def bounds(self) -> dict[str, float]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def latency_of(objective: str) -> tuple[str, str] | None:
    """For a latency objective, the bench field and percentile it reads ('e2e-p90': latency_ms, p90)."""
    if objective not in LATENCY_OBJECTIVES:
        return None
    metric, q = objective.split("-")
    return LATENCIES[metric], q
MAX_RATE_POINTS = 12
PHASE_PER_SLOT = 8   # a closed-loop phase at concurrency C > 1 sends at least 8 C requests: ramp and drain stay small
WARMUP_PER_SLOT = 2  # warm-ups at concurrency C > 1: at least 2 C, so the batch reaches every width 1..C
# What decides the engine's sampling path for a request (vLLM's sampler branches on these): warm-ups
# reach every combination the split's requests use.
SAMPLING_KEYS = ("top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty",
                 "logit_bias", "logprobs", "top_logprobs", "min_tokens", "stop_token_ids", "response_format")
QUALITY_RESERVE = 32   # the search split's last requests, kept for the quality phase's greedy sample
SPLITS = ("search", "heldout")


@dataclass(frozen=True)
class Workload:
    """What one measured phase sends, and how: `num_prompts` requests, `concurrency` at a time.

    Every server instance, whatever its config, gets the same draws: its warm-ups are the first
    `warmup_requests` of the search split, its measured phase r the next `num_prompts` after them
    (the held-out split: from its start), so no request is sent twice to one server and no config
    can gain by serving a repeat from a cache (docs/traffic.md)."""
    name: str
    meter_version: int
    concurrency: int
    num_prompts: int
    warmup_requests: int
    prompt_split: str
    max_tokens: int | None = None
    ignore_eos: bool | None = None
    temperature: float | None = None
    traffic: str | None = None        # a traffic file (sandbox.traffic); None: the shipped prompt templates
    chat_template: str | None = None  # served with --chat-template for chat requests
    arrivals: str = "concurrency"     # sandbox.arrivals.parse: concurrency, rate:R[,burstiness=B][,seed=S], trace[:S]
    objective: str = "tps"            # what an instance's figure is: OBJECTIVES
    slo_ttft_p99_ms: float | None = None
    slo_itl_p99_ms: float | None = None
    slo_e2e_p99_ms: float | None = None

    def arrival_profile(self) -> Arrivals:
        return parse_arrivals(self.arrivals, f"{self.name}.arrivals")

    def slo(self) -> Slo:
        return Slo(self.slo_ttft_p99_ms, self.slo_itl_p99_ms, self.slo_e2e_p99_ms)

    def trace_times(self) -> list[float] | None:
        """The traffic file's timestamps in the file's order (every request, either split): the timing a
        trace lends its phases (sandbox.arrivals)."""
        if not self.traffic:
            return None
        times = [r.timestamp for r in _traffic(self.traffic).requests]
        return [t for t in times if t is not None] if times and None not in times else None

    def offsets(self, count: int, window: int, rate: float | None = None) -> list[float] | None:
        """When phase `window`'s requests are sent (None: closed loop at the workload's concurrency)."""
        return self.arrival_profile().offsets(count, rate, window, self.trace_times())

    def start_rate(self) -> float:
        """Where the goodput search starts: the profile's rate, or the pace of the trace's first stretch
        (the one every rate point replays) at its scale (trace:0.5: twice as fast)."""
        profile = self.arrival_profile()
        if profile.kind == "rate" and profile.rate:
            return profile.rate
        first = stretch(self.trace_times(), self.num_prompts, 0)
        return min(mean_rate(first) / profile.scale, 1000.0)

    def rate_points(self) -> int:
        """Fresh draws one server can take for the goodput search, at most 12: no request twice, and
        none of the search split's last 32, which the quality phase may send (quality_requests)."""
        first = self.warmup_count() if self.prompt_split == "search" else 0
        reserved = min(QUALITY_RESERVE, len(self.pool()) // 4) if self.prompt_split == "search" else 0
        return min(MAX_RATE_POINTS, (len(self.pool()) - first - reserved) // self.num_prompts)

    def pool(self, split: str | None = None) -> list[Request]:
        """A split's requests in their fixed order, each sampled one with its seed (built once per workload)."""
        return list(_seeded_pool(self, split or self.prompt_split))

    def requests_of(self, split: str) -> list[Request]:
        """A split's requests as written (no seeds added): what its hashes are taken over."""
        if self.traffic:
            return _traffic(self.traffic).split(split)
        return [Request("completions", {"prompt": p, "max_tokens": self.max_tokens, "temperature": self.temperature,
                                        "ignore_eos": self.ignore_eos}, i + 1)
                for i, p in enumerate(split_prompts(split))]

    def warmup_count(self) -> int:
        """Warm-ups a server gets before its first measured phase, sent at the workload's concurrency:
        the profile's warmup_requests; closed loop at concurrency C > 1 at least 2 C (the batch fills to C
        and drains through every width below), and on until they include every sampling path the
        search split's requests take (greedy or sampled, with each combination of SAMPLING_KEYS), so no
        phase is the first to run a batch width or a sampler branch (with too few warm-ups each instance's
        first phase read half its second: docs/meters-and-gate.md)."""
        count = self.warmup_requests
        if self.concurrency > 1 and not self.arrival_profile().open_loop:
            count = max(count, WARMUP_PER_SLOT * self.concurrency)
            pool = self.pool("search")
            seen = {sampling_path(r) for r in pool[:count]}
            for i, r in enumerate(pool[:len(pool) // 4]):   # within the split's first quarter
                if sampling_path(r) not in seen:
                    seen.add(sampling_path(r))
                    count = max(count, i + 1)
        return count

    def warmups(self) -> list[Request]:
        return draw(self.pool("search"), 0, self.warmup_count(), self.where("search"))

    def measured(self, repeat: int = 0) -> list[Request]:
        """Measured phase `repeat` of a server: fresh requests each time."""
        first = self.warmup_count() if self.prompt_split == "search" else 0
        return draw(self.pool(), first + repeat * self.num_prompts, self.num_prompts, self.where(self.prompt_split))

    def quality_requests(self, count: int) -> list[Request]:
        """The user's own requests for the greedy comparison: from the search split's end."""
        return list(reversed(self.pool("search")))[:count]

    def check(self, repeats: int, heldout: bool = True) -> None:
        """A split too small for `repeats` fresh phases (after the warm-ups) is refused, naming the
        minimum; heldout False: only the split this workload measures is needed (one trial's spec)."""
        search, heldout_size = len(self.pool("search")), len(self.pool("heldout"))
        closed = not self.arrival_profile().open_loop
        turns = any(r.conversation is not None for r in self.pool("search"))   # slots wait on earlier turns
        if closed and self.objective == "tps" and self.concurrency > 1 and not turns and \
                self.num_prompts < PHASE_PER_SLOT * self.concurrency:
            raise TrafficError(
                f"{self.name}: {self.num_prompts} requests a phase at concurrency {self.concurrency}: a phase needs "
                f"at least {PHASE_PER_SLOT * self.concurrency} ({PHASE_PER_SLOT} times the concurrency), or its "
                f"ramp and drain outweigh its steady window (docs/meters-and-gate.md); raise --num-prompts")
        warmups = self.warmup_count()
        need_search = warmups + (repeats * self.num_prompts if self.prompt_split == "search" else 0)
        need_heldout = repeats * self.num_prompts if heldout or self.prompt_split == "heldout" else 0
        if self.objective == "goodput":   # a goodput search: two fresh draws at least on each server
            need_search = warmups + (2 * self.num_prompts if self.prompt_split == "search" else 0)
            need_heldout = 2 * self.num_prompts if heldout or self.prompt_split == "heldout" else 0
        phases = "2 goodput rate points" if self.objective == "goodput" else f"{repeats} repeats"
        if search < need_search or heldout_size < need_heldout:
            total = len(_traffic(self.traffic).requests) if self.traffic else search + heldout_size
            raise TrafficError(
                f"{self.traffic or 'prompts.jsonl'}: {total} requests split into {search} search and {heldout_size} "
                f"held-out; {phases} of {self.num_prompts} requests need at least {need_search} search "
                f"({warmups} warm-ups first) and {need_heldout} held-out distinct requests (about "
                f"{math.ceil(max(need_search / (1 - HELDOUT_SHARE), need_heldout / HELDOUT_SHARE))} in the file; "
                f"or fewer --repeats or num_prompts)")

    def longest_output(self) -> int:
        """The largest max_tokens any phase of this workload may send (either split)."""
        return max(r.max_tokens or 0 for split in SPLITS for r in self.pool(split))

    def where(self, split: str) -> str:
        return f"{self.traffic or 'the shipped prompts'} ({split} split)"

    def summary(self) -> dict:
        """Hashes and shares of the traffic measured: no request text."""
        pool = self.requests_of(self.prompt_split)   # the split measured: its sampling mix, whichever draws
        first = self.warmup_count() if self.prompt_split == "search" else 0
        mix = shares(pool)
        out = {"split": self.prompt_split, "split_hash": keys_hash(pool),   # = the traffic file's own split hash
               "draw_hash": keys_hash(pool[first:first + self.num_prompts]), "sampled_share": mix["sampled_share"],
               "ignore_eos_share": round(1 - mix["natural_stop_share"], 3),
               "arrivals": self.arrival_profile().text(), "objective": self.objective}
        if self.traffic:
            out["traffic"] = _traffic(self.traffic).summary()
        return out

    def summary_line(self) -> str:
        pools = {split: self.pool(split) for split in SPLITS}
        every = [*pools["search"], *pools["heldout"]]
        mix = shares(every)
        sampled, natural, chat = mix["sampled_share"], mix["natural_stop_share"], round(mix["chat_share"] * len(every))
        source = Path(self.traffic).name if self.traffic else "the shipped prompt templates"
        return (f"{self.name}: {source}, {len(every)} requests ({len(pools['search'])} search, "
                f"{len(pools['heldout'])} held-out; {sampled:.0%} sampled, {natural:.0%} may stop at EOS"
                f"{f', {chat} chat' if chat else ''}), {self.num_prompts} a phase "
                + (f"({self.concurrency} in flight at most)" if self.arrival_profile().open_loop
                   else f"at concurrency {self.concurrency}")
                + ("" if self.objective == "tps" else f"; arrivals {self.arrival_profile().describe()}, objective "
                   + (f"{self.objective} (lower is better; the figure is 1000 / its ms)"
                      if latency_of(self.objective) else "goodput (the highest rate whose "
                      + ", ".join(f"{k.replace('_p99_ms', '').upper()} p99 <= {v:g} ms"
                                  for k, v in self.slo().bounds().items()) + " holds)")))

    @property
    def hash(self) -> str:
        # paths differ by host
        profile = {k: v for k, v in asdict(self).items() if k not in ("traffic", "chat_template")
                   and not (k in ARRIVAL_FIELDS and v == Workload.__dataclass_fields__[k].default)}  # older hashes hold
        payload = json.dumps({"profile": profile, "requests": [r.key for r in self.pool()],
                              "warmups": [r.key for r in self.pool("search")[:self.warmup_count()]],
                              "template": file_digest(self.chat_template) if self.chat_template else None},
                             sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def with_split(self, split: str) -> Workload:
        return Workload(**{**asdict(self), "prompt_split": split})

    def as_dict(self) -> dict:
        return asdict(self)


@functools.lru_cache(maxsize=32)
def _seeded_pool(workload: Workload, split: str) -> tuple[Request, ...]:
    return tuple(seeded(r) for r in workload.requests_of(split))


@functools.cache
def _traffic(path: str) -> Traffic:
    return load_traffic(path)


def file_digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


@dataclass(frozen=True)
class Quality:
    name: str
    perplexity_text: str
    window_tokens: int
    greedy_prompts: list[dict]
    greedy_max_tokens: int
    greedy_count: int | None = None    # the first N prompts only (None: all)
    text_path: str | None = None       # the user's own perplexity text (None: the shipped passages)

    def documents(self) -> list[str]:
        """Perplexity documents: the text's paragraphs."""
        return [p.strip() for p in self.perplexity_text.split("\n\n") if p.strip()]

    @property
    def hash(self) -> str:   # the text itself is in it; its path differs by host
        content = {k: v for k, v in asdict(self).items() if k != "text_path"}
        return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]


def sampling_path(request: Request) -> tuple:
    """Which of the engine's sampling paths a request takes: greedy or sampled, and the sampling
    parameters it sets (their values aside)."""
    body = request.body
    return (request.endpoint, request.sampled, tuple(k for k in SAMPLING_KEYS if body.get(k) not in (None, False)))


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def split_prompts(split: str) -> list[str]:
    if split not in SPLITS:
        raise ValueError(f"prompt_split {split!r} is not one of {', '.join(SPLITS)}")
    return [r["prompt"] for r in _read_jsonl(DATA / "texts" / "prompts.jsonl") if r["split"] == split]


def load_workload(ref: str | dict[str, Any]) -> Workload:
    """A workload from a shipped profile name, a YAML path, or an inline mapping. A relative traffic
    or chat_template path is read beside the YAML (a shipped profile's: under sandbox/data/traffic)."""
    raw, where, base = _profile(ref)
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping")
    unknown = sorted(set(raw) - set(WORKLOAD_FIELDS))
    if unknown:
        raise ValueError(f"{where}: unknown field {unknown[0]!r}")
    missing = sorted(k for k, (_, required) in WORKLOAD_FIELDS.items() if required and k not in raw)
    if missing:
        raise ValueError(f"{where}: missing field {missing[0]!r}")
    values = {key: _field(raw, key, kinds, where, base) for key, (kinds, _) in WORKLOAD_FIELDS.items()}
    if values["traffic"] is None:
        absent = [k for k in ("max_tokens", "ignore_eos", "temperature") if values[k] is None]
        if absent:
            raise ValueError(f"{where}: a workload without traffic needs {absent[0]!r} (the templates' requests)")
    elif any(values[k] is not None for k in ("max_tokens", "ignore_eos", "temperature")):
        raise ValueError(f"{where}: max_tokens, ignore_eos and temperature come from the traffic file's own "
                         f"requests; leave them out of a traffic workload")
    workload = Workload(**values)
    if workload.prompt_split not in SPLITS:
        raise ValueError(f"{where}.prompt_split: {workload.prompt_split!r} is not one of {', '.join(SPLITS)}")
    if workload.traffic:
        _traffic(workload.traffic)   # every request checked now, before any server starts
    check_objective(workload, where)
    return workload


def _profile(ref: str | dict[str, Any]) -> tuple[Any, str, Path]:
    """The profile's raw mapping, where it came from, and the folder its relative paths are read in."""
    if not isinstance(ref, str):
        return ref, "workload", Path.cwd()
    path = DATA / "workloads" / f"{ref}.yaml"
    if not path.exists():
        path = Path(ref)
    if not path.exists():
        shipped = sorted(p.stem for p in (DATA / "workloads").glob("*.yaml"))
        raise ValueError(f"workload {ref!r} is neither a shipped profile ({', '.join(shipped)}) nor a file")
    base = DATA / "traffic" if path.parent == DATA / "workloads" else path.parent
    return yaml.safe_load(path.read_text()), str(path), base


def _field(raw: dict, key: str, kinds: tuple, where: str, base: Path) -> Any:
    """One field's value, typed and bounded; a traffic or chat template path resolved and checked."""
    value = raw.get(key, Workload.__dataclass_fields__[key].default if key in ("arrivals", "objective") else None)
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kinds) or (int in kinds and isinstance(value, bool)):
        raise ValueError(f"{where}.{key}: {value!r} is not a {kinds[0].__name__}")
    if isinstance(value, int) and not isinstance(value, bool) and value < (0 if key == "warmup_requests" else 1):
        raise ValueError(f"{where}.{key}: {value!r} is out of range")
    if key in ("traffic", "chat_template") and value is not None:
        value = str((base / str(value)).resolve())
        if not Path(value).is_file():
            raise ValueError(f"{where}.{key}: {value} is not a file")
    return value


def check_objective(workload: Workload, where: str, arrivals_where: str | None = None) -> None:
    """The objective must be able to rank configs under the arrivals (docs/arrivals.md)."""
    profile = parse_arrivals(workload.arrivals, arrivals_where or f"{where}.arrivals")
    if workload.objective not in OBJECTIVES:
        raise ValueError(f"{where}.objective: {workload.objective!r} is not tps, goodput or a latency percentile "
                         f"(ttft, itl, e2e or tpot, then -p50, -p90 or -p99: e2e-p99)")
    if workload.objective == "tps" and profile.open_loop:
        raise ValueError(f"{where}: objective 'tps' under arrivals {workload.arrivals!r}: below saturation an "
                         f"open-loop server's tokens/s is the offered load whatever its config; use objective "
                         f"goodput or a latency percentile (e2e-p99, ttft-p90, ...)")
    if workload.objective == "goodput" and not profile.open_loop:
        raise ValueError(f"{where}: objective 'goodput' needs open-loop arrivals (rate:R or trace), not "
                         f"{workload.arrivals!r}")
    bad = next((k for k, v in workload.slo().bounds().items() if not 0 < v < math.inf), None)
    if bad:
        raise ValueError(f"{where}: slo_{bad}: {getattr(workload, f'slo_{bad}')!r} is not a positive number of "
                         f"milliseconds")
    if workload.objective == "goodput" and not workload.slo().bounds():
        raise ValueError(f"{where}: objective 'goodput' needs at least one SLO (slo_ttft_p99_ms, slo_itl_p99_ms, "
                         f"slo_e2e_p99_ms)")
    if profile.kind == "trace" and workload.traffic and workload.trace_times():
        try:
            stretch(workload.trace_times(), 2, 0)
        except ValueError as e:
            raise ValueError(f"{where}: {workload.traffic}: {e}") from None
    if profile.kind == "trace":
        requests = _traffic(workload.traffic).requests if workload.traffic else []
        untimed = next((r for r in requests if r.timestamp is None), None)
        if not requests or untimed is not None:
            raise ValueError(f"{where}: arrivals 'trace' needs a traffic file with a timestamp on each request"
                             + (f" ({workload.traffic}:{untimed.line} has none)" if untimed else ""))


def load_quality(name: str = "default", text_path: str | None = None) -> Quality:
    """A shipped quality set: 'default' (sandbox/data/quality.yaml) or 'quick' (quality-quick.yaml);
    text_path, when given, is the perplexity text instead of the shipped passages (all of it)."""
    path = DATA / ("quality.yaml" if name == "default" else f"quality-{name}.yaml")
    if not isinstance(name, str) or not path.exists():
        raise ValueError(f"quality set {name!r} is not shipped (default, quick)")
    raw = yaml.safe_load(path.read_text())
    if text_path:
        try:
            text = Path(text_path).read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"quality text {text_path}: cannot read ({e})") from None
        paragraphs = [p.strip() for p in text.split("\n\n") if p.strip()]
        if not paragraphs:
            raise ValueError(f"quality text {text_path}: no text")
    else:
        paragraphs = [p.strip() for p in (DATA / raw["perplexity_text"]).read_text().split("\n\n") if p.strip()]
        paragraphs = paragraphs[:raw.get("documents")]
    return Quality(
        name=raw["name"] + ("+text" if text_path else ""),
        perplexity_text="\n\n".join(paragraphs),
        window_tokens=int(raw["window_tokens"]),
        greedy_prompts=_read_jsonl(DATA / raw["greedy_prompts"]),
        greedy_max_tokens=int(raw["greedy_max_tokens"]),
        greedy_count=raw.get("greedy_prompts_used"),
        text_path=text_path,
    )
