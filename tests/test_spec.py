"""The trial spec is untrusted: only well-formed flags and allowlisted variables get through."""

import pytest

from sandbox import spec as specs


def test_flags_become_an_argv_tail_in_order():
    spec = specs.from_dict({"model": "m", "flags": {
        "max-num-seqs": 8, "enforce-eager": True, "enable-prefix-caching": False, "block-size": None,
        "speculative-config": {"method": "ngram", "num_speculative_tokens": 4}}})
    assert spec.server_args() == [
        "--max-num-seqs", "8", "--enforce-eager", "--no-enable-prefix-caching",
        "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}']


@pytest.mark.parametrize("flags, needle", [
    ({"port": 1}, "flags.port"),
    ({"model": "x"}, "flags.model"),
    ({"trust-remote-code": True}, "flags.trust-remote-code"),
    ({"Max_Num": 1}, "'Max_Num'"),
    ({"max-num-seqs; rm -rf /": 1}, "rm -rf"),
    ({"max-num-seqs": [1, 2]}, "[1, 2]"),
    ({"max-num-seqs": "1\n--port 80"}, "control characters"),
    ({"speculative-config": {"method": {"nested": 1}}}, "speculative-config.method"),
])
def test_bad_flags_are_refused_naming_the_key_and_value(flags, needle):
    with pytest.raises(specs.SpecError, match=None) as err:
        specs.from_dict({"model": "m", "flags": flags}, "trial.yaml")
    assert needle in str(err.value) and str(err.value).startswith("trial.yaml")


@pytest.mark.parametrize("env", [{"LD_PRELOAD": "x"}, {"OPENAI_API_KEY": "k"}, {"PATH": "/tmp"},
                                 {"VLLM_CPU_KVCACHE_SPACE": None}])
def test_environment_outside_the_allowlist_is_refused(env):
    with pytest.raises(specs.SpecError) as err:
        specs.from_dict({"model": "m", "env": env})
    assert next(iter(env)) in str(err.value)


def test_allowed_environment_is_stringified():
    spec = specs.from_dict({"model": "m", "env": {"VLLM_CPU_KVCACHE_SPACE": 2}})
    assert spec.env == {"VLLM_CPU_KVCACHE_SPACE": "2"}


@pytest.mark.parametrize("raw, needle", [
    ([1, 2], "mapping"),
    ({"model": ""}, "model"),
    ({"model": "m", "flagz": {}}, "'flagz'"),
    ({"model": "m", "workload": "nope"}, "'nope'"),
    ({"model": "m", "deadlines": {"start_s": "soon"}}, "deadlines"),
    ({"model": "m", "trust_remote_code": "yes"}, "trust_remote_code"),
    ({"model": "m", "stop_rules": {"goodput_start": 0}}, "stop_rules.goodput_start: 0 is not a request rate above 0"),
    ({"model": "m", "stop_rules": {"goodput_start": "fast"}}, "stop_rules.goodput_start: 'fast'"),
    ({"model": "m", "stop_rules": {"goodput_start": True}}, "stop_rules.goodput_start: True"),
    ({"model": "m", "stop_rules": {"prune_below": -1}}, "stop_rules.prune_below: -1 is not a figure"),
    ({"model": "m", "stop_rules": {"stop_after": 3}}, "stop_rules: unknown rule 'stop_after'"),
    ({"model": "m", "stop_rules": [1]}, "stop_rules: [1] is not a mapping"),
    ({"model": "m", "stop_rules": []}, "stop_rules: [] is not a mapping"),
    ({"model": "m", "stop_rules": 0}, "stop_rules: 0 is not a mapping"),
    ({"model": "m", "prune_below": 1.0}, "unknown key 'prune_below'"),   # a stop rule only under its name
])
def test_malformed_specs_are_refused(raw, needle):
    with pytest.raises(specs.SpecError) as err:
        specs.from_dict(raw)
    assert needle in str(err.value)


def test_unreadable_and_invalid_yaml_files_name_the_file(tmp_path):
    with pytest.raises(specs.SpecError, match="missing.yaml: cannot read"):
        specs.load(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("model: [unclosed\n")
    with pytest.raises(specs.SpecError, match="broken.yaml: not valid YAML"):
        specs.load(broken)


def test_shipped_trials_load():
    default = specs.load("sandbox/trials/default.yaml")
    assert default.model == "embedded" and default.env == {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_USE_AOT_COMPILE": "0"}
    assert specs.load("sandbox/trials/invalid.yaml").flags["max-num-seqs"] == -1
