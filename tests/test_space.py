"""Search-space files: loaded and checked, sampled by Optuna, points validated and mapped to a spec."""

import optuna
import pytest

from agent import space as spaces
from sandbox import spec as specs


@pytest.mark.parametrize("name", ["vllm-cpu", "vllm-gpu"])
def test_shipped_spaces_load_and_every_sample_is_a_valid_spec(name):
    space = spaces.load(name)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(50):
        trial = study.ask()
        point = space.sample(trial)
        assert [p for p in space.problems(point) if not p.startswith("rule")] == []
        flags, env = space.to_flags_env(point)
        specs.from_dict({"model": "m", "flags": flags, "env": env})  # the worker would accept it
        study.tell(trial, 1.0)


def test_conditional_knobs_only_where_they_apply():
    space = spaces.load("vllm-cpu")
    off = {"speculative-config.method": "none", "speculative-config.num_speculative_tokens": 4}
    assert any("only applies when" in p for p in space.problems(off))
    flags, _ = space.to_flags_env({"speculative-config.method": "none"})
    assert "speculative-config" not in flags
    flags, _ = space.to_flags_env({"speculative-config.method": "ngram",
                                   "speculative-config.num_speculative_tokens": 4})
    assert flags["speculative-config"] == {"method": "ngram", "num_speculative_tokens": 4}


def test_fixed_part_reaches_every_trial_and_env_knobs_go_to_env():
    space = spaces.load("vllm-cpu")
    flags, env = space.to_flags_env({"VLLM_CPU_OMP_THREADS_BIND": "auto", "max-num-seqs": 4})
    assert flags == {"max-num-seqs": 4}   # no max-model-len: the run serves the one the branch ships
    assert env == {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_USE_AOT_COMPILE": "0", "VLLM_CPU_OMP_THREADS_BIND": "auto"}


def test_rules_and_bounds():
    space = spaces.load("vllm-cpu")
    assert space.broken_rules({"max-num-seqs": 64, "max-num-batched-tokens": 32})
    assert not space.broken_rules({"max-num-seqs": 64, "max-num-batched-tokens": 4096})
    # Without chunked prefill a step holds a whole prompt of the context the run serves (max-model-len,
    # fixed by the run): the rule names the fixed flag; with none fixed it has nothing to compare.
    assert not space.broken_rules({"enable-chunked-prefill": False, "max-num-batched-tokens": 4096})
    served = space.with_fixed_flag("max-model-len", 8192)
    assert served.broken_rules({"enable-chunked-prefill": False, "max-num-batched-tokens": 4096})
    assert not served.broken_rules({"enable-chunked-prefill": False, "max-num-batched-tokens": 8192})
    assert space.problems({"max-num-seqs": 0}) == ["max-num-seqs: 0 is outside [1, 256]"]
    assert space.problems({"port": 80}) == [f"port: not a knob of {space.path}"]
    assert space.problems({"enforce-eager": "yes"}) == ["enforce-eager: 'yes' is not true or false"]


def test_lossless_claims_count_only_knobs_that_differ_from_the_engine_defaults():
    space = spaces.load("vllm-cpu", cpu_flags={"avx512f"})
    defaults = {"dtype": ["auto", "bfloat16"], "kv-cache-dtype": ["auto"], "max-num-seqs": None}
    assert space.lossless({"max-num-seqs": 4, "enforce-eager": True}, defaults)
    assert not space.lossless({"max-num-seqs": 4, "kv-cache-dtype": "fp8_e5m2"}, defaults)
    # A sampled point names every knob: lossy knobs left at their defaults change nothing.
    assert space.lossless({"max-num-seqs": 4, "kv-cache-dtype": "auto", "dtype": "bfloat16"}, defaults)
    assert not space.lossless({"dtype": "float32"}, defaults)
    # A default that could not be read counts as a change.
    assert not space.lossless({"kv-cache-dtype": "auto"}, {})
    assert space.changed({"max-num-seqs": 4, "dtype": "bfloat16"}, defaults) == ["max-num-seqs"]


@pytest.mark.parametrize("body, needle", [
    ("knobs: {max-num-seqs: {type: int, low: one, high: 8, lossless: true}}", "knobs.max-num-seqs.low: 'one'"),
    ("knobs: {max-num-seqs: {type: integer, low: 1, high: 8, lossless: true}}", "knobs.max-num-seqs.type"),
    ("knobs: {max-num-seqs: {type: int, low: 1, high: 8}}", "knobs.max-num-seqs.lossless"),
    ("knobs: {max-num-seqs: {type: int, low: 1, high: 8, lossless: true, hgih: 9}}", "'hgih'"),
    ("knobs: {LD_PRELOAD: {type: categorical, choices: [x], target: env, lossless: true}}", "LD_PRELOAD"),
    ("knobs: {a: {type: bool, lossless: true, when: {b: 1}}}", "knobs.a.when"),
    ("knobs: {a: {type: bool, lossless: true}}\nrules: [{require: [a, '~', 1]}]", "rules[0].require"),
    ("knobs: [oops", "not valid YAML"),
    ("fixed: {flags: {port: 1}}\nknobs: {}", "fixed.flags.port"),
    ("noise_prior: {sd: 6, df: 4}\nknobs: {}", "noise_prior: {'sd': 6, 'df': 4}"),
    ("noise_prior: {sd: 0.06, df: 4.5}\nknobs: {}", "noise_prior"),
    ("noise_prior: {sd: 0.06}\nknobs: {}", "noise_prior"),
])
def test_broken_space_files_name_file_key_and_problem(tmp_path, body, needle):
    path = tmp_path / "space.yaml"
    path.write_text(body)
    with pytest.raises(spaces.SpaceError) as err:
        spaces.load(path)
    assert str(err.value).startswith(str(path)) and needle in str(err.value)


def test_the_noise_prior_is_read_and_kept_out_of_the_spaces_hash(tmp_path):
    shipped = spaces.load("vllm-cpu")
    assert shipped.noise_prior == (0.07, 4) and spaces.load("vllm-gpu").noise_prior == (0.10, 4)
    without = tmp_path / "without.yaml"
    without.write_text("\n".join(line for line in (spaces.SPACES / "vllm-cpu.yaml").read_text().splitlines()
                                 if not line.startswith("noise_prior:")) + "\n")
    bare = spaces.load(without)
    # A run started before the prior existed resumes: the same space, by hash, with or without it.
    assert bare.noise_prior == (0.0, 0) and bare.hash == shipped.hash


def test_choices_the_host_cannot_run_are_left_out_before_the_search():
    bare = spaces.load("vllm-cpu", cpu_flags={"sse4_2", "avx2"})
    assert bare.knobs["kv-cache-dtype"].choices == ("auto",)
    assert bare.problems({"kv-cache-dtype": "fp8_e5m2"})   # a planner cannot bring it back either
    avx512 = spaces.load("vllm-cpu", cpu_flags={"avx2", "avx512f"})
    assert "fp8_e5m2" in avx512.knobs["kv-cache-dtype"].choices


def test_one_knob_starts_change_exactly_one_knob_from_the_engine_defaults():
    space = spaces.load("vllm-cpu", cpu_flags={"avx512f"})
    defaults = {"enforce-eager": [False], "block-size": None, "speculative-config.method": ["none"],
                "VLLM_CPU_OMP_THREADS_BIND": ["auto"], "dtype": ["auto", "bfloat16"]}
    points = space.near_defaults(defaults, seed=1)
    assert points and all(space.problems(p) == [] for p in points)
    assert {"enforce-eager": True} in points and {"enforce-eager": False} not in points
    assert {"dtype": "bfloat16"} not in points and {"dtype": "float32"} in points
    ngram = [p for p in points if p.get("speculative-config.method") == "ngram"]
    assert len(ngram) == 1 and len(ngram[0]) == 4   # its conditional knobs come along, at mid-range
    assert all(len(p) == 1 for p in points if p not in ngram)
    assert points != space.near_defaults(defaults, seed=2) and sorted(map(repr, points)) == sorted(
        map(repr, space.near_defaults(defaults, seed=2)))   # the same points, in a seeded order


def test_a_front_end_flag_reaches_vllm_serves_argv_and_only_a_cuda_space_may_hold_one(tmp_path, monkeypatch):
    """api-server-count acts in `vllm serve` alone (it starts API server processes), outside the engine
    config the knob test reads back: the GPU space marks it target serve, its value reaches the argv of
    the launcher the worker uses for the CUDA build, and a space for vllm-cpu (whose module launcher
    ignores it) is refused. On an H100 the flag started 4 APIServer processes (docs/history.md)."""
    from sandbox import server as servers

    gpu = spaces.load("vllm-gpu")
    assert gpu.knobs["api-server-count"].target == "serve" and "api-server-count" not in spaces.load("vllm-cpu").knobs
    flags, _ = gpu.to_flags_env({"api-server-count": 4, "stream-interval": 8})
    monkeypatch.setattr(servers.host, "engine", lambda: {"name": "vllm", "version": "0.26.0"})
    server = servers.Server("/models/m", specs.argv_of(flags), {}, tmp_path / "log")
    argv = server.argv
    assert argv[1:4] == list(servers.SERVE_LAUNCHER) and argv[4] == "/models/m"
    assert argv[argv.index("--api-server-count") + 1] == "4" and argv[argv.index("--stream-interval") + 1] == "8"
    assert gpu.problems({"api-server-count": 9}) and gpu.problems({"api-server-count": "4; rm -rf /"})
    cpu_text = (spaces.SPACES / "vllm-cpu.yaml").read_text().replace(
        "knobs:\n", "knobs:\n  api-server-count: {type: int, low: 1, high: 4, lossless: true, target: serve}\n", 1)
    (tmp_path / "cpu.yaml").write_text(cpu_text)
    with pytest.raises(spaces.SpaceError, match=r"knobs.api-server-count: target serve needs engine vllm"):
        spaces.load(tmp_path / "cpu.yaml")
