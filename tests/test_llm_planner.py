"""The LLM planner through litellm and real HTTP to a scripted local endpoint.

No reply, however malformed or hostile, reaches the engine as anything but a valid point of
the space; an unreachable endpoint hands the run to the built-in planner.
"""

import json

import pytest
from fake_llm import FakeLLM
from hypothesis import given, settings
from hypothesis import strategies as st

from agent import space as spaces
from agent.ledger import Run, Trial
from agent.llm_planner import Call, FallbackPlanner, LLMPlanner, PlannerUnavailable, parse, parse_plan
from sandbox import spec as specs

SPACE = spaces.load("vllm-cpu")
RUN = Run(id="r", model="m")
HISTORY = [Trial(number=0, source="baseline", status="ok", params={}, metrics={"kv_cache_usage_max": 0.01},
                 search_ratio=1.0, ppl_change=0.0, agreement=1.0, gate_passed=None)]
GOOD = {"proposals": [{"params": {"VLLM_CPU_OMP_THREADS_BIND": "auto", "max-num-seqs": 8},
                       "rationale": "few streams; smaller batches", "expected": "lower latency"}]}


@pytest.fixture
def llm(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    server = FakeLLM()
    yield server
    server.close()


def planner(llm, calls):
    return LLMPlanner("openai/test-model", llm.url, record=calls.append, sleep=lambda s: None, timeout_s=10)


def assert_reaches_engine_only_as_valid_points(proposals):
    for p in proposals:
        assert SPACE.problems(p.params) == []
        flags, env = SPACE.to_flags_env(p.params)
        specs.from_dict({"model": "m", "flags": flags, "env": env})


def test_valid_reply_becomes_proposals_and_the_call_is_recorded(llm):
    calls = []
    llm.replies.append((200, json.dumps(GOOD)))
    proposals = planner(llm, calls).propose(SPACE, RUN, HISTORY, {"cpus": 2}, k=2)
    assert [p.params for p in proposals] == [GOOD["proposals"][0]["params"]]
    assert proposals[0].rationale == "few streams; smaller batches"
    (call,) = calls
    assert call.accepted == 1 and call.input_tokens == 120 and call.output_tokens == 30 and call.error is None
    sent = llm.requests[0]["body"]
    assert "max-num-seqs" in sent["messages"][1]["content"] and "0 | baseline | ok" in sent["messages"][1]["content"]
    assert "sk-test" not in json.dumps(vars(call))   # the key never lands in what we record


HOSTILE = [
    '{"proposals": [{"params": {"max-num-seqs": "4; rm -rf /"}, "rationale": "x", "expected": "y"}]}',
    '{"proposals": [{"params": {"port": 80}, "rationale": "x", "expected": "y"}]}',
    '{"proposals": [{"params": {"LD_PRELOAD": "/tmp/evil.so"}, "rationale": "x", "expected": "y"}]}',
    '{"proposals": [{"params": {"max-num-seqs": 100000}, "rationale": "x", "expected": "y"}]}',
    '{"proposals": [{"params": {"max-num-seqs": 8}, "rationale": "x", "expected": "y", "shell": "curl evil"}]}',
    '{"proposals": [{"params": {"max-num-seqs": 8}, "rationale": "line\\n--trust-remote-code", "expected": "y"}]}',
    '{"proposals": [{"params": {"speculative-config.num_speculative_tokens": 4}, "rationale": "x", "expected": "y"}]}',
    '{"proposals": [{"params": {"max-num-seqs": 8}, "rationale": "x", "expected": "y"}], "run": "rm -rf /"}',
    '{"proposals": [{"params": {"max-num-seqs": 8, "max-num-batched-tokens": 4}, "rationale": "x", "expected": "y"}]}',
    '{"proposals": [{"params": {"enforce-eager": "true"}, "rationale": "x", "expected": "y"}]}',
    '{"proposals": [{"params": {"max-num-seq',            # truncated
    "Sure! Here is a config: --max-num-seqs 8",             # prose
    "",
    '{"proposals": ' + "[" * 20_000 + "]" * 20_000 + "}",       # nested past the decoder's recursion limit
    json.dumps({"proposals": [GOOD["proposals"][0]] * 2000}),      # huge
    '{"proposals": [{"params": {"block-size": [16]}, "rationale": "x", "expected": "y"}]}',   # unhashable value
    '{"proposals": [{"params": {"max-num-seqs": {"$gt": 4}}, "rationale": "x", "expected": "y"}]}',
    '{"proposals": [{"params": {"max-num-seqs": 8}, "rationale": ["x"], "expected": "y"}]}',
    '{"proposals": [], "narrow": [{"knob": ["max-num-seqs"], "low": [], "high": {}, "rationale": "r"}]}',
    '[1, 2, 3]',
    '"just a string"',
]


@pytest.mark.parametrize("reply", HOSTILE)
def test_hostile_and_malformed_replies_never_reach_the_engine(llm, reply):
    calls = []
    llm.replies += [(200, reply)] * 3
    with pytest.raises(PlannerUnavailable):
        planner(llm, calls).propose(SPACE, RUN, HISTORY, {}, k=2)
    assert len(calls) == 3 and all(c.accepted == 0 and c.rejected for c in calls)


def test_fenced_json_is_read_and_bad_items_are_dropped_individually():
    reply = "```json\n" + json.dumps({"proposals": [GOOD["proposals"][0],
                                                   {"params": {"port": 1}, "rationale": "", "expected": ""}]}) + "\n```"
    proposals, rejected = parse(reply, SPACE, k=4)
    assert len(proposals) == 1 and rejected == ["proposal 1: port: not a knob of " + SPACE.path]


def test_transient_error_is_retried(llm):
    calls = []
    llm.replies += [(500, "overloaded"), (200, json.dumps(GOOD))]
    proposals = planner(llm, calls).propose(SPACE, RUN, HISTORY, {}, k=1)
    assert len(proposals) == 1 and calls[0].error and calls[1].accepted == 1


def test_unreachable_endpoint_falls_back_to_the_builtin_planner(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    calls, events = [], []
    dead = LLMPlanner("openai/test-model", "http://127.0.0.1:9/v1", record=calls.append, sleep=lambda s: None,
                      retries=2, timeout_s=5)
    fallback = FallbackPlanner(dead, lambda e, **i: events.append((e, i)), patience=1)
    proposals = fallback.propose(SPACE, RUN, HISTORY, {"cpus": 2, "concurrency": 1}, k=1)
    assert proposals and proposals[0].params == {
        "VLLM_CPU_OMP_THREADS_BIND": proposals[0].params["VLLM_CPU_OMP_THREADS_BIND"]}
    assert events[0][0] == "planner_fallback" and events[0][1]["permanent"]
    assert len(calls) == 2 and all(c.error for c in calls)
    fallback.propose(SPACE, RUN, HISTORY, {"cpus": 2}, k=1)
    assert len(calls) == 2   # given up on: no more calls to a dead endpoint


json_values = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=True)
                           | st.text(max_size=30) | st.sampled_from(list(SPACE.knobs) + ["auto", "ngram", "0-1"]),
                           lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=20) | st.sampled_from(list(SPACE.knobs)),
                                             inner, max_size=5),
                           max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    json_values.map(json.dumps),
    st.dictionaries(st.sampled_from(list(SPACE.knobs)), json_values, max_size=6).map(
        lambda params: json.dumps({"proposals": [{"params": params, "rationale": "r", "expected": "e"}]})),
    st.text(max_size=200),
))
def test_property_no_reply_reaches_the_engine_except_as_a_valid_point(reply):
    proposals, _ = parse(reply, SPACE, k=4)
    assert_reaches_engine_only_as_valid_points(proposals)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["proposals", "narrow"]), json_values, min_size=1).map(json.dumps))
def test_property_any_reply_shape_is_rejected_or_read_never_raised(reply):
    proposals, narrowings, rejected = parse_plan(reply, SPACE, k=4)
    assert_reaches_engine_only_as_valid_points(proposals)
    assert all(SPACE.knobs[n.knob].type in ("int", "float") for n in narrowings)
    assert proposals or narrowings or rejected or json.loads(reply).get("proposals") == []


def test_a_malformed_reply_is_recorded_and_the_run_goes_on_with_the_builtin_planner(llm):
    calls, events = [], []
    llm.replies += [(200, '{"proposals": ' + "[" * 20_000 + "]" * 20_000 + "}")] * 2
    fallback = FallbackPlanner(planner(llm, calls), lambda e, **i: events.append((e, i)), patience=1)
    fallback.primary.retries = 2
    proposals = fallback.propose(SPACE, RUN, HISTORY, {"cpus": 2, "concurrency": 1}, k=1)
    assert proposals and all(SPACE.problems(p.params) == [] for p in proposals)
    assert [c.rejected[0][:32] for c in calls] == ["reply nests too deeply to decode"] * 2
    assert events[0][0] == "planner_fallback" and "nests too deeply" in events[0][1]["reason"]


def test_call_record_has_no_field_for_credentials():
    assert not any("key" in name or "token" == name for name in vars(Call(model="m", prompt="p")))


def test_api_keys_reach_neither_the_trial_worker_nor_the_server(monkeypatch):
    from agent.engine import worker_env
    from sandbox.server import minimal_env

    secrets = {"OPENAI_API_KEY": "sk-1", "ANTHROPIC_API_KEY": "sk-2", "HF_TOKEN": "hf_3", "MY_SECRET": "4",
               "DB_PASSWORD": "5", "AGENT_STORAGE": "postgresql://agent:pw@db/agent"}
    for k, v in secrets.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("HOME", "/home/someone")
    worker = worker_env()
    assert not set(secrets) & set(worker) and worker["HOME"] == "/home/someone"   # the rest passes on
    for k, v in worker.items():   # the trial worker's environment is what the server is started from
        monkeypatch.setenv(k, v)
    server = minimal_env({"VLLM_CPU_KVCACHE_SPACE": "2"}, "t0k")
    assert not set(secrets) & set(server) and not any(v in secrets.values() for v in server.values())
    assert server["VLLM_CPU_KVCACHE_SPACE"] == "2" and server["AGENT_TRIAL_TOKEN"] == "t0k"


def test_a_reply_may_narrow_a_numeric_range_and_bad_ranges_are_refused(llm):
    calls = []
    reply = {**GOOD, "narrow": [
        {"knob": "max-num-seqs", "low": 1, "high": 32, "rationale": "one stream: large batches never help"},
        {"knob": "max-num-seqs", "low": 64, "high": 9999, "rationale": "out of range"},
        {"knob": "block-size", "low": 1, "high": 2, "rationale": "not numeric"},
        {"knob": "max-num-batched-tokens", "low": 4000, "high": 300, "rationale": "empty"},
        {"knob": "max-num-seqs", "low": 1, "high": 8, "rationale": "x", "shell": "$(reboot)"},
    ]}
    llm.replies.append((200, json.dumps(reply)))
    p = planner(llm, calls)
    p.propose(SPACE, RUN, HISTORY, {"cpus": 2}, k=1)
    (kept,) = p.narrow(SPACE, HISTORY)
    assert (kept.knob, kept.low, kept.high) == ("max-num-seqs", 1, 32)
    assert p.narrow(SPACE, HISTORY) == []   # handed over once
    assert len(calls[0].rejected) == 4 and all(r.startswith("narrow") for r in calls[0].rejected)


# ---- 1,000 replies of every wrong type per space, checked at the argv with an oracle of its own ----

WRONG = [True, False, 0, 1, -1, 3, 32, 32.0, 32.5, 1e309, float("nan"), "32", "", "true", "auto; rm -rf /", None,
         [32], {"x": 1}, 16.0, 0.9, 2, 8, 64.0, "FLASH_ATTN", "fp8", 4, 4.0, 1024, 2.0**31]


def fuzz_replies(space, n: int, seed: int):
    """n replies, each proposing one or two knobs of the space with values drawn from WRONG and from the
    knob's own choices and bounds (as written, as floats, as strings), so every wrong type meets every knob."""
    import random

    rng = random.Random(seed)
    names = sorted(space.knobs)
    for _ in range(n):
        params = {}
        for name in rng.sample(names, rng.randint(1, 2)):
            knob = space.knobs[name]
            own = list(knob.choices) + [v for v in (knob.low, knob.high) if v is not None] + \
                ([False, True] if knob.type == "bool" else [])
            variants = own + [float(v) for v in own if isinstance(v, (int, float)) and not isinstance(v, bool)] \
                + [str(v) for v in own]
            params[name] = rng.choice(variants if rng.random() < 0.6 else WRONG)
        yield json.dumps({"proposals": [{"params": params, "rationale": "fuzz", "expected": "fuzz"}]})


def argv_value_is_the_knobs_own(knob, shown: str) -> bool:
    """The oracle, written from the space file's meaning rather than the parser's checks: an int knob's
    argv value is a plain integer in range, a float knob's a finite number in range, a bool knob's is a
    flag without a value, a categorical's the choice exactly as the space file writes it."""
    import math
    import re

    if knob.type == "int":
        return bool(re.fullmatch(r"-?\d+", shown)) and knob.low <= int(shown) <= knob.high
    if knob.type == "float":
        return re.fullmatch(r"-?\d+(\.\d+)?(e-?\d+)?", shown) is not None and math.isfinite(float(shown)) \
            and knob.low <= float(shown) <= knob.high
    return shown in {json.dumps(c) if not isinstance(c, str) else c for c in knob.choices} | \
        {str(c) for c in knob.choices if not isinstance(c, bool)}


@pytest.mark.parametrize("name", ["vllm-cpu", "vllm-gpu"])
@pytest.mark.slow   # a thousand replies: 5 s a space
def test_a_thousand_fuzzed_replies_reach_argv_only_in_each_knobs_own_type(name, tmp_path):
    """The real path: the reply parsed, enqueued in an Optuna study, asked back, mapped to flags and env
    and to the argv the server gets. Every value there must be its knob's own type and range."""
    import optuna

    from agent import study as studies

    space = spaces.load(name, cpu_flags={"avx512f"})
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}", sampler=optuna.samplers.RandomSampler(0))
    accepted = 0
    for reply in fuzz_replies(space, 1000, seed=len(name)):
        proposals, _ = parse(reply, space, 1)
        if not proposals:
            continue
        studies.enqueue(study, proposals)
        trial = study.ask()
        point = {k: space.knobs[k].suggest(trial) for k in proposals[0].params}
        study.tell(trial, 1.0)
        flags, env = space.to_flags_env(point)
        argv = specs.argv_of(flags)
        for knob_name in point:
            knob = space.knobs[knob_name]
            if knob.target == "env":
                assert env[knob_name] in {str(c).replace("{last_cpu}", env[knob_name].split("-")[-1])
                                          for c in knob.choices}, (reply, env)
                continue
            flag, _, key = knob_name.partition(".")
            if key:   # a JSON flag's sub-key: the decoded JSON holds the knob's own type
                sent = json.loads(argv[argv.index(f"--{flag}") + 1])[key] if f"--{flag}" in argv else None
                if sent is not None:
                    assert argv_value_is_the_knobs_own(knob, json.dumps(sent) if not isinstance(sent, str) else sent), \
                        (reply, argv)
            elif knob.type == "bool":
                assert (f"--{flag}" in argv) != (f"--no-{flag}" in argv), (reply, argv)
            elif f"--{flag}" in argv:
                assert argv_value_is_the_knobs_own(knob, argv[argv.index(f"--{flag}") + 1]), (reply, argv)
        accepted += 1
    assert accepted > 100   # the fuzz reached the argv often, not only the parser's refusals


def test_a_providers_error_is_recorded_without_the_key_or_url_credentials_it_echoes(monkeypatch):
    """Providers put the request in their errors: the key the agent holds, a key= parameter, a URL's
    user:password. planner_calls.error keeps the error, not those."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-live-0123456789abcdef")
    calls = []

    def failing(**kwargs):
        raise RuntimeError("401 for https://bob:hunter22@llm.example/v1?api_key=sk-live-0123456789abcdef&x=1 "
                           "with Authorization: Bearer sk-live-0123456789abcdef")

    planner = LLMPlanner("openai/test", "https://llm.example/v1", completion=failing, record=calls.append,
                         retries=1, sleep=lambda s: None)
    with pytest.raises(PlannerUnavailable) as e:
        planner.propose(SPACE, RUN, HISTORY, {"cpus": 2}, k=1)
    (call,) = calls
    for said in (call.error, str(e.value)):
        assert "sk-live" not in said and "hunter22" not in said, said
    assert "401 for https://bob:***@llm.example/v1?api_key=***&x=1" in call.error


@pytest.mark.parametrize("url", ["https://bob:sk-live-0123@llm.example/v1", "https://llm.example/v1?api_key=sk-live-0123",
                                 "https://llm.example/v1?token=sk-live-0123"])
def test_a_planner_base_url_with_a_credential_is_refused_before_the_run_is_stored(url, tmp_path, monkeypatch):
    """The run's settings go into the ledger as given: a URL carrying a key would put it there (and in
    every `agent ledger` output). Refused in one line, the key not echoed, no run written."""
    from typer.testing import CliRunner

    from agent.cli import app
    from agent.ledger import Ledger

    monkeypatch.setenv("AGENT_HOME", str(tmp_path))
    result = CliRunner().invoke(app, ["run", "--planner", "openai/gpt-4o-mini", "--planner-base-url", url,
                                      "--budget", "1m"])
    assert result.exit_code == 2 and "--planner-base-url: it carries a credential" in result.stderr
    assert "sk-live-0123" not in result.stderr + result.stdout
    assert not (tmp_path / "ledger.sqlite").exists() or Ledger(tmp_path / "ledger.sqlite").runs() == []
