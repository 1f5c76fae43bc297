"""agent report --html on a run of the real loop (deterministic engine), opened in headless Chromium."""

import subprocess
import sys
from pathlib import Path

import pytest
from browser import CHROMIUM, open_page
from typer.testing import CliRunner

from agent.report_html import SECTIONS, pareto

pytestmark = pytest.mark.process   # starts processes (tests/conftest.py: not in `pytest -m unit`)

HERE = Path(__file__).parent


def test_the_pareto_front_keeps_what_nothing_beats_on_both():
    points = [(1.5, 30.0, 1), (1.2, 20.0, 2), (1.5, 35.0, 3), (1.0, 10.0, 4), (1.1, 25.0, 5)]
    assert pareto(points) == {1, 2, 4}


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    proc = subprocess.run([sys.executable, str(HERE / "crash_run.py"), str(home), "night", "12"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:]
    from agent.cli import app

    out = home / "report.html"
    result = CliRunner().invoke(app, ["report", "--run", "night", "--html", str(out)], env={"AGENT_HOME": str(home)})
    assert result.exit_code == 0, result.output
    return out


def test_every_section_is_in_the_page_and_it_needs_no_network(page):
    text = page.read_text()
    for key in SECTIONS:
        assert f"<section id='{key}'>" in text, key
    assert "cdn.plot.ly" not in text.split("</script>", 1)[1] and "<script src=" not in text
    assert "agent/night/" in text and "serving/launch.sh" in text and "VLLM_CPU_OMP_THREADS_BIND" in text


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium package (.ci/run installs it)")
def test_the_page_loads_in_a_browser_without_console_errors_and_draws_its_plots(page, tmp_path):
    bad = tmp_path / "bad.html"   # the console check itself can fail
    bad.write_text("<html><body><script>undefined_function()</script></body></html>")
    assert open_page(bad)[1], "a page with a script error showed no console error: the check is blind"
    dom, errors = open_page(page, tmp_path / "shot.png")
    assert errors == []
    # plotly draws each figure as an SVG once its script ran: one per plot section with data
    assert dom.count("class=\"main-svg\"") >= 2 * 4, dom.count("class=\"main-svg\"")
    assert (tmp_path / "shot.png").stat().st_size > 50_000


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium package (.ci/run installs it)")
def test_the_capacity_section_draws_each_configs_load_curve_knee_slo_and_cost(page, tmp_path):
    """Issue 58: `agent capacity`'s rows of the run: the table, p99 TTFT and ITL against tokens/s with
    each knee starred and the SLO drawn, and the cost bars; drawn without console errors."""
    from agent import capacity
    from agent.capacity import Curve, Repeat, Rung
    from agent.capacity_run import Ask, store
    from agent.ledger import Ledger

    def rung(load, tps, e2e):
        return Rung(load, (Repeat(tps, tps + 50, tps / 100, 500, round(tps * 10), round(tps / 10), 10.0,
                                  {"p50": 40.0, "p99": 60.0 * load, "n": 10},
                                  {"p50": 20.0, "p99": 30.0 + load, "n": 90},
                                  {"p50": e2e / 2, "p99": e2e, "n": 10}),))

    ledger = Ledger(page.parent / "ledger.sqlite")
    run = ledger.run("night")
    ask = Ask(slo={"ttft_p99_ms": 200.0}, price_per_hour=2.0)
    for subject, scale in (("defaults", 1.0), ("agent/night/3", 1.3)):
        curve = Curve(subject, "concurrency", tuple(rung(c, tps * scale, e2e) for c, tps, e2e in
                                                    ((1, 100, 1000), (2, 190, 1100), (4, 228, 1760))))
        store(ledger, run, curve, capacity.worth(curve, ask.slo, ask.price_per_hour), ask, None, "measured")
    out = tmp_path / "report.html"
    from agent.cli import app

    result = CliRunner().invoke(app, ["report", "--run", "night", "--html", str(out)],
                                env={"AGENT_HOME": str(page.parent)})
    assert result.exit_code == 0, result.output
    section = out.read_text().split("<section id='capacity'>", 1)[1].split("</section>", 1)[0]
    assert "agent/night/3" in section and "SLO limit (2)" in section and "defaults: knee" in section
    assert "Cost at each config" in section and "SLO 200 ms" in section
    dom, errors = open_page(out)
    assert errors == []
    plots = 'class="plotly-graph-div"'   # the page without capacity rows: three plots fewer
    assert out.read_text().count(plots) == page.read_text().count(plots) + 3
    assert dom.count("class=\"main-svg\"") >= 2 * 7
