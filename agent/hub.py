"""A model given by Hugging Face id: fetched once before the run, then served from the cache offline.

Trials run with HF_HUB_OFFLINE=1 (sandbox/server.py): a night must not depend on the network, and
every trial must load the same weights. So the run downloads the repository once, before its
baseline, records the commit it resolved to, and hands the trials that snapshot's folder. A resume
finds the same snapshot again by its commit, without the network.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# What vLLM loads: configs, tokenizers, safetensors weights. Not .bin or .gguf duplicates of them,
# nor the other formats some repositories also ship (onnx, tflite, ...).
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}", re.ASCII)
WEIGHTS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.py", "*.jinja"]


class ModelUnavailable(RuntimeError):
    """The model cannot be had: one line that names the model and what to do."""


@dataclass(frozen=True)
class Fetched:
    path: str       # the snapshot folder trials load
    revision: str   # the commit it resolved to


def is_hub_id(model: str) -> bool:
    """org/name as the Hub spells ids (letters, digits, - _ .), and not a folder that exists here."""
    return bool(HUB_ID.fullmatch(model)) and not Path(model).exists()


# Read at each call, not at import as huggingface_hub does: what the process environment says now.
def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def cache_dir() -> str:
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return os.environ.get("HF_HUB_CACHE") or os.path.join(home, "hub")


def fetch(model: str, revision: str | None = None, offline: bool = False,
          say: Callable[[str], None] = lambda s: None) -> Fetched:
    """Download `model` (a Hub id) into the Hugging Face cache, or find it there when `offline`."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if not offline:
        say(f"fetching {model} from {endpoint()} (once; trials then run offline)")
    try:
        try:
            path = snapshot_download(model, revision=revision, allow_patterns=WEIGHTS, local_files_only=offline,
                                         endpoint=endpoint(), cache_dir=cache_dir())
        except LocalEntryNotFoundError as e:
            # Not cached: the Hub's own answer, when it gave one, says why (gated, not found).
            if isinstance(e.__cause__, (GatedRepoError, RepositoryNotFoundError)):
                raise e.__cause__ from None
            raise
    except GatedRepoError:
        raise ModelUnavailable(f"model {model!r} is gated: accept its terms on its page at {endpoint()}, then set "
                               "HF_TOKEN to a token of that account") from None
    except RepositoryNotFoundError:
        raise ModelUnavailable(f"model {model!r} is not on {endpoint()} (or is private: set HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise ModelUnavailable(f"model {model!r} has no revision {revision!r}") from None
    except LocalEntryNotFoundError:
        where = "in the Hugging Face cache" + ("" if offline else f", and {endpoint()} cannot be reached")
        raise ModelUnavailable(f"model {model!r}{f' at {revision}' if revision else ''} is not {where}") from None
    except OSError as e:   # the disk, or the network in a way the hub library does not name
        raise ModelUnavailable(f"model {model!r} could not be fetched: {type(e).__name__}: {e}") from None
    return Fetched(path=path, revision=Path(path).name)


def served(model: str, revision: str | None) -> str:
    """What a trial loads: a Hub id's snapshot in the cache, found offline by its commit; else `model`."""
    return model if revision is None else fetch(model, revision, offline=True).path
