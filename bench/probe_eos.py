"""How often does the embedded base model end a continuation by itself (EOS) rather than at a stop
sequence or its max_tokens? Samples continuations of a few document styles with transformers on
the prepared model (no server) and counts those ending in <eos> (id 1) or <end_of_turn> (106).

    .venv/bin/python bench/probe_eos.py --samples 5     # about a minute on 2 cores

Why it matters: docs/traffic.md (the realistic default uses stop sequences because of it).
"""

import argparse

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from sandbox.model import prepare

STYLES = {
    "chat turn": "<start_of_turn>user\nWhat is the capital of Peru?<end_of_turn>\n<start_of_turn>model\n",
    "short post": "Just finished my first marathon! Legs are jelly but so proud.",
    "review": "Review of the Acme kettle (3/5 stars): ",
    "quote": '"Be yourself; everyone else is already taken." - ',
    "how-to": "Title: How to boil an egg\n\nBoil water. ",
    "faq": "Q: How long should I boil an egg?\nA:",
    "message": "Hey, are we still on for dinner tonight?",
    "definition": "Photosynthesis is",
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args()
    torch.set_num_threads(1)
    folder = str(prepare())
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ended = total = 0
    for name, text in STYLES.items():
        ids = tok(text, return_tensors="pt").input_ids
        here = 0
        for seed in range(args.samples):
            torch.manual_seed(seed)
            out = model.generate(ids, do_sample=True, temperature=0.8, top_p=0.95, max_new_tokens=args.max_tokens,
                                 eos_token_id=[1, 106], pad_token_id=0)
            here += int(out[0, -1].item() in (1, 106) and out.shape[1] - ids.shape[1] <= args.max_tokens)
        print(f"{name:>12}: {here} of {args.samples} ended at EOS within {args.max_tokens} tokens", flush=True)
        ended, total = ended + here, total + args.samples
    print(f"all: {ended} of {total} ({ended / total:.0%})")


if __name__ == "__main__":
    main()
