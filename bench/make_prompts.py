"""Regenerate sandbox/data/texts/prompts.jsonl: benchmark prompts written for this project.

Every prompt is a template below filled with a subject below; both lists were written for this
repository, so the set is ours to ship. Subjects, not prompts, are split between the search part
and the held-out part, so a held-out prompt never shares its subject with a prompt the search saw.
Run: python bench/make_prompts.py  (deterministic; the committed file is its output)
"""

import json
import random
from pathlib import Path

FORMS = [
    "Write a short story about {s}.",
    "Explain to a curious twelve-year-old how {s} works.",
    "Describe a day in the life of someone who studies {s}.",
    "List the most common mistakes people make about {s}, and explain each one.",
    "Write a letter to a friend describing your first encounter with {s}.",
    "Compose a detailed guide for a beginner who wants to learn about {s}.",
    "Write the opening chapter of a mystery novel in which {s} plays a central role.",
    "Summarize the history of {s} in plain language, from its origins to today.",
    "Write a persuasive essay arguing that every school should teach {s}.",
    "Describe {s} to someone who has never heard of it, using one everyday comparison.",
    "Write a dialogue between a skeptic and an enthusiast about {s}.",
    "Give five surprising facts about {s}, each with a sentence of explanation.",
    "Write a newspaper report on a local festival devoted to {s}.",
    "Explain what a career built around {s} looks like, and how to start one.",
    "Write a poem in free verse about {s}.",
    "Plan a weekend trip for a family that wants to learn about {s}.",
]

SEARCH_SUBJECTS = [
    "lighthouses", "beekeeping", "the tides", "volcanoes", "sourdough bread", "glaciers",
    "migrating birds", "old clocks", "coral reefs", "paper making", "the night sky",
    "river deltas", "wind turbines", "chess openings", "mountain railways", "honey ants",
    "the postal service", "tea plantations", "desert plants", "shipwrecks",
]
HELD_OUT_SUBJECTS = [
    "fireflies", "suspension bridges", "salt marshes", "pipe organs", "the northern lights",
    "printing presses", "canal locks", "mushroom foraging", "sea otters", "stained glass",
    "weather balloons", "cave paintings", "hot springs", "carrier pigeons", "sand dunes",
    "bookbinding",
]


def main() -> None:
    rows = []
    for split, subjects in (("search", SEARCH_SUBJECTS), ("heldout", HELD_OUT_SUBJECTS)):
        prompts = [form.format(s=s) for s in subjects for form in FORMS]
        random.Random(0).shuffle(prompts)
        rows += [{"id": f"{split}-{i:03d}", "split": split, "prompt": p} for i, p in enumerate(prompts)]
    out = Path(__file__).resolve().parents[1] / "sandbox" / "data" / "texts" / "prompts.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} prompts to {out}")


if __name__ == "__main__":
    main()
