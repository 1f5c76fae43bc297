"""Regenerate the shipped traffic files under sandbox/data/traffic/ (deterministic; the committed
files are its output). Every prompt is written here for this project.

default.jsonl: what `agent run` measures when no traffic is given. Completions for a base model, as
they are served: few-shot questions, definitions, translations, summaries, lists, paragraphs, code,
emails and stories, each family with its own stop sequences and max_tokens, so requests end where
the model ends them (a stop sequence or EOS) and some run to their max_tokens. About 60% are sampled
(temperature 0.7 to 1.0, top_p 0.95), the rest greedy. The shares measured on the defaults are in
docs/traffic.md.

chat.jsonl: chat requests (messages) for the chat endpoint, served with gemma-chat.jinja (the
embedded model is a base model; its GGUF has no template).

conversations.jsonl: chat conversations of four turns each, one line a turn with its history and a
shared `conversation` id, replayed turn by turn (docs/traffic.md): what a prefix cache gains on
conversations is measured as served.

trace.jsonl: default.jsonl's requests with a timestamp each (bursty arrivals, one a second on
average): the shipped trace for `--arrivals trace`.

    python bench/make_traffic.py
"""

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "sandbox" / "data" / "traffic"

SUBJECTS = [
    "lighthouses", "beekeeping", "the tides", "volcanoes", "sourdough bread", "glaciers", "migrating birds",
    "old clocks", "coral reefs", "paper making", "the night sky", "river deltas", "wind turbines",
    "chess openings", "mountain railways", "tea plantations", "desert plants", "shipwrecks", "fireflies",
    "suspension bridges", "salt marshes", "pipe organs", "printing presses", "canal locks", "sea otters",
    "stained glass", "weather balloons", "cave paintings", "hot springs", "carrier pigeons", "sand dunes",
    "bookbinding", "windmills", "rainforests", "comets", "bicycles", "libraries", "pottery", "earthquakes",
    "honeybees",
]
QUESTIONS = [
    "Who painted the Mona Lisa?", "Why is the sky blue?", "What causes the seasons on Earth?",
    "How do plants make their food?", "What is the tallest mountain in Africa?", "Why do cats purr?",
    "What is the boiling point of water in Fahrenheit?", "How far away is the Moon?",
    "What language is spoken in Brazil?", "Why do we have leap years?", "What is a prime number?",
    "How many bones are in the human body?", "What makes a rainbow?", "Who invented the telephone?",
    "Why does ice float on water?", "What is the capital of Canada?", "How do vaccines work?",
    "What is the speed of light?", "Why do onions make people cry?", "What is photosynthesis?",
]
ENGLISH = [
    "Where is the train station?", "I would like a cup of coffee, please.", "The weather is lovely today.",
    "How much does this book cost?", "My sister lives near the sea.", "We are going to the market tomorrow.",
    "Can you help me find my keys?", "The museum opens at nine o'clock.", "I have never seen snow.",
    "Thank you for the wonderful dinner.",
]
ARTICLES = [
    "The city council voted on Tuesday to expand the bike lane network by 40 kilometres over three years.",
    "A small bakery in the old town has won a national award for its rye bread after twenty years of trying.",
    ("Scientists tracking a pod of whales found that the animals travelled further south this winter "
     "than ever recorded."),
    "The regional library will stay open until midnight during exam weeks, after a petition signed by students.",
    "Heavy rain flooded several roads near the river, and the ferry service was suspended for two days.",
    "A volunteer group planted four thousand trees along the motorway to reduce noise for nearby villages.",
    "The orchestra announced a season of free concerts in parks, funded by a local business association.",
    "Engineers finished repairs on the old stone bridge, which had been closed to traffic since the spring.",
]
FUNCTIONS = [
    ("reverse_words", "sentence"), ("count_vowels", "text"), ("is_palindrome", "word"), ("mean", "numbers"),
    ("fahrenheit_to_celsius", "degrees"), ("flatten", "nested"), ("word_frequencies", "text"),
    ("merge_sorted", "left, right"), ("fibonacci", "n"), ("chunk", "items, size"),
]
FEW_SHOT = "Question: What is the largest planet in the solar system?\nAnswer: Jupiter.\n\n"


def families(rng: random.Random):
    """(prompt, stop, max_tokens) for each family; the lengths a user would cap them at."""
    for q in QUESTIONS:
        yield f"{FEW_SHOT}Question: {q}\nAnswer:", ["\n"], rng.choice([32, 48, 64])
    for s in SUBJECTS:
        yield f"Word: {s}\nDefinition:", ["\n"], rng.choice([32, 48])
        yield f"Write one paragraph about {s}.\n\n", ["\n\n"], rng.choice([128, 192, 256])
        yield f"Five facts about {s}:\n1.", ["\n\n"], rng.choice([96, 128, 160])
        yield f"Subject: A question about {s}\n\nHi everyone,\n\n", ["\n\n"], rng.choice([96, 128])
        yield f"Once upon a time, a child who loved {s} set out on a journey.", None, rng.choice([128, 192, 256])
    for e in ENGLISH:
        yield f"Translate English to French.\nEnglish: {e}\nFrench:", ["\n"], 48
    for a in ARTICLES:
        yield f"Article: {a}\nOne-sentence summary:", ["\n"], 64
    for name, args in FUNCTIONS:
        yield f"def {name}({args}):\n", ["\ndef ", "\nclass ", "\n\n\n", "\nif __name__"], rng.choice([96, 160])


def default_traffic() -> list[dict]:
    rng = random.Random(0)
    rows = []
    for prompt, stop, max_tokens in families(rng):
        row = {"prompt": prompt, "max_tokens": max_tokens}
        if stop:
            row["stop"] = stop
        if rng.random() < 0.65:
            row.update(temperature=rng.choice([0.7, 0.8, 1.0]), top_p=0.95)
        else:
            row["temperature"] = 0.0
        rows.append(row)
    rng.shuffle(rows)
    return rows


def chat_traffic() -> list[dict]:
    rng = random.Random(1)
    asks = ([f"Explain {s} to a ten-year-old in three sentences." for s in SUBJECTS]
            + [f"Give me two tips for a first visit to see {s}." for s in SUBJECTS]
            + [q for q in QUESTIONS] + [f"Translate into French: {e}" for e in ENGLISH])
    rows = []
    for ask in asks:
        row = {"messages": [{"role": "user", "content": ask}], "max_completion_tokens": rng.choice([32, 48, 64, 96])}
        if rng.random() < 0.6:
            row.update(temperature=rng.choice([0.7, 1.0]), top_p=0.95)
        else:
            row["temperature"] = 0.0
        rows.append(row)
    rng.shuffle(rows)
    return rows


NOTES = [
    "{s} have a long history that most people never hear about",
    "the people who work with {s} every day see them differently from visitors",
    "a few numbers about {s} surprise almost everyone who reads them",
    "there are common myths about {s} that the guide should correct",
    "photographs of {s} rarely show how they change through the year",
    "anyone can start learning about {s} with a notebook and a free afternoon",
]
TURNS = [
    ("I am writing a short guide about {s} for curious readers. My notes so far: {notes}. "
     "What should the guide open with?",
     "Open with a scene: a reader standing in front of {s} for the first time, noticing one detail they "
     "did not expect. Then say in one sentence why {s} matter to ordinary people, and promise what the "
     "guide will show them."),
    ("Good. What are three facts about {s} a reader should remember?",
     "First, {s} are older and more varied than most people think. Second, they change with the seasons "
     "and with the people around them. Third, small choices by visitors and neighbours decide how they "
     "will look in fifty years."),
    ("Which of those is most often misunderstood, and why?",
     "The third. People assume {s} look after themselves, because they have always been there; the "
     "work that keeps them as they are is quiet, slow and mostly done by volunteers nobody sees."),
    ("Write a one-paragraph closing for the guide.", None),
]


def conversation_traffic() -> list[dict]:
    """Four turns about each subject: each line a chat request carrying its history (the recorded
    replies above), the turns of one conversation sharing its id, in order."""
    rng = random.Random(3)
    rows = []
    for i, subject in enumerate(SUBJECTS):
        notes = "; ".join(n.format(s=subject) for n in rng.sample(NOTES, 3))
        sampling = ({"temperature": rng.choice([0.7, 1.0]), "top_p": 0.95} if rng.random() < 0.6
                    else {"temperature": 0.0})
        history: list[dict] = []
        for ask, reply in TURNS:
            history = [*history, {"role": "user", "content": ask.format(s=subject, notes=notes)}]
            rows.append({"conversation": f"guide-{i}", "messages": history,
                         "max_completion_tokens": rng.choice([48, 64, 96]), **sampling})
            if reply:
                history = [*history, {"role": "assistant", "content": reply.format(s=subject)}]
    return rows


def trace_traffic() -> list[dict]:
    """The default's requests as a timestamped trace: bursty arrivals (gamma gaps, shape 0.5, so the
    gaps spread twice as wide as a Poisson process's) at one request a second on average, in seconds
    from the first. Replayed by `--arrivals trace` at its pace, scaled by `trace:SCALE`, or searched
    for its goodput (docs/arrivals.md)."""
    rng = random.Random(2)
    now, rows = 0.0, []
    for row in default_traffic():
        rows.append({"timestamp": round(now, 3), **row})
        now += rng.gammavariate(0.5, 2.0)
    return rows


def main() -> None:
    for name, rows in (("default.jsonl", default_traffic()), ("chat.jsonl", chat_traffic()),
                       ("trace.jsonl", trace_traffic()), ("conversations.jsonl", conversation_traffic())):
        (OUT / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"wrote {len(rows)} requests to {OUT / name}")


if __name__ == "__main__":
    main()
