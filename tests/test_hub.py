"""A model given by Hub id: fetched once from a real HTTP endpoint (HF_ENDPOINT), then found offline."""

import os
import subprocess
import sys

import pytest
import yaml
from fake_hub import SHA, FakeHub

from agent import hub, proposal
from agent.ledger import Run, Trial
from sandbox.failures import classify_log

pytestmark = pytest.mark.process   # starts processes (tests/conftest.py: not in `pytest -m unit`)

@pytest.fixture
def endpoint(tmp_path, monkeypatch):
    server = FakeHub()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    yield server
    server.close()


def test_a_hub_id_is_fetched_once_at_a_commit_and_found_again_offline(endpoint):
    said = []
    fetched = hub.fetch("org/tiny", say=said.append)
    assert fetched.revision == SHA and fetched.path.endswith(f"models--org--tiny/snapshots/{SHA}")
    # what vLLM loads, not the .bin duplicate of the weights
    assert sorted(os.listdir(fetched.path)) == ["config.json", "model.safetensors", "tokenizer_config.json"]
    assert any("org/tiny" in s and endpoint.url in s for s in said)
    endpoint.close()   # the network is gone: a resume finds the same snapshot by its commit
    assert hub.fetch("org/tiny", SHA, offline=True) == fetched


@pytest.mark.parametrize("model, words", [
    ("org/gated", ["'org/gated' is gated", "HF_TOKEN"]),
    ("org/missing", ["'org/missing' is not on", "set HF_TOKEN"]),
])
def test_a_model_the_hub_refuses_is_named_with_what_to_do(endpoint, model, words):
    with pytest.raises(hub.ModelUnavailable) as e:
        hub.fetch(model)
    assert all(w in str(e.value) for w in words) and "\n" not in str(e.value)


def test_an_unreachable_hub_and_an_empty_cache_say_so(endpoint):
    endpoint.close()
    with pytest.raises(hub.ModelUnavailable, match="not in the Hugging Face cache, and .* cannot be reached"):
        hub.fetch("org/tiny")


def test_the_cli_refuses_an_unavailable_model_before_the_run_starts(endpoint, tmp_path):
    env = {**os.environ, "AGENT_HOME": str(tmp_path / "home")}
    proc = subprocess.run([sys.executable, "-m", "agent.cli", "run", "--model", "org/gated", "--budget", "1m"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1].startswith("error: --model: model 'org/gated' is gated")
    assert not (tmp_path / "home" / "ledger.sqlite").exists() or "org/gated" not in \
        subprocess.run([sys.executable, "-m", "agent.cli", "ledger", "--json"], capture_output=True, text=True,
                       env=env).stdout


def test_ids_and_not_ids():
    assert hub.is_hub_id("google/gemma-3-270m") and hub.is_hub_id("Org_1/model.v2")
    for bad in ("gemma", "a/b/c", "/abs/path", "org/$(reboot)", 'org/"x"', "org/na me", "org/é"):
        assert not hub.is_hub_id(bad), bad


def test_the_branch_serves_the_commit_that_was_measured():
    run = Run(id="r", model="org/tiny", model_revision=SHA)
    trial = Trial(number=3, source="sampler", flags={"max-num-seqs": 8}, env={}, meter={})
    files = proposal.files(run, trial)
    assert "model=org/tiny\n" in files["serving/launch.sh"][0]
    assert f'--model "$model" --revision {SHA} ' in files["serving/launch.sh"][0]
    assert f'"model_revision": "{SHA}"' in files["serving/results.json"][0]
    deployment = next(d for d in yaml.safe_load_all(files["serving/k8s.yaml"][0]) if d["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "org/tiny" and args[args.index("--revision") + 1] == SHA


def test_an_offline_trial_that_cannot_find_its_model_has_a_class_of_its_own():
    log = ("huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an appropriate cached snapshot folder "
           "for the specified revision on the local disk and outgoing traffic has been disabled. To enable "
           "repo look-ups and downloads online, pass 'local_files_only=False' as input.\n"
           "ValueError: something the engine raised while giving up")
    assert classify_log(log) == "model_unavailable"


def test_a_draft_given_by_hub_id_is_fetched_before_the_run_and_served_from_its_commits_snapshot(endpoint):
    """Before, a --draft-model Hub id went into the space as the id: never fetched, never pinned, so
    trials offline could not load it and a later commit could change what was measured."""
    from agent.request import RunError, draft_ready

    path = draft_ready("org/tiny", say=print)
    assert path.endswith(f"models--org--tiny/snapshots/{SHA}") and os.path.isdir(path)
    endpoint.close()   # offline from here: the trials load the folder
    assert "model.safetensors" in os.listdir(path)
    with pytest.raises(RunError) as e:   # a draft the Hub refuses stops the run before it starts, in one line
        draft_ready("org/gated", say=print)
    assert e.value.code == 2 and "--draft-model" in str(e.value)
