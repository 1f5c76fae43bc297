"""`agent traffic export`: a branch's split of the user's own traffic, as vLLM's custom dataset reads it.

The prompts never enter a branch, so its serving/bench.sh measures on a file the user regenerates here
from their own traffic file: one JSON line a request, {"prompt": ..., "output_tokens": its max_tokens}
(`vllm bench serve --dataset-name custom --custom-output-len -1`). The file must be the one the run
measured (its hash is in results.json). What the custom dataset cannot carry is said: stop sequences,
per-request sampling, chat messages (chat requests are left out).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from agent import results_file
from sandbox.contract import TrafficError, load_traffic


class ExportError(ValueError):
    pass


@dataclass(frozen=True)
class Exported:
    written: int
    chat_left_out: int
    with_stop: int
    sampled: int
    split: str
    file_hash: str

    def lines(self, out: Path) -> list[str]:
        return [f"wrote {self.written} requests of the {self.split} split (traffic sha256 {self.file_hash}) to {out}",
                "not carried by vLLM's custom dataset: stop sequences (" + str(self.with_stop) + " requests had some), "
                f"per-request sampling ({self.sampled} sampled; bench.sh sends the server's defaults), chat messages "
                f"({self.chat_left_out} chat requests left out)"]


def export(results: results_file.Results, traffic: Path, out: Path, split: str = "heldout") -> Exported:
    """Write the split of `traffic` (the file the run measured) to `out` in vLLM's custom dataset form."""
    try:
        found = load_traffic(traffic, default_max_tokens=None)
    except (TrafficError, OSError) as e:
        raise ExportError(f"--traffic: {e}") from None
    want = results.traffic.file_hash
    if want and found.file_hash != want:
        raise ExportError(f"--traffic: {traffic} has sha256 {found.file_hash}, but the run measured {want} "
                          f"({results.traffic.file}): export the file the run measured")
    requests = found.split(split)
    rows = [{"prompt": r.body["prompt"], "output_tokens": r.max_tokens} for r in requests
            if r.endpoint == "completions" and isinstance(r.body.get("prompt"), str) and r.max_tokens]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return Exported(written=len(rows), chat_left_out=sum(1 for r in requests if r.endpoint == "chat"),
                    with_stop=sum(1 for r in requests if r.body.get("stop")),
                    sampled=sum(1 for r in requests if r.sampled), split=split, file_hash=found.file_hash)
