"""Write edits.jsonl: 3,000 completion requests whose answers copy most of their own prompt, the traffic
where n-gram (prompt-lookup) speculative decoding can win (deterministic: the committed file is its output).

Edit traffic as an editing or coding tool sends it to a base model (Gemma 3 270M: plain completions, no
chat template, no "<bos>" in the text, as in the other shipped files): an instruction, one solved example
(one of three fixed ones a task, as a product's few-shot template has) or none, then the text to edit;
the answer is that text with a small change. Ten tasks (shares of the requests): apply a change (a
rename, a new constant) to a Python module (14%), fix the spelling of a paragraph (12%, no example),
meeting notes as a bulleted list (10%), add a field to a JSON config (10%), set a value in a YAML file,
move a notice to a new date, add a row to a Markdown table, redact the email addresses and phone numbers
of a message, replace a company's name (no example), contact records as JSON (no example) (9% each).
Each task has one format and stops where its answers end (a blank line, "\n###", a closing code fence,
or the next request's label). The spelling, renaming and records tasks go without an example: Gemma 3
270M, shown one, mostly copied the example's answer instead of the request's text (transformers, greedy);
in the other tasks' formats it mostly copies the request's text, at times the example's.

Lengths: each answer's length is drawn log-uniform (about 50 to 420 tokens) and its text grown to it,
redrawn until the prompt is 150 to 900 tokens; max_tokens is the answer's length plus 15%, rounded up to
32 (64 to 512). Lengths are counted without a tokenizer (approx_tokens, within about 10% of Gemma's).
About 60% sampled (temperature 0.6 to 1.0, top_p 0.9 or 0.95), the rest greedy; none ignores EOS. Every
name, company, product, address, number and identifier is invented here from seeded random choices
(nothing is read from anywhere; email domains are under .example); no two prompts are the same.

    python3 bench/make_edit_traffic.py sandbox/data/traffic/edits.jsonl
    python3 bench/make_edit_traffic.py --chat 1000 sandbox/data/traffic/edits-chat.jsonl

--chat N: the first N of the same requests as chat (/v1/chat/completions, the shipped Gemma template), as
an editing tool sends them to a chat model whose answer it starts: the instruction and the text as the
user's message, the prompt's last line (the answer's label, with the line before a code fence) as the
start of the model's answer, continued (`continue_final_message: true, add_generation_prompt: false`,
vLLM's chat fields); max_tokens as max_completion_tokens, the same stops and sampling.
"""
from __future__ import annotations

import datetime
import json
import math
import random
import re
import sys
from pathlib import Path
from string import Template

SEED = 2027
N_REQUESTS = 3000
PROMPT_TOKENS = (150, 900)
ANSWER_TOKENS = (50, 420)
TEMPERATURES = [0.6, 0.7, 0.8, 0.9, 1.0]

# Invented vocabulary: names, places, companies, products, prose templates with {slots}
FIRST = ("Ada Bram Cora Dario Edith Femi Gita Hugo Ines Jonas Kira Luca Mara Nils Olga Pavel Quinn Rosa Sami "
         "Tove Uma Viktor Wren Yusuf Zora Anton Bea Caspar Dalia Emil Farah Gus Hana Ivo Jana Karim Lena Milo "
         "Nora Otto").split()
ROOT_A = "Al Bren Cor Dun El Fal Gar Hol Ir Jas Kel Lor Mar Nor Os Pen Quel Ros Sel Tor Ul Ven Wes Yor".split()
ROOT_B = "dale berg wick ton ley mont ridge sen ford holm by ard".split()
TOWN_END = "field haven mouth stead bridge moor wick port".split()
TRADES = ("Logistics, Foods, Print Works, Analytics, Dental Care, Outdoor, Robotics, Insurance, Bakery, Cycles, "
          "Water, Energy, Legal, Garden Centre").split(", ")
GOODS = ("kettle, desk lamp, air purifier, bike light, coffee grinder, label printer, router, blender, heater, "
         "drill, standing desk, baby monitor").split(", ")
PARTS = "filter battery lid charger hinge blade sensor cable handle pump".split()
TEAMS = "billing platform facilities support design logistics research data".split()
PLACES = ("main hall, library, canteen, workshop, east car park, meeting room 2, reception, warehouse, "
          "training room").split(", ")
DAYS = "Monday, Tuesday, Wednesday, Thursday, Friday, the end of the month, next week".split(", ")


def surname(r): return r.choice(ROOT_A) + r.choice(ROOT_B)
def person(r): return f"{r.choice(FIRST)} {surname(r)}"
def town(r): return r.choice(ROOT_A) + r.choice(TOWN_END)
def company(r): return f"{r.choice(ROOT_A)}{r.choice(['ex', 'ora', 'io', 'an', 'ix'])} {r.choice(TRADES)}"
def product(r): return f"{r.choice(ROOT_A)}{r.choice('oa')} {r.choice('KMRTVX')}{r.randint(2, 90)} {r.choice(GOODS)}"
def slug(s): return re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-")
def email(r): return f"{r.choice(FIRST).lower()}.{surname(r).lower()}@{slug(company(r).split()[0])}.example"
def digits(r, *widths): return " ".join(str(r.randint(10 ** (w - 1), 10 ** w - 1)) for w in widths)
def phone(r): return r.choice([f"0{digits(r, 3, 3, 4)}", f"+{r.randint(30, 49)} {digits(r, 3, 3, 3)}"])
def pick(*values): return lambda r: r.choice(values)
def clock(r): return f"{r.randint(7, 18)}:{r.choice(['00', '15', '30', '45'])}"
def price(r): return r.choice(["$", "EUR ", "GBP "]) + f"{r.randint(2, 900)}.{r.choice(['00', '50', '95', '99'])}"


def day(r, style: int = 0) -> str:
    d = datetime.date(2026, 1, 1) + datetime.timedelta(days=r.randint(0, 729))
    return [f"{d:%A} {d.day} {d:%B} {d.year}", d.isoformat(), f"{d:%d/%m/%Y}", f"{d:%B} {d.day}, {d.year}"][style]


SLOTS = {
    "first": pick(*FIRST), "name": person, "town": town, "company": company, "product": product, "part": pick(*PARTS),
    "team": pick(*TEAMS), "place": pick(*PLACES), "street": lambda r: f"{town(r)} {r.choice(['Road', 'Lane'])}",
    "address": lambda r: f"{r.randint(2, 240)} {town(r)} Road, {town(r)}", "date": day, "time": clock,
    "n": lambda r: str(r.randint(2, 60)), "price": price, "email": email, "phone": phone, "day": pick(*DAYS),
    "letter": pick(*"ABCDEF"),   # below: pieces of meeting notes
    "action": pick("send the revised quote to {company}", "book the {place} for the training day", "update the rota",
                   "check the stock of {part}s", "call the supplier in {town}", "draft the newsletter",
                   "test the {product} with two customers", "renew the insurance", "move the backups to the cloud"),
    "decision": pick("move the stand-up to {time}", "pause hiring until {date}", "drop paper invoices",
                     "keep the {place} open on Saturdays", "ship the {product} in two colours",
                     "switch the printer contract to {company}"),
    "finding": pick("returns of the {product} fell by {n} percent", "the {part} supplier is late again",
                    "the website was down for {n} minutes on {day}", "customer calls doubled in May",
                    "the {team} team is short of two people"),
}


def fill(r: random.Random, text: str, **fixed: str) -> str:
    """Each {slot} replaced by an invented value (fixed ones as given), until none is left."""
    while "{" in text:
        text = re.sub(r"\{(\w+)\}", lambda m: fixed.get(m[1]) or SLOTS[m[1]](r), text)
    return text


PROSE = """{name} from the {team} team will lead the session.
Please bring your badge, because the {place} entrance is locked after {time}.
The {product} ships with a two-year warranty and a spare {part}.
Orders placed before {time} on a weekday leave our warehouse in {town} the same day.
If the {part} makes a clicking noise, switch it off and write to {email}.
Parking is free on {street} after six in the evening.
Refunds are paid back to the original card within {n} working days.
The new {part} is {n} millimetres wider than the old one, so check the fit first.
Our office at {address} is open from {time} to {time} on weekdays.
Tickets cost {price} for adults and half price for children under twelve.
Customers can call {phone} to change a delivery slot.
The water supply on {street} will be interrupted between {time} and {time}.
The lift in building {letter} is out of service until further notice.
The {product} can be cleaned with warm water and a soft cloth.
Late returns are charged {price} a day, up to a maximum of {price}.
Minutes of the last meeting are attached for anyone who missed it.
We are sorry for the delay and thank you for your patience.
Remember to label every box with your name and room number.
{name} will send the final figures to the board before {day}.""".splitlines()
DATED = """The {event} will take place on {date} in the {place}.
Doors open at {time} on {date}, and the first talk starts half an hour later.
Please register by email before {date} so that we can plan the catering.
Anyone who cannot come on {date} can watch the recording the following week.""".splitlines()
EVENTS = ["annual members' meeting", "open day", "fire drill", "summer fair", "staff training", "board meeting"]
BRANDED = """{company} thanks every customer who took part in last year's survey.
From {day}, {company} will deliver to {town} twice a week.
Questions about your account can be sent to {company} at {email}.
Staff of {company} will wear a blue badge during the visit.
The annual report of {company} is available at the front desk.""".splitlines()
NOTES = """{first} will {action} by {day}.
Agreed to {decision}.
{first} reported that {finding}.
Next meeting on {date} at {time} in the {place}.
Budget for the {team} project approved at {price}.
{first} and {first} will {action}.""".splitlines()
PRIVATE = """You can reach me on {phone} or at {email}.
{name} ({email}) will handle the invoice from now on.
For urgent questions call the front desk on {phone}.
Please copy {email} on any reply about the delivery.""".splitlines()


def paragraph(r, n, pool=PROSE, **fixed):
    """n sentences, each template used once before any is used again."""
    order = r.sample(pool, len(pool))
    return " ".join(fill(r, order[i % len(order)], **fixed) for i in range(n))


def typos(r, text):
    """Spelling mistakes in about one word in seven (letters swapped, dropped, doubled or changed)."""
    def one(m):
        w = m[0]
        if len(w) < 4 or r.random() > 0.15:
            return w
        i = r.randrange(1, len(w) - 1)
        out = r.choice([w[:i] + w[i + 1] + w[i] + w[i + 2:], w[:i] + w[i + 1:], w[:i] + w[i] + w[i:],
                        w[:i] + r.choice("aeiou") + w[i + 1:]])
        return out if out != w else w[:i] + w[i + 1:]
    return " ".join(w if "@" in w else re.sub(r"\b[a-z]+\b", one, w) for w in text.split(" "))


# Structured text: configs, tables, records, code
CONFIG_KEYS = {
    "service": lambda r: {"name": f"{r.choice(TEAMS)}-{r.choice(['api', 'worker', 'gateway', 'sync'])}",
                          "replicas": r.randint(1, 8), "port": r.choice([8000, 8080, 9090, 5000]),
                          "image": f"registry.example/{r.choice(TEAMS)}:{r.randint(1, 4)}.{r.randint(0, 20)}.0"},
    "database": lambda r: {"host": f"db-{r.randint(1, 9)}.internal", "port": 5432, "name": slug(town(r)),
                           "pool_size": r.choice([5, 10, 20]), "ssl": r.choice([True, False])},
    "cache": lambda r: {"backend": r.choice(["redis", "memcached"]), "ttl_s": r.choice([60, 300, 3600]),
                        "max_items": r.choice([1000, 5000, 20000])},
    "logging": lambda r: {"level": r.choice(["debug", "info", "warning"]), "format": r.choice(["json", "text"]),
                          "file": f"/var/log/{r.choice(TEAMS)}.log"},
    "mail": lambda r: {"sender": email(r), "smtp_host": f"smtp.{slug(town(r))}.example", "retries": r.randint(1, 5)},
    "limits": lambda r: {"requests_per_minute": r.choice([60, 120, 600]), "max_upload_mb": r.choice([10, 25, 100]),
                         "timeout_s": r.choice([5, 10, 30])},
    "features": lambda r: r.sample(["export", "audit", "dark_mode", "beta_search", "sso", "webhooks", "reports"], 3),
}
NEW_FIELDS = {"retries": pick(2, 3, 6), "region": pick("eu-west", "us-east", "ap-south"), "enabled": pick(True, False),
              "owner": email, "timeout_s": pick(15, 45)}


def config(r, n):
    names = list(CONFIG_KEYS)
    return {k: CONFIG_KEYS[k](r) for k in (["service"] + r.sample(names[1:], len(names) - 1))[:n]}


def yaml_dump(value, indent=0) -> str:
    pad, lines = "  " * indent, []
    for k, v in value.items():
        if isinstance(v, dict):
            lines += [f"{pad}{k}:", yaml_dump(v, indent + 1)]
        elif isinstance(v, list):
            lines += [f"{pad}{k}:"] + [f"{pad}  - {x}" for x in v]
        else:
            lines.append(f"{pad}{k}: {str(v).lower() if isinstance(v, bool) else v}")
    return "\n".join(lines)


TABLES = {
    "order_id,customer,city,item,qty,total":
        lambda r: [f"A-{r.randint(10000, 99999)}", person(r), town(r), product(r), r.randint(1, 9), price(r)],
    "name,role,team,extension,start_date":
        lambda r: [person(r), r.choice(["analyst", "engineer", "manager", "designer", "technician"]),
                   r.choice(TEAMS), r.randint(200, 899), day(r, 1)],
    "sku,product,warehouse,stock,reorder_level":
        lambda r: [f"{r.choice('KMRTVX')}{digits(r, 3)}-{digits(r, 2)}", product(r), town(r), r.randint(0, 500),
                   r.choice([10, 25, 50])],
}
CODE = [Template('''def ${verb}_${noun}s(${noun}s, limit=${CONST}):
    """${Verb} the ${noun}s and group them by ${attr}."""
    groups = defaultdict(list)
    for ${noun} in ${noun}s:
        if ${noun}.${attr2} < ${CONST2}:
            continue
        groups[${noun}.${attr}].append(${noun})
        if len(groups) >= limit:
            log.warning("stopped after %d groups", limit)
            break
    return dict(groups)'''), Template('''def ${verb}_${noun}(client, ${noun}_id):
    """Fetch one ${noun} by id, retrying on timeouts."""
    for attempt in range(${CONST}):
        try:
            return client.get("/${noun}s/%s" % ${noun}_id, timeout=${CONST2})
        except TimeoutError:
            log.info("retry %d for ${noun} %s", attempt + 1, ${noun}_id)
    raise LookupError("${noun} %s not found" % ${noun}_id)'''), Template('''def ${verb}_${attr}_totals(rows):
    """Sum the ${attr} of each ${attr2}, largest first."""
    totals = {}
    for row in rows:
        key = row["${attr2}"]
        totals[key] = totals.get(key, 0) + row["${attr}"]
    log.debug("%d ${attr2} values", len(totals))
    return sorted(totals.items(), key=lambda item: item[1], reverse=True)''')]
VERBS = "load parse merge count filter export group score clean rank".split()
NOUNS = "order invoice sensor ticket route parcel reading booking shift sample".split()
ATTRS = "status weight region price owner priority duration batch_id zone".split()
CONSTS = "MAX_RETRIES BATCH_SIZE TIMEOUT_S MIN_SCORE PAGE_SIZE MAX_GROUPS".split()


def module(r, n):
    """A Python module of n functions, with its constants; returns (source, constants)."""
    consts = {c: r.choice([3, 5, 10, 30, 50, 100]) for c in r.sample(CONSTS, 3)}
    head = ["import logging", "from collections import defaultdict", "", "log = logging.getLogger(__name__)", ""]
    head += [f"{k} = {v}" for k, v in consts.items()]
    funcs = [r.choice(CODE).substitute(verb=v, Verb=v.capitalize(), noun=r.choice(NOUNS), attr=r.choice(ATTRS),
                                       attr2=r.choice(ATTRS), CONST=r.choice(list(consts)),
                                       CONST2=r.choice(list(consts))) for v in (r.choice(VERBS) for _ in range(n))]
    return "\n".join(head) + "\n\n\n" + "\n\n\n".join(funcs), consts


def code_change(r, n):
    source, consts = module(r, n)
    if r.random() < 0.4:
        name = r.choice(list(consts))
        new = r.choice([v for v in (2, 4, 8, 20, 60, 200) if v != consts[name]])
        return f"Change {name} to {new}.", source, source.replace(f"{name} = {consts[name]}", f"{name} = {new}")
    old, new = r.choice([("log", "logger")] + [(c, "DEFAULT_" + c) for c in consts] +
                        [(a, a + "_key") for a in ATTRS if re.search(rf"\b{a}\b", source)])
    return f"Rename `{old}` to `{new}`.", source, re.sub(rf"\b{old}\b", new, source)


# The tasks: each makes (the request up to its answer cue, the answer) for a size n

def t_spell(r, n):
    text = paragraph(r, n)
    return f"Text: {typos(r, text)}\nFixed:", f" {text}"


def t_bullets(r, n):
    head, notes = fill(r, "Meeting of the {team} team, {date}"), [fill(r, r.choice(NOTES)) for _ in range(n + 1)]
    return f"Notes:\n{head}\n" + "\n".join(notes) + "\nList:\n", head + "".join(f"\n- {s.rstrip('.')}" for s in notes)


def t_json(r, n):
    cfg = config(r, n)
    section = r.choice([k for k, v in cfg.items() if isinstance(v, dict)])
    key = r.choice([k for k in NEW_FIELDS if k not in cfg[section]])
    value, before = NEW_FIELDS[key](r), json.dumps(cfg, indent=2)
    cfg[section][key] = value
    case = f'Field: "{key}": {json.dumps(value)} in "{section}"\nConfig:\n{before}\nResult:\n'
    return case, json.dumps(cfg, indent=2)


def t_yaml(r, n):
    cfg = config(r, n)
    section = r.choice([k for k, v in cfg.items() if isinstance(v, dict)])
    key = r.choice(list(cfg[section]))
    old, before = cfg[section][key], yaml_dump(cfg)
    cfg[section][key] = new = (not old) if isinstance(old, bool) else old * 2 if isinstance(old, int) else f"{old}-v2"
    shown = str(new).lower() if isinstance(new, bool) else new
    return (f"Change: set {section}.{key} to {shown}\nBefore:\n```yaml\n{before}\n```\nAfter:\n```yaml\n",
            yaml_dump(cfg) + "\n```")


def t_date(r, n):
    style = r.randrange(4)
    old, new = day(r, style), day(r, style)
    event = r.choice(EVENTS)
    pool = PROSE + [s.replace("{event}", event) for s in DATED[1:]]
    text = fill(r, DATED[0].replace("{event}", event), date=old) + " " + paragraph(r, n, pool, date=old)
    return f"Old date: {old}\nNew date: {new}\nNotice: {text}\nUpdated notice:", " " + text.replace(old, new)


def t_table(r, n):
    header = r.choice(list(TABLES))
    rows = [[str(x) for x in TABLES[header](r)] for _ in range(n + 2)]
    table = [f"| {' | '.join(x)} |" for x in [header.split(","), *rows]]
    table.insert(1, "|" + "---|" * len(rows[0]))
    before = "\n".join(table[:-1])
    return f"Table:\n{before}\nNew row: {','.join(rows[-1])}\nUpdated table:\n", "\n".join(table)


def t_code(r, n):
    change, before, after = code_change(r, max(1, n // 2))
    return f"Change: {change}\nBefore:\n```python\n{before}\n```\nAfter:\n```python\n", after + "\n```"


def t_redact(r, n):
    lines = [f"Hi {r.choice(FIRST)},", ""]
    for _ in range(n):
        lines += [paragraph(r, r.randint(1, 3)) + " " + fill(r, r.choice(PRIVATE)), ""]
    lines += ["Best regards,", person(r), phone(r)]
    text = "\n".join(lines)
    redacted = re.sub(r"\S+@\S+\.example|\+?\d{2,4}(?: \d{3,4}){2,3}", "[REDACTED]", text)
    return f"Message:\n{text}\nRedacted:\n", redacted


def t_rename(r, n):
    old, new, first = company(r), company(r), r.choice(BRANDED)
    while new == old:
        new = company(r)
    pool = [s for s in BRANDED if s != first] + PROSE
    text = fill(r, first, company=old) + " " + paragraph(r, n, pool, company=old)
    return f'Input: {text}\nInstruction: replace "{old}" with "{new}".\nOutput:', " " + text.replace(old, new)


def t_records(r, n):
    people = [{"name": person(r), "company": company(r), "email": email(r), "phone": phone(r), "city": town(r)}
              for _ in range(n)]
    text = "\n\n".join("\n".join(f"{k.capitalize()}: {v}" for k, v in p.items()) for p in people)
    return f"Records:\n{text}\nJSON:\n", json.dumps(people, indent=2)


FENCE, HASH = ["\n```"], "\n###\n"
TASKS = {   # name: (share, instruction, what follows the example (None: no example), stop, make, the largest size)
    "spell": (12, "Fix the spelling mistakes in the text. Change nothing else.", None, ["\n\n", "\nText:"],
              t_spell, 30),
    "bullets": (10, "Rewrite the meeting notes as a bulleted list, one point per line.", HASH, ["\n###", "\nNotes:"],
                t_bullets, 30),
    "json": (10, "Add the field to the JSON config and return the whole config.", HASH, ["\n###", "\nField:"],
             t_json, 7),
    "yaml": (9, "Apply the change to the YAML file.", "\n\n", FENCE, t_yaml, 7),
    "date": (9, "The event has moved. Update the date in the notice and keep everything else as it is.", "\n\n",
             ["\n\n", "\nOld date:"], t_date, 30),
    "table": (9, "Add the new row at the end of the Markdown table.", "\n\n", ["\n\n", "\nTable:"], t_table, 40),
    "code": (14, "# Apply the change to the code and return the whole file.", "\n\n", FENCE, t_code, 10),
    "redact": (9, "Replace every email address and phone number with [REDACTED]. Keep the rest exactly as written.",
               HASH, ["\n###", "\nMessage:"], t_redact, 12),
    "rename": (9, "", None, ["\n\n", "\nInput:"], t_rename, 30),   # no example (the instruction is in the case)
    "records": (9, "Convert the contact records to a JSON list of objects with the keys name, company, email, phone "
                "and city. Keep every value exactly as written.", None, ["\n\n\n", "\nRecords:"], t_records, 12),
}


def approx_tokens(text: str) -> int:
    """Gemma-like count without a tokenizer: a word (long ones per 8 letters), each digit, each symbol and
    newline, and each run of spaces used for indentation."""
    return len(re.findall(r"[A-Za-z]{1,8}|\d|[^\sA-Za-z\d]|\n|  +", text))


def grown(make, r: random.Random, target: int, largest: int):
    """The case at the smallest size whose answer reaches target tokens (the same text, grown)."""
    seed = r.getrandbits(32)
    for n in range(1, largest + 1):
        case, answer = make(random.Random(seed), n)
        if approx_tokens(answer) >= target:
            break
    return case, answer


def examples(r: random.Random) -> dict[str, list[str]]:
    """Three solved examples a task shown one (a product's few-shot template): short, middling, longer."""
    return {name: [case + answer for case, answer in (grown(task[4], r, t, task[5]) for t in (35, 80, 150))]
            for name, task in TASKS.items() if task[2] is not None}


def draw(r: random.Random, name: str, shots: dict[str, list[str]]) -> tuple[str, str]:
    """One request of a task, (prompt, the answer it asks for), its length drawn until the prompt fits."""
    _, instruction, between, _, make, largest = TASKS[name]
    while True:
        target = round(math.exp(r.uniform(math.log(ANSWER_TOKENS[0]), math.log(ANSWER_TOKENS[1]))))
        case, answer = grown(make, r, target, largest)
        shot = "" if between is None else r.choice(shots[name]) + between
        prompt = (instruction and instruction + "\n\n") + shot + case
        if PROMPT_TOKENS[0] <= approx_tokens(prompt) <= PROMPT_TOKENS[1] and approx_tokens(answer) <= 445:
            return prompt, answer


def generate(n: int = N_REQUESTS) -> list[tuple[str, dict, str]]:
    """(task, request body, the answer a faithful editor would give) for n distinct prompts."""
    r = random.Random(SEED)
    shots = examples(r)
    names = list(TASKS)
    out, seen = [], set()
    while len(out) < n:
        name = r.choices(names, weights=[TASKS[k][0] for k in names])[0]
        prompt, answer = draw(r, name, shots)
        if prompt in seen:
            continue
        seen.add(prompt)
        expected = approx_tokens(answer)
        row = {"prompt": prompt, "max_tokens": min(512, max(64, math.ceil(expected * 1.15 / 32) * 32)),
               "stop": TASKS[name][3]}
        if r.random() < 0.6:
            row.update(temperature=r.choice(TEMPERATURES), top_p=r.choice([0.9, 0.95]))
        else:
            row["temperature"] = 0.0
        out.append((name, row, answer))
    return out


def as_chat(row: dict) -> dict:
    """A completions row as the chat request an editing tool sends: the answer's label as its start."""
    lines = row["prompt"].rstrip("\n").split("\n")
    cue = 2 if lines[-1].startswith("```") else 1
    body = {k: v for k, v in row.items() if k not in ("prompt", "max_tokens")}
    return {"messages": [{"role": "user", "content": "\n".join(lines[:-cue])},
                         {"role": "assistant", "content": "\n".join(lines[-cue:])}],
            "max_completion_tokens": row["max_tokens"], **body,
            "add_generation_prompt": False, "continue_final_message": True}


def main() -> None:
    args = sys.argv[1:]
    chat = int(args.pop(1)) if len(args) == 3 and args[0] == "--chat" else None
    if chat is not None:
        args = args[1:]
    if len(args) != 1:
        sys.exit("usage: python3 bench/make_edit_traffic.py [--chat N] OUT.jsonl")
    rows = [row for _, row, _ in generate()]
    if chat is not None:
        rows = [as_chat(row) for row in rows[:chat]]
    sys.argv[1:] = args
    Path(sys.argv[1]).write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"wrote {len(rows)} requests to {sys.argv[1]}")


if __name__ == "__main__":
    main()
