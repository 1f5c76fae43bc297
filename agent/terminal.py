"""The terminal: one console for notes and errors (stderr), one for what a command answers (stdout).

Piped output (a file, less, a test) gets wide lines rather than truncated ids.
"""

from __future__ import annotations

import sys

from rich.console import Console

console = Console(stderr=True) if sys.stderr.isatty() else Console(stderr=True, width=220)
out = Console() if sys.stdout.isatty() else Console(width=220)


def say(line: str) -> None:
    """A note for the person at the terminal, printed as it is (no markup, no highlighting)."""
    console.print(line, highlight=False, markup=False)
