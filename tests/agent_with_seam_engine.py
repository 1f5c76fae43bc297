"""`agent` with the deterministic engine at its engine seam: a test-only executable, never shipped.

The scale-out, traffic and arrivals tests start this file where a user starts `agent`: real `agent
run` and `agent worker` processes, a real database, trials of AGENT_TEST_TRIAL_S seconds
(tests/seam_engine.py). The local workers `agent run --workers N` spawns run this file too
(it sets agent.crew.PROGRAM to itself).

    python tests/agent_with_seam_engine.py run --budget 60s ...
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from seam_engine import SeamEngine  # noqa: E402

from agent import cli, crew, part  # noqa: E402

if __name__ == "__main__":
    part.make_engine = SeamEngine
    crew.PROGRAM = [str(Path(__file__).resolve())]
    cli.main()
