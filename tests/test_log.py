"""The run's event lines: one per event in a log file; on a terminal the phase in flight is a live line."""

import io
import json

from rich.console import Console

from agent.log import event_logger


def test_not_a_terminal_every_phase_is_a_line_of_its_own(tmp_path):
    buffer = io.StringIO()
    say = event_logger(tmp_path / "events.jsonl", Console(file=buffer, force_terminal=False, width=200))
    say("phase", number=3, phase="start")
    say("phase", number=3, phase="benchmark")
    say.close()
    assert buffer.getvalue().splitlines() == ["  trial 3: start", "  trial 3: benchmark"]
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["phase"] for e in events] == ["start", "benchmark"] and all("timestamp" in e for e in events)


def test_on_a_terminal_the_phase_is_live_with_its_elapsed_time_and_leaves_no_line(tmp_path):
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=120)
    say = event_logger(tmp_path / "events.jsonl", console)
    say("phase", number=3, phase="start")
    say("phase", number=3, phase="benchmark [search]")
    shown = buffer.getvalue()
    say.close()
    assert "trial 3: benchmark [search]" in shown and "0:00:0" in shown   # spinner line with elapsed time
    assert len((tmp_path / "events.jsonl").read_text().splitlines()) == 2   # the log keeps every phase
