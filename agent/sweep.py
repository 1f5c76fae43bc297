"""Ladders in the layout `vllm bench sweep serve` writes, both ways (issue 58).

`vllm bench sweep serve` writes, under its experiment folder, one folder per combination of server
and benchmark parameters, holding `run=N.json` per repeat (the `vllm bench serve` result of that run,
with `run_number` and the combination's parameters added) and `summary.json` (the list of them), and
`summary.csv` at the top. `vllm bench sweep plot` and `plot_pareto` read every `**/summary.json`, and
find the load in `max_concurrency` (closed loop) or `request_rate` (open loop).

export() writes the agent's curves so: one folder per config and load, `SERVE-<config>-BENCH-
max_concurrency=<C>` (or `request_rate=<R>`), each repeat's figures under vLLM's names (output
tokens/s is the agent's steady-window figure; total tokens/s and requests/s are over the whole
phase, as vLLM counts them) and the agent's own under `agent_*`. read() takes such a folder, the
agent's or one a user ran by hand, back into curves: one curve per config label and kind of load.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections import defaultdict
from pathlib import Path

from agent.capacity import Curve, Repeat, Rung

PERCENTILES = ("p50", "p90", "p99")
NAMES = {"ttft_ms": "ttft", "itl_ms": "itl", "latency_ms": "e2el"}   # the agent's latencies, vLLM's names


class SweepError(ValueError):
    """A folder that is not a sweep this can read; the message names the file."""


def _folder(subject: str, kind: str, load: float) -> str:
    """As vLLM names a combination's folder: "-".join(("SERVE-", serve, "BENCH-", bench))."""
    name = f"SERVE--{subject}-BENCH--{'max_concurrency' if kind == 'concurrency' else 'request_rate'}={load:g}"
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", name)


FOLDER = re.compile(r"^(?:SERVE--(?P<serve>.*?)-)?BENCH--")


def _devices(data: dict, default: int) -> int:
    """The devices one server of the record took: the agent's count, else vLLM's parallel sizes."""
    if data.get("agent_devices"):
        return int(data["agent_devices"])
    sizes = [data.get(k) for k in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")]
    product = math.prod(int(x) for x in sizes if isinstance(x, (int, float)) and x)
    return product if any(isinstance(x, (int, float)) and x for x in sizes) else default


def record(curve: Curve, rung: Rung, number: int, repeat: Repeat, model: str) -> dict:
    """One repeat as `vllm bench serve --save-result` writes it, with the sweep's additions."""
    closed = curve.kind == "concurrency"
    data: dict = {
        "backend": "openai", "label": curve.subject, "model_id": model, "num_prompts": repeat.requests + repeat.errors,
        "request_rate": "inf" if closed else rung.load, "burstiness": 1.0,
        "max_concurrency": int(rung.load) if closed else None,
        "duration": repeat.duration_s, "completed": repeat.requests, "failed": repeat.errors,
        "total_input_tokens": repeat.input_tokens, "total_output_tokens": repeat.output_tokens,
        "request_throughput": repeat.request_rate, "output_throughput": repeat.output_tps,
        "total_token_throughput": repeat.total_tps, "run_number": number, "config": curve.subject,
        "agent_subject": curve.subject, "agent_kind": curve.kind, "agent_load": rung.load,
        "agent_devices": curve.devices, "agent_stopped": curve.stopped,
    }
    for ours, theirs in NAMES.items():
        figures = getattr(repeat, ours)
        if "mean" in figures:
            data[f"mean_{theirs}_ms"] = figures["mean"]
        if "p50" in figures:
            data[f"median_{theirs}_ms"] = figures["p50"]
        for p in PERCENTILES:
            if p in figures:
                data[f"{p}_{theirs}_ms"] = figures[p]
        data[f"agent_{theirs}_n"] = figures.get("n")
    return data


def export(curves: list[Curve], out: Path, model: str) -> list[Path]:
    """Write the curves as a sweep; the summary.json files written."""
    out.mkdir(parents=True, exist_ok=True)
    written, rows = [], []
    for curve in curves:
        for rung in curve.rungs:
            folder = out / _folder(curve.subject, curve.kind, rung.load)
            folder.mkdir(parents=True, exist_ok=True)
            records = [record(curve, rung, i, r, model) for i, r in enumerate(rung.repeats)]
            for i, data in enumerate(records):
                (folder / f"run={i}.json").write_text(json.dumps(data, indent=4) + "\n")
            (folder / "summary.json").write_text(json.dumps(records, indent=4) + "\n")
            written.append(folder / "summary.json")
            rows += records
    columns = sorted({k for r in rows for k in r})
    with (out / "summary.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["", *columns])
        writer.writeheader()
        for i, r in enumerate(rows):
            writer.writerow({"": i, **r})
    return written


def _number(data: dict, key: str, where: str) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise SweepError(f"{where}: {key} is {value!r}, not a number") from None


def _latency(data: dict, theirs: str, where: str) -> dict:
    figures = {}
    for ours, key in (("p50", f"median_{theirs}_ms"), ("p50", f"p50_{theirs}_ms"), ("p90", f"p90_{theirs}_ms"),
                      ("p99", f"p99_{theirs}_ms"), ("mean", f"mean_{theirs}_ms")):
        value = _number(data, key, where)
        if value is not None and ours not in figures:
            figures[ours] = value
    n = data.get(f"agent_{theirs}_n", data.get("completed") if theirs != "itl" else None)
    if figures and n is not None:
        figures["n"] = int(n)
    return figures


def read(folder: Path, devices: int = 1) -> list[Curve]:
    """Every run recorded in a sweep folder's summary.json files, as curves: one per config (the
    agent's label, else the folder's serve parameters, else the run's label) and kind of load: open
    loop wherever request_rate is finite (a rate sweep may cap its concurrency too). devices: a
    server's devices where a record names none (neither the agent's count nor vLLM's parallel sizes)."""
    found = sorted(folder.rglob("summary.json"))
    if not found:
        raise SweepError(f"{folder}: no summary.json under it (a `vllm bench sweep serve` output folder has one "
                         f"per load point)")
    groups: dict[tuple[str, str], dict[float, list[tuple[int, Repeat]]]] = defaultdict(lambda: defaultdict(list))
    extra: dict[tuple[str, str], tuple[str, int]] = {}
    for path in found:
        try:
            records = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise SweepError(f"{path}: not JSON ({e})") from None
        if not isinstance(records, list):
            raise SweepError(f"{path}: a summary.json holds a list of runs, not {type(records).__name__}")
        for i, data in enumerate(records):
            where = f"{path}[{i}]"
            if not isinstance(data, dict):
                raise SweepError(f"{where}: not a JSON object")
            named = FOLDER.match(path.parent.name)
            subject = str(data.get("agent_subject") or (named and named["serve"]) or data.get("label") or "sweep")
            streams, rate = _number(data, "max_concurrency", where), data.get("request_rate")
            rate = None if rate in (None, "inf") else _number(data, "request_rate", where)
            if rate is not None and math.isinf(rate):
                rate = None
            if streams is None and rate is None:
                raise SweepError(f"{where}: neither max_concurrency nor a finite request_rate: no load to place "
                                 f"it at")
            kind, load = ("rate", rate) if rate is not None else ("concurrency", streams)
            assert load is not None
            needed = ("output_throughput", "total_token_throughput", "request_throughput", "duration", "completed")
            if missing := [k for k in needed if data.get(k) is None]:
                raise SweepError(f"{where}: no {', '.join(missing)}")
            repeat = Repeat(
                output_tps=float(data["output_throughput"]), total_tps=float(data["total_token_throughput"]),
                request_rate=float(data["request_throughput"]), input_tokens=int(data.get("total_input_tokens") or 0),
                output_tokens=int(data.get("total_output_tokens") or 0), requests=int(data["completed"]),
                duration_s=float(data["duration"]), ttft_ms=_latency(data, "ttft", where),
                itl_ms=_latency(data, "itl", where), latency_ms=_latency(data, "e2el", where),
                errors=int(data.get("failed") or 0))
            groups[(subject, kind)][float(load) if kind == "rate" else int(load)].append(
                (int(data.get("run_number") or 0), repeat))
            extra[(subject, kind)] = (str(data.get("agent_stopped") or ""), _devices(data, devices))
    curves = []   # the defaults first (what the table's ratios are to), then by name
    for (subject, kind), rungs in sorted(groups.items(), key=lambda g: (g[0][0] != "defaults", g[0])):
        stopped, devices = extra[(subject, kind)]
        curves.append(Curve(subject, kind, tuple(Rung(load, tuple(r for _, r in sorted(repeats, key=lambda x: x[0])))
                                                 for load, repeats in sorted(rungs.items())), stopped, devices))
    return curves
