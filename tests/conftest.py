import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # tests/ helpers: fake_engine, fake_server

import pytest


@pytest.fixture(scope="session")
def embedded_model():
    """The prepared Gemma 3 270M folder (built once, about 2 minutes, then cached under runs/)."""
    from sandbox.model import prepare

    return prepare()


# What makes a test slow: a real vLLM server (engine), the CUDA build (gpu), processes it starts (a stand-in
# server, a worker, an agent: process), a PostgreSQL server (postgres), the prepared model (model), or
# seconds on the wall clock (slow: the loop's nights). A test with none of them is marked unit:
# `pytest -m unit` runs those, in under a minute on 2 cores.
SLOW = ("engine", "gpu", "process", "postgres", "model", "slow")
BY_FIXTURE = {"postgres_server": "postgres", "embedded_model": "model"}


def pytest_collection_modifyitems(config, items):
    """Every test gets `unit` unless it is marked slow (SLOW, or a fixture in BY_FIXTURE). Tests marked gpu
    need the CUDA build (the GPU host): elsewhere they are deselected, not skipped (no test here should
    skip), and the summary says how many and why."""
    from sandbox import host

    for item in items:
        for fixture, marker in BY_FIXTURE.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)
        if not any(item.get_closest_marker(m) for m in SLOW):
            item.add_marker("unit")
    if host.engine()["name"] == "vllm":
        return
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if gpu:
        config.hook.pytest_deselected(items=gpu)
        items[:] = [item for item in items if not item.get_closest_marker("gpu")]
        print(f"\n{len(gpu)} test(s) marked gpu deselected: they need the CUDA build of vLLM (`vllm serve`)")


def pytest_sessionfinish(session, exitstatus):
    """With AGENT_NO_SKIPS=1 (.ci/run sets it) a skipped test fails the session: a skip is coverage CI
    silently lost (a browser or PostgreSQL that did not install), and the README says none should skip."""
    import os

    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if os.environ.get("AGENT_NO_SKIPS") == "1" and skipped and session.exitstatus == 0:
        print(f"\n{skipped} test(s) skipped with AGENT_NO_SKIPS=1: failing the session (see the -ra summary)")
        session.exitstatus = 1


@pytest.fixture(scope="session")
def postgres_server():
    """A private PostgreSQL server for the whole session (tests/postgres.py). Missing binaries fail the
    test that needs it: the ledger suite is one suite on both databases, not SQLite where PostgreSQL is
    missing (.ci/run installs Debian's postgresql package)."""
    from postgres import Postgres, binaries

    found = binaries()
    if found is None:
        pytest.fail("no PostgreSQL binaries: install Debian's postgresql package (.ci/run does)")
    server = Postgres(found)
    yield server
    server.close()
