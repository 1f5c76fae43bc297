"""Open a page in headless Chromium (Debian's `chromium` package): its DOM after scripts ran, the
console's errors, and a screenshot."""

import shutil
import subprocess
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--enable-logging=stderr", "--v=0"]


def console_errors(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ":CONSOLE" in ln and ("Uncaught" in ln or "rror" in ln)]


def open_page(page: Path, screenshot: Path | None = None) -> tuple[str, list[str]]:
    """(the DOM after the page's scripts ran, console errors)."""
    dom = subprocess.run([CHROMIUM, *FLAGS, "--virtual-time-budget=10000", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    errors = console_errors(dom.stderr)
    if screenshot is not None:
        shot = subprocess.run([CHROMIUM, *FLAGS, "--window-size=1300,6000", f"--screenshot={screenshot}",
                               page.as_uri()], capture_output=True, text=True, timeout=120)
        errors += console_errors(shot.stderr)
    return dom.stdout, errors
