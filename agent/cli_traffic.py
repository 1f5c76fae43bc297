"""`agent traffic`: a branch's split as vLLM's benchmark reads it, or a synthetic traffic file."""

from __future__ import annotations

from pathlib import Path

import typer

from agent.cli_base import fail, ledger_workload, open_ledger, told
from agent.request import model_given, model_ready, served_model
from agent.terminal import out, say

traffic_app = typer.Typer(no_args_is_help=True, help="Traffic files: a synthetic one for users without logs.")


@traffic_app.command("export")
def traffic_export(
    out_file: Path = typer.Argument(..., help="The dataset to write (JSONL: prompt and output_tokens a line)."),
    branch: str = typer.Option(..., "--branch", help="The branch whose claim the dataset re-measures."),
    traffic: Path = typer.Option(None, "--traffic", help="Your traffic file, the one the run measured (default: "
                                                         "the run's own copy, or the shipped file it measured)."),
    heldout: bool = typer.Option(True, "--heldout/--search", help="The held-out split (the claim's) or the search "
                                                                  "split."),
) -> None:
    """A branch's split of your traffic as `vllm bench serve --dataset-name custom` reads it, for its bench.sh."""
    from agent import export, morning
    from sandbox.contract import load_workload

    ledger = open_ledger()
    try:
        run_row, found = morning.results(ledger, branch)
        source = traffic or Path(load_workload(ledger_workload(run_row)).traffic or "")
        done = export.export(found, source, out_file, "heldout" if heldout else "search")
    except (morning.BranchError, export.ExportError) as e:
        raise fail(str(e), 1) from None
    for line in done.lines(out_file):
        out.print(line, highlight=False, markup=False)


@traffic_app.command("random")
def traffic_random(
    out: Path = typer.Argument(..., help="The traffic file to write (JSONL of OpenAI completions bodies)."),
    input_len: int = typer.Option(256, help="Mean prompt length in the model's tokens (--random-input-len)."),
    output_len: int = typer.Option(128, help="Mean output length in tokens (--random-output-len)."),
    range_ratio: float = typer.Option(0.0, help="Lengths uniform within a share of the means (--random-range-ratio)."),
    num_prompts: int = typer.Option(1000, help="How many requests (a goodput search wants hundreds)."),
    seed: int = typer.Option(0, help="The draw's seed: the same seed, model and lengths write the same file."),
    ignore_eos: bool = typer.Option(True, help="Generate each output to its drawn length (prompts end anywhere)."),
    temperature: float = typer.Option(None, help="Sampling temperature (default: the server's, as vllm bench serve)."),
    rate: float = typer.Option(None, help="Write a trace: each request a timestamp, this many requests/s on average "
                                          "(for --arrivals trace)."),
    burstiness: float = typer.Option(1.0, help="With --rate: the gaps' gamma shape, 1 Poisson, below 1 burstier "
                                               "(vllm bench serve --burstiness)."),
    model: str = typer.Option("embedded", help="Model folder whose tokenizer counts lengths; embedded: Gemma 3 270M"),
) -> None:
    """Write a synthetic traffic file from prompt and output length distributions, drawn by vLLM's
    random dataset (as `vllm bench serve --dataset-name random`): for `agent run --traffic FILE`
    until real traffic exists (docs/traffic.md)."""
    from agent import synthetic

    shape = synthetic.Shape(input_len, output_len, range_ratio, num_prompts, seed, ignore_eos, temperature,
                            rate, burstiness)
    try:
        shape.check()
    except ValueError as e:
        raise fail(str(e)) from None
    with told():
        written = synthetic.write(shape, served_model(*model_ready(model_given(model), say)), out)
    say(f"wrote {out}: {synthetic.described(written, shape)}")
