"""Regenerate the two load-test traffic files for GPU serving (deterministic; the committed files
are its output), for the embedded model (Gemma 3 270M, a base model: completions, no chat template).

serving.jsonl: N_SERVING (5,600) distinct completion requests, base-model completions as they are
served, in the families of default.jsonl (bench/make_traffic.py) with far more varied text:
few-shot questions (18%), definitions and glossaries (10%), translations into six languages (10%),
summaries of an article (10%), lists (9%), emails (8%), paragraphs and document continuations (13%),
code continuation (13%) and stories (9%). Each family has its own stop sequences (a newline after a
short answer, a blank line after a paragraph, list or email paragraph, the next `def` or `class`
after a function; stories have none) and its own `max_tokens` (16 to 256: 46% at 64 or less, 20% at
192 or more). About 60% are sampled (temperature 0.7, 0.8, 0.9 or 1.0, top_p 0.95), the rest greedy;
none ignores EOS. Prompts run from 2 tokens to about 1,200 (median 61, 92% under 300); prompts that
can grow (few-shot examples, quoted or summarised text, the code above a function) are grown to a
log-normal length target (target_length). No two prompts are the same (checked before writing).

rag.jsonl: N_RAG (600) prefill-heavy requests as retrieval-augmented serving sends them: one
instruction line (the same in every request), a retrieved document of 4,100 to 11,100 characters
(900 to 2,700 tokens, median 1,300), then a short question about it and "Answer:"; `max_tokens` 16 to
64, stop ["\\n"], about 80% greedy, 20% sampled. The documents are sections of the Python reference
text (42 of those asked about) and module reference pages built from docstrings (120). Popular
documents are asked about often: a document's popularity follows a Zipf law (weight 1/(rank + 5)
over a collection of 193), so 162 documents are asked about, 56 of them once; the most asked is
asked 24 times (24 distinct questions) and the 20 most asked carry 44% of the requests; 544 of the
600 requests (91%) share their document, and so the whole prompt up to the question, with at
least one other request (the prefix cache sees that). Every prompt is distinct (a document's
questions differ).

Where the text comes from (nothing is fetched from a network; everything is read from the Python
that runs this script):
- Docstrings of CPython's standard library modules, classes and functions (the `.py` files under
  `sysconfig.get_paths()["stdlib"]`, parsed with `ast`, never imported; left out: tests, idlelib,
  site-packages, encodings, lib2to3, distutils, ensurepip, turtledemo, and every file carrying its
  own licence terms (OWN_TERMS: asynchat, asyncore, http.cookies, logging, optparse, platform, re,
  sqlite3, tarfile, tkinter.simpledialog, tomllib, trace, turtle, unittest, urllib.robotparser, uu,
  wsgiref.validate, xml.etree, xmlrpc.client), so what is kept is under the PSF licence alone).
  Cleaned for the prose families: whitespace collapsed, doctest lines (`>>>`, `...`) dropped, only
  paragraphs that read as prose kept (is_prose).
- The source code of those functions (code continuation; their signatures in rag.jsonl's pages).
- The Python language and library reference text that ships with CPython as `pydoc_data/topics.py`
  (what `help("with")` shows): summaries, continuations, emails that quote it, rag.jsonl documents.
  All three are part of CPython 3.11.7, "Copyright (c) 2001-2023 Python Software Foundation; All
  Rights Reserved", distributed under the PSF License Agreement (Python Software Foundation License
  Version 2: LICENSE.txt beside the standard library, https://docs.python.org/3/license.html), which
  permits reproducing and preparing derivative works, keeping the PSF's notice and licence and
  summarising the changes. The changes here: excerpts cut from their files, whitespace collapsed or
  re-indented, doctest lines dropped, and excerpts put into prompt templates.
- Everything else (subjects, general-knowledge questions and answers, words and their definitions,
  everyday sentences and their translations, email and story pieces, the templates) is written in
  this file for this project, under the project's own terms.

Determinism: inputs are read in sorted order and every choice comes from seeded `random.Random`
generators (the outputs do not depend on PYTHONHASHSEED), so the same Python gives the same bytes.
The committed files were made with CPython 3.11.7 (a pyenv build of the upstream sources), whose
extracted text has the SHA-256 CORPUS_SHA256 below. Another Python version, or a standard library
whose text differs (Debian's python3.11 is 3.11.2 and patched), would give other files: the script
then refuses to write unless --force is given, and says why. --check regenerates in memory and
compares with the committed files (exit status 1 if they differ).

    python3 bench/make_serving_traffic.py            # write both files
    python3 bench/make_serving_traffic.py --check    # do the committed files match?
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import math
import random
import re
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "sandbox" / "data" / "traffic"
sys.path.insert(0, str(ROOT / "bench"))
import make_traffic  # noqa: E402  default.jsonl's subjects, the first of these

MADE_WITH = (3, 11, 7)
CORPUS_SHA256 = "e6bdad5815fcc9a4336c1c5275f13ae67d1131df12d199af4af226ce1e36f1eb"
N_SERVING = 5600
N_RAG = 600
STDLIB = Path(sysconfig.get_paths()["stdlib"])
SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "__pycache__", "turtledemo", "encodings", "lib2to3",
             "distutils", "ensurepip"}
MAX_PROMPT_CHARS = 4000          # about 1,000 tokens
TEMPERATURES = [0.7, 0.8, 0.9, 1.0]


# ----------------------------------------------------------------------------------------------------
# Text read from the Python that runs this script


@dataclass(frozen=True)
class Doc:
    module: str            # e.g. "email.message"
    name: str              # qualified name within the module ("" for the module's own docstring)
    kind: str              # module, class, function or method
    text: str              # the docstring as ast.get_docstring gives it (cleandoc'ed)
    signature: str         # "(src, dst, *, follow_symlinks=True)" for functions, "" otherwise
    source: str            # the function's source lines as in the file ("" for modules and classes)
    context: str           # methods: their class's header line
    lineno: int = 0        # functions: the source's first line in its file (1-based, decorators included)


def stdlib_files() -> list[Path]:
    out = []
    for path in STDLIB.rglob("*.py"):
        parts = path.relative_to(STDLIB).parts
        if set(parts) & SKIP_DIRS or parts[0].startswith("config-") or path.name.startswith("_sysconfigdata"):
            continue
        out.append(path)
    return sorted(out, key=lambda p: p.relative_to(STDLIB).as_posix())


# A file carrying its own licence terms (code incorporated into CPython under another licence, or a
# notice that must travel with copies) is left out: what is kept is under the PSF licence alone.
OWN_TERMS = re.compile(r"Permission +to +use|Permission +is +(hereby +)?granted|SPDX-License-Identifier|MIT license|"
                       r"Copyright \(c\) [\d, -]+ by (Secret Labs|Fredrik Lundh)|__copyright__|Python 1\.6 license|"
                       r"Python 2\.2 license|choose between two licenses|so long as this copyright", re.IGNORECASE)


def own_terms(text: str) -> bool:
    return bool(OWN_TERMS.search(text[:6000]))


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    return f"({ast.unparse(node.args)})"


def stdlib_docs() -> tuple[list[Doc], dict[str, list[str]]]:
    """Every docstring of the standard library, and each module's source lines."""
    docs: list[Doc] = []
    sources: dict[str, list[str]] = {}
    for path in stdlib_files():
        text = path.read_text(encoding="utf-8")
        if own_terms(text):
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        lines = text.splitlines()
        module = ".".join(path.relative_to(STDLIB).with_suffix("").parts).removesuffix(".__init__")
        sources[module] = lines
        if doc := ast.get_docstring(tree):
            docs.append(Doc(module, "", "module", doc, "", "", ""))
        docs += _definitions(tree, module, lines, "", "")
    return docs, sources


def _definitions(node: ast.AST, module: str, lines: list[str], prefix: str, header: str) -> list[Doc]:
    """The documented classes and functions under node, and the methods of its top-level classes."""
    out = []
    for n in ast.iter_child_nodes(node):
        if isinstance(n, ast.ClassDef):
            if doc := ast.get_docstring(n):
                out.append(Doc(module, prefix + n.name, "class", doc, "", "", ""))
            if not prefix:
                out += _definitions(n, module, lines, n.name + ".", lines[n.lineno - 1])
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and (doc := ast.get_docstring(n)):
            first = min([n.lineno] + [d.lineno for d in n.decorator_list])
            source = "\n".join(lines[first - 1:n.end_lineno])
            out.append(Doc(module, prefix + n.name, "method" if prefix else "function", doc, _signature(n), source,
                           header, first))
    return out


def topics() -> dict[str, str]:
    """The reference text pydoc shows (`help("with")`), by topic, in sorted order."""
    from pydoc_data.topics import topics as found

    return {k: found[k] for k in sorted(found)}


def corpus_digest(docs: list[Doc], sources: dict[str, list[str]], refs: dict[str, str]) -> str:
    """SHA-256 of all the text read: the same digest and the same Python give the same files."""
    h = hashlib.sha256()
    for d in docs:
        h.update(json.dumps([d.module, d.name, d.kind, d.text, d.signature, d.source, d.context, d.lineno]).encode())
    for k in sorted(sources):
        h.update(json.dumps([k, sources[k]]).encode())
    for k, v in refs.items():
        h.update(json.dumps([k, v]).encode())
    return h.hexdigest()


# ----------------------------------------------------------------------------------------------------
# Cleaning


def collapse(text: str) -> str:
    """One line: doctest lines dropped, whitespace collapsed."""
    kept = [ln for ln in text.splitlines() if not ln.strip().startswith((">>>", "... "))]
    return re.sub(r"\s+", " ", " ".join(kept)).strip()


def paragraphs(text: str) -> list[str]:
    return [p for p in (collapse(p) for p in re.split(r"\n\s*\n", text)) if p]


PROSE_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ ,.;:'\"()-")


def is_prose(text: str, min_words: int = 7) -> bool:
    """A paragraph that reads as English prose: a sentence or more, few symbols, no markup."""
    if len(text) < 40 or not text[0].isupper() or not text.endswith((".", "?", "!")):
        return False
    if len(text.split()) < min_words or text.count(",") > len(text.split()) / 4:   # not a list of names
        return False
    if sum(c in PROSE_CHARS for c in text) / len(text) < 0.94:
        return False
    return not re.search(r"::|[{}\[\]<>|`=@#\\]|->|\bself\b|__\w+__|\w_\w|\bXXX\b|\bTODO\b", text)


def first_sentence(text: str) -> str:
    m = re.match(r"(.+?[.!?])(?=\s+[A-Z(\"]|$)", text)
    return m.group(1) if m else text


def public(doc: Doc) -> bool:
    return not any(part.startswith("_") for part in (doc.module + "." + doc.name).split(".") if part)


def qualified(doc: Doc) -> str:
    return f"{doc.module}.{doc.name}" if doc.name else doc.module


@dataclass
class Corpus:
    docs: list[Doc]
    sources: dict[str, list[str]]           # each module's source lines
    refs: dict[str, str]
    prose: list[tuple[str, str]]            # (where, paragraph): docstring and reference prose paragraphs
    articles: list[tuple[str, list[str]]]   # (title, consecutive prose paragraphs of one text)
    answers: list[tuple[str, str]]          # (qualified public name, its docstring's first sentence)
    sentences: list[str]                    # short prose sentences for translation
    functions: list[Doc]                    # public functions and methods with a docstring and a body


def reference_sections(refs: dict[str, str]) -> list[tuple[str, str]]:
    """(title, text) of each section of the reference text, split at its underlined headings."""
    out = []
    for key, text in refs.items():
        lines = text.splitlines()
        title, start = key, 0
        for i in range(1, len(lines)):
            if lines[i] and set(lines[i]) <= set("*=-") and len(lines[i]) >= 3 and lines[i - 1].strip():
                body = "\n".join(lines[start:i - 1]).strip("\n")
                if body.strip():
                    out.append((title, body))
                title, start = lines[i - 1].strip(), i + 1
        body = "\n".join(lines[start:]).strip("\n")
        if body.strip():
            out.append((title, body))
    return out


def reference_paragraphs(text: str) -> list[str]:
    """Prose paragraphs of reference text: its unindented paragraphs, reflowed."""
    out = []
    for block in re.split(r"\n\s*\n", text):
        if block and not block[0].isspace():
            out.append(collapse(block))
    return out


def build_corpus() -> Corpus:
    docs, sources = stdlib_docs()
    refs = topics()
    prose, articles, answers, sentences = [], [], [], []
    for d in docs:
        pars = [p for p in paragraphs(d.text) if is_prose(p)]
        where = qualified(d)
        prose += [(where, p) for p in pars]
        if len(pars) >= 2:
            articles.append((where, pars))
        if public(d) and d.kind != "module" and (first := paragraphs(d.text)[:1]):
            sentence = first_sentence(first[0])
            if is_prose(sentence, 5) and len(sentence) <= 220:
                answers.append((where, sentence))
    for title, text in reference_sections(refs):
        pars = [p for p in reference_paragraphs(text) if is_prose(p) or (len(p) > 80 and p[0].isupper()
                                                                          and p.endswith(".") and "::=" not in p)]
        prose += [(title, p) for p in pars]
        if len(pars) >= 2:
            articles.append((title, pars))
    for _, p in prose:
        for s in re.split(r"(?<=[.!?])\s+(?=[A-Z])", p):
            if 30 <= len(s) <= 140 and is_prose(s, 6):
                sentences.append(s)
    sentences = sorted(set(sentences))
    functions = [d for d in docs if d.kind in ("function", "method") and public(d) and d.source
                 and 4 <= d.source.count("\n") <= 60 and "\t" not in d.source]
    return Corpus(docs, sources, refs, prose, articles, answers, sentences, functions)


# ----------------------------------------------------------------------------------------------------
# Text written for this project: bench/data/serving-text.json (pairs as [first, second]).
TEXT = json.loads((Path(__file__).resolve().parent / "data" / "serving-text.json").read_text())
SUBJECTS = [*make_traffic.SUBJECTS, *TEXT["SUBJECTS_MORE"]]   # default.jsonl's 40 subjects, then more
QA_PAIRS = [tuple(pair) for pair in TEXT["QA_PAIRS"]]
WORD_SHOTS = [tuple(pair) for pair in TEXT["WORD_SHOTS"]]
QUESTIONS, WORDS, EVERYDAY = TEXT["QUESTIONS"], TEXT["WORDS"], TEXT["EVERYDAY"]
TRANSLATION_SHOTS, TRANSLATION_SOURCES = TEXT["TRANSLATION_SHOTS"], TEXT["TRANSLATION_SOURCES"]
NAMES, TEAMS, DAYS = TEXT["NAMES"], TEXT["TEAMS"], TEXT["DAYS"]
EMAIL_SUBJECTS, EMAIL_OPENINGS, EMAIL_LINES = TEXT["EMAIL_SUBJECTS"], TEXT["EMAIL_OPENINGS"], TEXT["EMAIL_LINES"]
CHARACTERS, PLACES, EVENTS, DETAILS = TEXT["CHARACTERS"], TEXT["PLACES"], TEXT["EVENTS"], TEXT["DETAILS"]
STORY_OPENERS, ACTIVITIES = TEXT["STORY_OPENERS"], TEXT["ACTIVITIES"]
TASKS, PRODUCTS = TEXT["TASKS"], TEXT["PRODUCTS"]


# ----------------------------------------------------------------------------------------------------
# serving.jsonl

CODE_STOP_TOP = ["\ndef ", "\nclass ", "\n\n\n", "\nif __name__"]
CODE_STOP_METHOD = ["\n    def ", "\nclass ", "\ndef ", "\n\n\n"]


def sampling(rng: random.Random, share: float) -> dict:
    if rng.random() < share:
        return {"temperature": rng.choice(TEMPERATURES), "top_p": 0.95}
    return {"temperature": 0.0}


def cap(text: str, limit: int = MAX_PROMPT_CHARS) -> str | None:
    return text if len(text) <= limit else None


def target_length(rng: random.Random) -> int:
    """How long a prompt with room to grow (examples, context, a document) is made, in characters:
    log-normal, median 450 (about 110 tokens), one in ten past about 1,500, at most 4,000."""
    return min(4000, int(rng.lognormvariate(math.log(450), 0.95)))


def fill(pieces, target: int, least: int = 1, most: int = 60) -> list:
    """The first pieces (at least `least`) whose lengths reach `target` characters."""
    out, total = [], 0
    for piece in pieces:
        if len(out) >= most or (len(out) >= least and total >= target):
            break
        out.append(piece)
        total += len(piece) if isinstance(piece, str) else sum(len(x) for x in piece)
    return out


def qa(rng: random.Random, c: Corpus):
    """Few-shot questions: general knowledge (written here) or what a library function does (docstrings)."""
    target = target_length(rng)
    if rng.random() < 0.4:
        fmt = rng.choice([("Question: ", "Answer:"), ("Q: ", "A:")])
        shots = fill(rng.sample(QA_PAIRS, len(QA_PAIRS)), target, least=rng.choice([0, 1, 1, 2]))
        target_q = rng.choice(QUESTIONS + [q for q, a in QA_PAIRS if (q, a) not in shots])
        prompt = "".join(f"{fmt[0]}{q}\n{fmt[1]} {a}\n\n" for q, a in shots) + f"{fmt[0]}{target_q}\n{fmt[1]}"
        stop = ["\n"] if rng.random() < 0.7 else ["\n", fmt[0].strip()]
    else:
        picked = rng.sample(c.answers, 60)
        ask = rng.choice(["What does {n} do?", "What is {n} for?", "In Python, what does {n} do?"])
        header = rng.choice(["", "", "Python standard library FAQ\n\n", "Answer each question in one sentence.\n\n"])
        shots = fill(picked[1:], target)
        prompt = header + "".join(f"Question: {ask.format(n=n)}\nAnswer: {a}\n\n" for n, a in shots)
        prompt += f"Question: {ask.format(n=picked[0][0])}\nAnswer:"
        stop = ["\n"]
    return cap(prompt), stop, rng.choice([16, 24, 32, 32, 48, 64]), 0.5


def definition(rng: random.Random, c: Corpus):
    r = rng.random()
    if r < 0.4:
        word = rng.choice(WORDS)
        prompt = rng.choice(["Word: {w}\nDefinition:", "{w}:", "Define the word \"{w}\".\n\nDefinition:",
                             "Dictionary entry\n\n{w} (n.):", "{W}\n\nMeaning:"]).format(w=word, W=word.capitalize())
    elif r < 0.65:
        shots = rng.sample(WORD_SHOTS, rng.randint(1, len(WORD_SHOTS)))
        word = rng.choice(WORDS)
        prompt = "".join(f"{w}: {d}\n" for w, d in shots) + f"{word}:"
    else:
        picked = rng.sample(c.answers, 60)
        title = rng.choice(["Glossary\n\n", "", "Glossary of the Python standard library\n\n"])
        shots = fill(picked[1:], target_length(rng))
        prompt = title + "".join(f"Term: {n}\nMeaning: {a}\n\n" for n, a in shots)
        prompt += f"Term: {picked[0][0]}\nMeaning:"
    return cap(prompt), ["\n"], rng.choice([16, 24, 32, 48, 64]), 0.5


def translation(rng: random.Random, c: Corpus):
    lang = rng.choice(sorted(TRANSLATION_SHOTS))
    source = rng.choice(EVERYDAY) if rng.random() < 0.5 else rng.choice(c.sentences)
    k = 0 if rng.random() < 0.4 else rng.randint(1, 6)
    idx = [i for i in rng.sample(range(6), k) if TRANSLATION_SOURCES[i] != source]
    shots = "".join(f"English: {TRANSLATION_SOURCES[i]}\n{lang}: {TRANSLATION_SHOTS[lang][i]}\n\n" for i in idx)
    head = rng.choice([f"Translate English to {lang}.\n", f"Translate the following sentences into {lang}.\n\n", ""])
    prompt = f"{head}{shots}English: {source}\n{lang}:"
    return cap(prompt), ["\n"], rng.choice([32, 48, 64, 96, 128]), 0.45


def passage(rng: random.Random, c: Corpus, target: int, first: bool = False) -> tuple[str, str]:
    """(title, text): consecutive prose paragraphs of one text, about `target` characters."""
    title, pars = rng.choice(c.articles)
    start = 0 if first else rng.randint(0, len(pars) - 1)
    return title, "\n\n".join(fill(pars[start:], target, most=12))


def summary(rng: random.Random, c: Corpus):
    title, body = passage(rng, c, max(300, target_length(rng)))
    if len(body) < 200:
        return None, None, 0, 0
    form = rng.choice(["Article: {b}\nOne-sentence summary:", "{b}\n\nTL;DR:", "Text:\n{b}\n\nSummary:",
                       "Summarize the following passage in one sentence.\n\n{b}\n\nSummary:",
                       "Title: {t}\n\n{b}\n\nIn short:"])
    return cap(form.format(b=body, t=title)), ["\n"], rng.choice([32, 48, 64, 64, 96, 128]), 0.5


def listing(rng: random.Random, c: Corpus):
    r = rng.random()
    s = rng.choice(SUBJECTS)
    if r < 0.3:
        prompt = rng.choice(["Five facts about {s}:\n1.", "Three surprising things about {s}:\n1.",
                             "Ten questions a child might ask about {s}:\n1.", "Facts about {s}\n\n-"]).format(s=s)
    elif r < 0.5:
        prompt = rng.choice(["Tips for {a}:\n1.", "A checklist for {a}:\n-", "What to pack for {a}:\n-",
                             "Common mistakes when {a2}:\n1."]).format(a=rng.choice(ACTIVITIES),
                                                                        a2="planning " + rng.choice(ACTIVITIES))
    elif r < 0.65:
        prompt = rng.choice(["How to {t}\n\nSteps:\n1.", "Step-by-step: how to {t}.\n\n1.",
                             "Instructions\n\nTo {t}, follow these steps:\n1."]).format(t=rng.choice(TASKS))
    elif r < 0.75:
        d = rng.choice([d for d in c.docs if d.kind == "module" and public(d)])
        prompt = rng.choice(["Things you can do with the Python {m} module:\n1.",
                             "The {m} module in five points:\n1."]).format(m=d.module)
    else:
        title, body = passage(rng, c, max(200, target_length(rng)))
        if len(body) < 150:
            return None, None, 0, 0
        prompt = rng.choice(["{p}\n\nKey points:\n1.", "{p}\n\nThree takeaways from the text above:\n1.",
                             "Notes on {w}\n\n{p}\n\nQuestions to ask about this:\n-"]).format(p=body, w=title)
    return cap(prompt), ["\n\n"], rng.choice([64, 96, 128, 128, 160, 192, 256]), 0.7


def email(rng: random.Random, c: Corpus):
    s = rng.choice(SUBJECTS)
    sender, to = rng.sample(NAMES, 2)
    subject = rng.choice(EMAIL_SUBJECTS).format(s=s)
    head = f"Subject: {subject}\n"
    if rng.random() < 0.4:
        head = f"From: {sender}\nTo: {to}\n" + head
    opening = rng.choice(EMAIL_OPENINGS).format(to=to, team=rng.choice(TEAMS), s=s)
    r = rng.random()
    if r < 0.3:     # an email quoting the documentation it asks about
        title, body = passage(rng, c, target_length(rng))
        quoted = "\n>\n".join(f"> {p}" for p in body.split("\n\n"))
        head = f"Subject: Question about {title}\n"
        opening = (f"Hi {to},\n\nI was reading the documentation for {title}, which says:\n\n{quoted}\n\n"
                   f"{rng.choice(['Could you explain ', 'I am not sure I understand ', 'Does this mean '])}")
    elif r < 0.5:   # a reply, the message replied to quoted below the new one's start
        greeting = rng.choice(["Hi {to},", "Dear {to},", "Hello {team},", "Hi {team},"]).format(to=sender,
                                                                                              team=rng.choice(TEAMS))
        said = fill(rng.sample(EMAIL_LINES, len(EMAIL_LINES)), target_length(rng) // 2, most=8)
        said = [line.format(s=s, day=rng.choice(DAYS), n=rng.choice(NAMES)) for line in said]
        cut = rng.randint(1, len(said))
        message = " ".join(said[:cut]) + ("\n\n" + " ".join(said[cut:]) if said[cut:] else "")
        signoff = rng.choice(["Best,", "Thanks,", "Cheers,", "Kind regards,"])
        quoted = "\n".join(f"> {ln}" if ln else ">" for ln in f"{greeting}\n\n{message}\n\n{signoff}\n{to}".split("\n"))
        thread = f"On {rng.choice(DAYS)}, {to} wrote:\n{quoted}"
        head = f"Subject: Re: {subject}\n"
        opening = f"{rng.choice(['Hi', 'Thanks', 'Hello'])} {to},\n\n"
        return cap(f"{head}\n{thread}\n\n{opening}"), ["\n\n"], rng.choice([64, 96, 128, 160, 192, 256]), 0.75
    return cap(f"{head}\n{opening}"), ["\n\n"], rng.choice([64, 96, 128, 160, 192, 256]), 0.75


def paragraph(rng: random.Random, c: Corpus):
    r = rng.random()
    if r < 0.35:
        s = rng.choice(SUBJECTS + PRODUCTS)
        prompt = rng.choice(["Write one paragraph about {s}.\n\n", ("Write a short paragraph explaining {s} to a "
                                                                      "beginner.\n\n"),
                             "Describe {s} in a few sentences.\n\n", "Product description: {s}\n\n",
                             "Blog post: A weekend with {s}\n\nBy {n}\n\n", "My favourite thing about {s}\n\n"]
                            ).format(s=s, n=rng.choice(NAMES))
    elif r < 0.75:   # continue a document after its first paragraphs
        title, body = passage(rng, c, target_length(rng), first=True)
        prompt = f"{title}\n\n{body}\n\n" if rng.random() < 0.6 else f"{body}\n\n"
    else:            # continue a paragraph from the middle
        _, par = rng.choice(c.prose)
        words = par.split()
        if len(words) < 20:
            return None, None, 0, 0
        prompt = " ".join(words[:rng.randint(6, len(words) // 2)])
    return cap(prompt), ["\n\n"], rng.choice([96, 128, 160, 192, 256]), 0.75


def code(rng: random.Random, c: Corpus):
    """Code completion as an editor sends it: the file up to a point inside a function (the function's
    signature, its docstring, or some of its body), from a line some way above it."""
    d = rng.choice(c.functions)
    lines = d.source.splitlines()
    span = _docstring_lines(d)
    if span is None:
        return None, None, 0, 0
    doc_start, doc_end = span
    r = rng.random()
    if r < 0.25:      # the signature only: the model writes the docstring and the body
        keep = doc_start - 1
    elif r < 0.6 or len(lines) - doc_end < 3:
        keep = doc_end
    else:
        keep = doc_end + rng.randint(1, (len(lines) - doc_end) // 2)
    text = "\n".join(lines[:keep]) + "\n"
    above = c.sources[d.module][:d.lineno - 1]
    budget = target_length(rng) - len(text) if rng.random() < 0.7 else 0
    start = len(above)
    while start > 0 and budget - len(above[start - 1]) - 1 >= 0:
        start -= 1
        budget -= len(above[start]) + 1
    indent = len(lines[0]) - len(lines[0].lstrip())
    while start < len(above) and not (above[start].strip() and (start == 0 or not above[start - 1].strip())
                                      and len(above[start]) - len(above[start].lstrip()) <= indent):
        start += 1   # begin where a statement at the function's level (or outside it) begins a paragraph
    prefix = "\n".join(above[start:]) + "\n" if start < len(above) else ""
    if d.kind == "method" and d.context not in prefix:
        prefix = d.context + "\n" + ("    ...\n\n" if prefix.strip() else "") + prefix
    if rng.random() < 0.2:
        prefix = f"# {d.module.replace('.', '/')}.py\n" + prefix
    stop = CODE_STOP_METHOD if d.kind == "method" else CODE_STOP_TOP
    return cap(prefix + text), stop, rng.choice([64, 96, 128, 128, 160, 192, 256]), 0.45


def _docstring_lines(d: Doc) -> tuple[int, int] | None:
    """The docstring's first and last line among the function's source lines (1-based), if it has lines
    of its own."""
    try:
        node = ast.parse(_dedent(d.source)).body[0]
    except (SyntaxError, IndexError):
        return None
    first = node.body[0]
    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)) or first.lineno == node.lineno:
        return None
    return first.lineno, first.end_lineno


def _dedent(source: str) -> str:
    lines = source.splitlines()
    indent = len(lines[0]) - len(lines[0].lstrip())
    return "\n".join(ln[indent:] if ln[:indent].isspace() or not ln[:indent] else ln for ln in lines)


def story(rng: random.Random, c: Corpus):
    ch, ch2 = rng.choice(CHARACTERS), rng.choice(CHARACTERS)
    place = rng.choice(PLACES)
    opener = rng.choice(STORY_OPENERS).format(c=ch, c2=rng.choice(["they", "she", "he"]) if rng.random() < 0.7 else ch2,
                                              p=place, P=place[0].upper() + place[1:], e=rng.choice(EVENTS))
    if not opener.endswith("\n\n"):
        extra = rng.sample(DETAILS, rng.choice([0, 0, 1, 2, 3]))
        opener = " ".join([opener, *extra]) if extra else opener
    return cap(opener), None, rng.choice([128, 160, 192, 256, 256]), 0.85


FAMILIES = [   # (name, generator, share of the file)
    ("qa", qa, 0.18), ("definition", definition, 0.10), ("translation", translation, 0.10),
    ("summary", summary, 0.10), ("list", listing, 0.09), ("email", email, 0.08), ("paragraph", paragraph, 0.13),
    ("code", code, 0.13), ("story", story, 0.09),
]


def serving_traffic(c: Corpus) -> list[dict]:
    quotas = [round(share * N_SERVING) for *_, share in FAMILIES]
    quotas[0] += N_SERVING - sum(quotas)
    seen: set[str] = set()
    rows = []
    for (name, make, _), quota, seed in zip(FAMILIES, quotas, range(100, 200), strict=False):
        rng = random.Random(seed)
        made, tries = 0, 0
        while made < quota:
            tries += 1
            if tries > quota * 50:
                raise SystemExit(f"{name}: only {made} distinct prompts after {tries} tries (wanted {quota})")
            prompt, stop, max_tokens, share = make(rng, c)
            if prompt is None or prompt in seen:
                continue
            seen.add(prompt)
            row = {"prompt": prompt, "max_tokens": max_tokens}
            if stop:
                row["stop"] = stop
            row.update(sampling(rng, share))
            rows.append(row)
            made += 1
    random.Random(7).shuffle(rows)
    return rows


# ----------------------------------------------------------------------------------------------------
# rag.jsonl

RAG_INSTRUCTION = "Answer the question using only the document below. Answer in one short sentence.\n\n"
VERBS = {"Return": "returns", "Create": "creates", "Get": "gets", "Set": "sets", "Make": "makes",
         "Convert": "converts", "Read": "reads", "Write": "writes", "Remove": "removes", "Add": "adds",
         "Close": "closes", "Open": "opens", "Send": "sends", "Parse": "parses", "Compute": "computes",
         "Check": "checks", "Test": "tests", "Find": "finds", "Build": "builds", "Encode": "encodes",
         "Decode": "decodes", "Copy": "copies", "Register": "registers", "Start": "starts", "Stop": "stops",
         "Wait": "waits", "Format": "formats", "Load": "loads", "Change": "changes", "Delete": "deletes",
         "Print": "prints", "Generate": "generates", "Construct": "constructs", "Split": "splits", "Join": "joins",
         "Raise": "raises", "Handle": "handles", "Update": "updates", "Insert": "inserts", "Call": "calls"}


@dataclass
class RagDoc:
    title: str
    text: str
    questions: list[str]


def reference_documents(c: Corpus, rng: random.Random) -> list[RagDoc]:
    """The reference text's sections, packed in order into documents of 4,000 to 12,000 characters."""
    out = []
    for key, text in c.refs.items():
        sections = reference_sections({key: text})
        chunk: list[tuple[str, str]] = []
        target = _target_length(rng)
        for title, body in sections:
            for part in _split_long(body, 9000):
                chunk.append((title, part))
                if sum(len(t) + len(b) for t, b in chunk) >= target:
                    out.append(_reference_doc(key, chunk))
                    chunk, target = [], _target_length(rng)
        if chunk and sum(len(t) + len(b) for t, b in chunk) >= 4000:
            out.append(_reference_doc(key, chunk))
    return out


def _target_length(rng: random.Random) -> int:
    """A retrieved document's length in characters: 4,000 plus an exponential tail (mean 1,200), at most
    11,000 (1,000 to 3,000 tokens)."""
    return int(min(11000, 4000 + rng.expovariate(1 / 1200)))


def _split_long(body: str, most: int) -> list[str]:
    if len(body) <= most:
        return [body]
    parts, current = [], ""
    for block in re.split(r"\n\n(?=\S)", body):
        if current and len(current) + len(block) > most * 0.6:
            parts.append(current)
            current = ""
        current = f"{current}\n\n{block}" if current else block
    return parts + [current] if current else parts


def _reference_doc(key: str, chunk: list[tuple[str, str]]) -> RagDoc:
    text = "\n\n".join(f"{t}\n{'=' * len(t)}\n\n{b}" for t, b in chunk)
    questions = []
    for title, body in chunk:
        if title != key:
            questions += [f"What does the section \"{title}\" describe?", f"What is said about {title.lower()}?"]
        for term in sorted(set(re.findall(r'"([A-Za-z_][\w.]*(?:\(\))?)"', body)))[:12]:
            questions += [f"What is \"{term}\" used for?", f"What does the document say about \"{term}\"?"]
        for term in sorted(set(re.findall(r"\*([a-z][a-z -]{2,30})\*", body)))[:8]:
            questions.append(f"What is meant by \"{term}\"?")
    if "Changed in version" in text:
        questions.append("Which Python version changed the behaviour described?")
    if "Added in version" in text or "New in version" in text:
        questions.append("In which Python version was this feature added?")
    questions += ["What is the main topic of this document?", "Which keyword or statement does this document describe?",
                  "Give one rule stated in the document.",
                  "What happens when an error occurs, according to the document?"]
    return RagDoc(chunk[0][0], text, sorted(set(questions)))


def module_documents(c: Corpus, rng: random.Random) -> list[RagDoc]:
    """A module's reference page built from its docstrings (as `pydoc` lays one out), cut into documents."""
    by_module: dict[str, list[Doc]] = {}
    for d in c.docs:
        if public(d):
            by_module.setdefault(d.module, []).append(d)
    out = []
    for module in sorted(by_module):
        entries = by_module[module]
        head = next((d for d in entries if d.kind == "module"), None)
        blocks = []
        chunk_q: list[list[str]] = []
        if head:
            blocks.append(f"Module {module}\n\n{_clean_block(head.text)}")
            chunk_q.append([f"What is the {module} module for?", f"What does the {module} module provide?"])
        for d in entries:
            if d.kind == "module":
                continue
            label = (f"class {d.name}" if d.kind == "class"
                     else f"{d.name}{d.signature.replace('(self, ', '(').replace('(self)', '()')}")
            blocks.append(re.sub(r"\n +\n", "\n\n", f"{label}\n    " + _clean_block(d.text).replace("\n", "\n    ")))
            qs = [f"What does {d.name} do?"]
            first = first_sentence(paragraphs(d.text)[0]) if paragraphs(d.text) else ""
            verb, _, rest = first.partition(" ")
            if verb in VERBS and rest.endswith(".") and len(rest) < 150:
                qs.append(f"Which {'class' if d.kind == 'class' else 'function'} {VERBS[verb]} {rest[:-1]}?")
            if d.kind != "class" and d.signature not in ("()", "(self)"):
                qs.append(f"What arguments does {d.name} take?")
            if re.search(r"\bRaises?\b|\braised?\b", d.text):
                qs.append(f"When does {d.name} raise an exception?")
            if re.search(r"\bReturns?\b|\breturned\b", d.text):
                qs.append(f"What does {d.name} return?")
            chunk_q.append(qs)
        total = sum(len(b) for b in blocks)
        if total < 4000:
            continue
        target, current, current_q = _target_length(rng), [], []
        for block, qs in zip(blocks, chunk_q, strict=False):
            if len(block) > 9000:
                continue
            current.append(block)
            current_q += qs
            if sum(len(b) + 2 for b in current) >= target:
                out.append(RagDoc(module, "\n\n".join(current), sorted(set(current_q))))
                current, current_q, target = [], [], _target_length(rng)
        if current and sum(len(b) + 2 for b in current) >= 4000:
            out.append(RagDoc(module, "\n\n".join(current), sorted(set(current_q))))
    return out


def _clean_block(text: str) -> str:
    """A docstring as a page shows it: doctest lines dropped, runs of blank lines collapsed."""
    kept = [ln.rstrip() for ln in text.splitlines() if not ln.strip().startswith((">>>", "... "))]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(kept)).strip()


def rag_traffic(c: Corpus) -> tuple[list[dict], dict]:
    rng = random.Random(11)
    docs, starts = [], set()
    for d in reference_documents(c, rng) + module_documents(c, rng):
        # topics overlap (the "compound" topic holds "try"'s text): one document per beginning
        if 4000 <= len(d.text) <= 12000 and len(d.questions) >= 8 and d.text[:1000] not in starts:
            starts.add(d.text[:1000])
            docs.append(d)
    rng.shuffle(docs)                                     # the collection retrieved from, in popularity order
    weights = [1 / (rank + 5) for rank in range(len(docs))]   # Zipf, flattened at the top
    asked: dict[int, list[str]] = {}
    rows, seen = [], set()
    while len(rows) < N_RAG:
        i = rng.choices(range(len(docs)), weights)[0]
        left = [q for q in docs[i].questions if q not in asked.get(i, [])]
        if not left:
            continue
        q = rng.choice(left)
        asked.setdefault(i, []).append(q)
        prompt = f"{RAG_INSTRUCTION}Document:\n{docs[i].text}\n\nQuestion: {q}\nAnswer:"
        if prompt in seen:
            continue
        seen.add(prompt)
        row = {"prompt": prompt, "max_tokens": rng.choice([16, 24, 32, 32, 48, 64]), "stop": ["\n"]}
        row.update(sampling(rng, 0.2))
        rows.append((i, row))
    rng.shuffle(rows)
    counts = sorted((len(v) for v in asked.values()), reverse=True)
    stats = {"collection": len(docs), "documents": len(counts), "asked_once": counts.count(1), "most_asked": counts[0],
             "top20_share": round(sum(counts[:20]) / N_RAG, 3),
             "sharing_requests": sum(n for n in counts if n > 1),
             "distinct_questions_of_most_asked": len(set(asked[max(asked, key=lambda k: len(asked[k]))]))}
    return [r for _, r in rows], stats


# ----------------------------------------------------------------------------------------------------


def percentile(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def describe(name: str, rows: list[dict]) -> None:
    lengths = [len(r["prompt"]) for r in rows]
    sampled = sum(r["temperature"] > 0 for r in rows) / len(rows)
    mt = [r["max_tokens"] for r in rows]
    print(f"{name}: {len(rows)} requests, {len({r['prompt'] for r in rows})} distinct prompts, sampled {sampled:.1%}, "
          f"max_tokens p10/p50/p90 {percentile(mt, .1)}/{percentile(mt, .5)}/{percentile(mt, .9)} "
          f"(<=64: {sum(m <= 64 for m in mt) / len(mt):.0%}, >=192: {sum(m >= 192 for m in mt) / len(mt):.0%}), "
          f"prompt chars p10/p50/p90/p99/max {percentile(lengths, .1)}/{percentile(lengths, .5)}/"
          f"{percentile(lengths, .9)}/{percentile(lengths, .99)}/{max(lengths)}")


def encode(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed files; write nothing")
    parser.add_argument("--force", action="store_true", help="write even where the output would differ")
    parser.add_argument("--print-digest", action="store_true", help="print the extracted text's SHA-256")
    args = parser.parse_args()
    corpus = build_corpus()
    digest = corpus_digest(corpus.docs, corpus.sources, corpus.refs)
    if args.print_digest:
        print(digest)
        return 0
    problems = []
    if sys.version_info[:3] != MADE_WITH:
        problems.append(f"this is Python {'.'.join(map(str, sys.version_info[:3]))}; the committed files were made "
                        f"with {'.'.join(map(str, MADE_WITH))}")
    if digest != CORPUS_SHA256:
        problems.append(f"the standard library's text here ({STDLIB}) has SHA-256 {digest[:16]}..., not the "
                        f"{CORPUS_SHA256[:16]}... the committed files were made from")
    if problems:
        print("warning: the output would differ from the committed files: " + "; ".join(problems), file=sys.stderr)
        if not (args.force or args.check):
            print("refusing to overwrite them (run with --force to write anyway)", file=sys.stderr)
            return 2
    serving = serving_traffic(corpus)
    rag, stats = rag_traffic(corpus)
    for name, rows in (("serving.jsonl", serving), ("rag.jsonl", rag)):
        if len({r["prompt"] for r in rows}) != len(rows):
            raise SystemExit(f"{name}: duplicate prompts")
        describe(name, rows)
    print(f"rag.jsonl documents: {stats}")
    differ = False
    for name, rows in (("serving.jsonl", serving), ("rag.jsonl", rag)):
        data, path = encode(rows), OUT / name
        if name == "rag.jsonl" and len(data) >= 4_000_000:
            raise SystemExit(f"{name}: {len(data)} bytes, over the 4 MB this file is kept under")
        if args.check:
            same = path.exists() and path.read_bytes() == data
            differ |= not same
            print(f"{path}: {'matches' if same else 'DIFFERS from'} the regenerated bytes")
        else:
            path.write_bytes(data)
            print(f"wrote {len(rows)} requests ({len(data) / 1e6:.2f} MB) to {path}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
