"""The deterministic engine at the CLI's engine seam (agent.part.make_engine, set by tests/agent_with_seam_engine.py):
real `agent run` and `agent worker` processes, a real database, trials that take AGENT_TEST_TRIAL_S."""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fake_engine import FakeEngine  # noqa: E402


class SeamEngine(FakeEngine):
    def __init__(self, slot=None):
        super().__init__(delay_s=float(os.environ.get("AGENT_TEST_TRIAL_S", "1.0")))
        self.slot = slot

    def evaluate(self, spec, trial_dir, timeout_s, on_phase=lambda phase: None):
        if record := os.environ.get("AGENT_TEST_SPECS"):   # every spec the loop sent, for the tests to read
            with open(record, "a") as f:
                f.write(json.dumps(spec) + "\n")
        result = super().evaluate(spec, trial_dir, timeout_s, on_phase)
        result.device = self.slot.device if self.slot else "host"
        return result

    def close(self):
        pass
