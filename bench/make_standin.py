"""A bandwidth-bound stand-in for the lever table: an 8B-shaped model with no weights.

    python3 bench/make_standin.py                      # writes runs/models/standin-8b
    python3 bench/lever_table.py run --model runs/models/standin-8b --extra-flag=--load-format \\
        --extra-flag=dummy --shape fixed-c32 --shape fixed-c128 ...

The folder holds a config.json in Llama 3 8B's shape (hidden 4096, 32 layers, MLP 14336, 32 query
and 8 KV heads, bfloat16) and the embedded Gemma 3 270M's tokenizer (its 262,144-token vocabulary,
embeddings tied: about 8.0B parameters). vLLM serves it with `--load-format dummy`, random weights
initialised on the device, so nothing is carried: each decode step reads about 16 GB of weights, where
the embedded model reads 0.5 GB, and levers that matter where decoding is bound by memory (KV-cache
dtype, batch limits, graph sizes) can be seen. Its answers are noise: speed only, measured on fixed-length
answers (ignore_eos); its quality figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPE = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
    "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 8192,
    "vocab_size": 262144, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "attention_bias": False,
    "mlp_bias": False, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def parameters(c: dict) -> int:
    h, layers, mlp, kv = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"], c["num_key_value_heads"]
    attention = h * h * 2 + 2 * h * kv * c["head_dim"]   # q and o, k and v
    return c["vocab_size"] * h + layers * (attention + 3 * h * mlp + 2 * h) + h


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer-from", type=Path, default=ROOT / "runs" / "models" / "gemma-3-270m")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "models" / "standin-8b")
    args = parser.parse_args(argv)
    missing = [f for f in TOKENIZER_FILES if not (args.tokenizer_from / f).exists()]
    if missing:
        print(f"{args.tokenizer_from}: no {', '.join(missing)} (prepare the embedded model first: agent model prepare)",
              file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copy(args.tokenizer_from / name, args.out / name)
    (args.out / "config.json").write_text(json.dumps(SHAPE, indent=2) + "\n")
    print(f"{args.out}: {parameters(SHAPE) / 1e9:.2f}B parameters in Llama 3 8B's shape, no weights "
          f"(serve with --load-format dummy)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
