"""Documents with known content for the long-output extraction eval (issue 31 item 2).

Why generated: a KV policy that keeps the prompt and the early answer at low precision must
still let the model copy dozens of exact values out of a long document, and an eval of that
needs documents whose every record is known. So each document here is written from its records
by a seeded, pure-Python generator (no model, no network): an invoice's line items, a server
log's entries, an employee roster told in prose, a week's schedule. The same ``(seed, split,
index)`` always gives the same text and records, so the fixed split file
(``extract_split.py``) can be regenerated and compared byte for byte.

Every record value is written into the text in a form the test can find (numbers plainly or
with thousands separators, prices with two decimals), and each kind has one field that is
unique within a document (``KINDS[k].key``), so truth records are unambiguous.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field, create_model

from pask_agent.errors import ConfigError

GENERATOR_VERSION = 1


class InvoiceLine(BaseModel):
    sku: str = Field(description="the item code, e.g. KX-4821")
    description: str
    quantity: int
    unit_price: float = Field(description="price of one unit, a number without currency sign")


class LogEntry(BaseModel):
    timestamp: str = Field(description="as written, e.g. 2024-03-14T08:15:02Z")
    level: str = Field(description="DEBUG, INFO, WARN or ERROR")
    service: str
    code: str = Field(description="the message code, e.g. W2201")


class Employee(BaseModel):
    name: str
    department: str
    start_date: str = Field(description="YYYY-MM-DD")
    salary: int = Field(description="yearly salary in dollars, a whole number")


class ScheduleItem(BaseModel):
    event: str
    day: str
    start_time: str = Field(description="24-hour HH:MM")
    room: str


@dataclass(frozen=True, slots=True)
class Document:
    """One document and the records it states, in the order it states them."""

    id: str
    kind: str
    text: str
    records: tuple[Mapping[str, Any], ...]

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "text": self.text,
                "records": [dict(r) for r in self.records]}  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Document:
        return cls(str(data["id"]), str(data["kind"]), str(data["text"]),
                   tuple(dict(r) for r in data["records"]))  # fmt: skip


Writer = Callable[[random.Random, int], tuple[str, list[dict[str, Any]]]]


@dataclass(frozen=True, slots=True)
class Kind:
    """A document kind: its record model, the field unique within a document, what the prompt
    calls a record (one, several) and the document, the record counts drawn (log-uniform
    between ``min_records`` and ``max_records``) and the writer."""

    name: str
    record: type[BaseModel]
    key: str
    noun: str
    plural: str
    document: str
    min_records: int
    max_records: int
    write: Writer

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(self.record.model_fields)

    def answer(self, count: int | None = None) -> type[BaseModel]:
        """The model ``Runtime.call`` is asked for: one field, ``records: list[Record]``
        (``Runtime.call`` takes a Pydantic model class or a JSON Schema dict, and
        ``list[Record]`` is neither). ``count`` bounds the list to exactly that many records
        (the grammar closes it there); otherwise it has at least one. Why bound it: asked for
        an open list, the default model answered a 16-entry log with ``{"records": []}`` and
        copied a 20-employee roster correctly, then kept writing records until
        ``max_new_tokens`` cut the answer, which then scores 0."""
        least = count if count is not None else 1
        field = Field(min_length=least, max_length=count)
        name = f"{self.record.__name__}Records"
        return create_model(name, records=(list[self.record], field))  # type: ignore[call-overload]


_ADJ = ("galvanized", "brushed", "matte", "heavy-duty", "compact", "insulated", "coated",
        "reinforced", "slim", "anodized", "tempered", "flexible")  # fmt: skip
_MATERIAL = ("steel", "aluminium", "brass", "nylon", "oak", "copper", "polymer", "ceramic",
             "rubber", "glass")  # fmt: skip
_ITEM = ("bracket", "hinge", "valve", "bolt kit", "cable reel", "panel", "gasket", "bearing",
         "clamp", "spacer", "handle", "filter cartridge", "mounting rail", "coupling")  # fmt: skip
_VENDORS = ("Northwind Supply Co.", "Harbor Industrial", "Pike & Sons Hardware",
            "Meridian Parts Ltd.", "Alder Fabrication")  # fmt: skip


def _write_invoice(rng: random.Random, n: int) -> tuple[str, list[dict[str, Any]]]:
    prefixes = ["".join(rng.choices("ABCDEFGHJKLMNPRSTVWXZ", k=2)) for _ in range(4)]
    skus: set[str] = set()
    records = []
    while len(records) < n:
        sku = f"{rng.choice(prefixes)}-{rng.randint(1000, 9999)}"
        if sku in skus:
            continue
        skus.add(sku)
        desc = f"{rng.choice(_ADJ).capitalize()} {rng.choice(_MATERIAL)} {rng.choice(_ITEM)}"
        qty = rng.choice((rng.randint(1, 20), rng.randint(1, 250)))
        price = round(rng.uniform(0.5, 480.0), 2)
        records.append({"sku": sku, "description": desc, "quantity": qty, "unit_price": price})
    number = f"INV-{rng.randint(20000, 99999)}"
    lines = [f"INVOICE {number}", f"From: {rng.choice(_VENDORS)}",
             f"Date: 2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
             f"Bill to: {rng.choice(_FIRST)} {rng.choice(_LAST)}", ""]  # fmt: skip
    style = rng.randrange(3)
    if style == 0:
        lines += ["| SKU | Description | Qty | Unit price |", "|---|---|---|---|"]
        lines += [f"| {r['sku']} | {r['description']} | {r['quantity']} | ${r['unit_price']:.2f} |"
                  for r in records]  # fmt: skip
    elif style == 1:
        lines += [f"{r['sku']}  {r['description']}  x{r['quantity']}  @ {r['unit_price']:.2f} USD"
                  for r in records]  # fmt: skip
    else:
        lines += [f"- {r['quantity']} x {r['description']} (item {r['sku']}) at "
                  f"${r['unit_price']:,.2f} each" for r in records]  # fmt: skip
    subtotal = sum(r["quantity"] * r["unit_price"] for r in records)
    lines += ["", f"Subtotal: ${subtotal:,.2f}", f"Tax (8%): ${subtotal * 0.08:,.2f}",
              "Payment due within 30 days."]  # fmt: skip
    return "\n".join(lines), records


_LEVELS = ("DEBUG", "INFO", "INFO", "INFO", "WARN", "WARN", "ERROR")
_SERVICES = ("auth-service", "billing-api", "search-indexer", "gateway", "mailer",
             "report-worker", "inventory-db", "cache-proxy", "scheduler", "upload-svc")  # fmt: skip
_EVENTS = ("request completed", "token refresh slow", "connection reset by peer",
           "retrying upstream call", "cache miss ratio high", "job queued", "disk usage at 81%",
           "config reloaded", "timeout waiting for lock", "health check passed",
           "payload rejected: schema mismatch", "worker restarted")  # fmt: skip


def _write_log(rng: random.Random, n: int) -> tuple[str, list[dict[str, Any]]]:
    t = rng.randint(0, 20 * 3600)
    day = f"2024-{rng.randint(1, 12):02d}-{rng.randint(10, 28):02d}"
    host = f"node-{rng.randint(1, 40):02d}"
    kv_style = rng.random() < 0.4
    lines = [f"# {host} application log, {day} (UTC)"]
    records = []
    for _ in range(n):
        t += rng.randint(1, 140)  # strictly increasing: the timestamp is the key
        hh, mm, ss = t // 3600, t // 60 % 60, t % 60
        stamp = f"{day}T{hh:02d}:{mm:02d}:{ss:02d}Z"
        level = rng.choice(_LEVELS)
        service = rng.choice(_SERVICES)
        code = f"{level[0]}{rng.randint(1000, 9999)}"
        event = rng.choice(_EVENTS)
        records.append({"timestamp": stamp, "level": level, "service": service, "code": code})
        if kv_style:
            lines.append(f'ts={stamp} level={level} svc={service} code={code} msg="{event}"')
        else:
            lines.append(f"{stamp} {level:<5} [{service}] {code} {event}")
    lines.append(f"# end of log ({n} entries)")
    return "\n".join(lines), records


_FIRST = ("Maria", "James", "Aiko", "Noah", "Fatima", "Lucas", "Priya", "Elena", "Omar",
          "Grace", "Mateo", "Hana", "Samuel", "Zoe", "Ivan", "Leila", "Daniel", "Chen",
          "Amara", "Jonas", "Sofia", "Ravi", "Nora", "Tomas", "Yuki", "Ben", "Clara",
          "Kofi", "Ingrid", "Diego")  # fmt: skip
_LAST = ("Okafor", "Lindqvist", "Tanaka", "Moreau", "Haddad", "Novak", "Sharma", "Rossi",
         "Kowalski", "Fischer", "Alvarez", "Park", "Nguyen", "Brennan", "Costa", "Ibrahim",
         "Larsen", "Mendes", "Walsh", "Petrov", "Osei", "Keller", "Duarte", "Sato", "Quinn",
         "Berg", "Hughes", "Romero", "Varga", "Adeyemi")  # fmt: skip
_DEPARTMENTS = ("Engineering", "Finance", "Marketing", "Legal", "Operations", "Sales",
                "Research", "Support", "Design", "Human Resources")  # fmt: skip
_ROSTER_SENTENCES = (
    "{name} joined {department} on {start_date} and earns ${salary_c} a year.",
    "In {department}, {name} has worked since {start_date}; the salary is {salary_c} USD.",
    "{name} ({department}) started on {start_date} at an annual salary of ${salary}.",
    "Since {start_date}, {name} has been part of the {department} team, paid ${salary_c} per year.",
    "The {department} department hired {name} on {start_date}, with a yearly salary of "
    "${salary_c}.",
    "{name} earns ${salary_c} annually and has been in {department} since {start_date}.",
)


def _write_roster(rng: random.Random, n: int) -> tuple[str, list[dict[str, Any]]]:
    pairs = rng.sample([(f, s) for f in _FIRST for s in _LAST], n)
    records = []
    for first, last in pairs:
        year = rng.randint(2005, 2024)
        records.append({
            "name": f"{first} {last}", "department": rng.choice(_DEPARTMENTS),
            "start_date": f"{year}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
            "salary": rng.randrange(38_000, 185_000, 500),
        })  # fmt: skip
    company = rng.choice(("Brightline Analytics", "Kestrel Robotics", "Tidewater Health"))
    sentences = [
        rng.choice(_ROSTER_SENTENCES).format(**r, salary_c=f"{r['salary']:,}") for r in records
    ]
    paragraphs = [f"This memo lists the current staff of {company}."]
    i = 0
    while i < len(sentences):
        k = rng.randint(2, 5)
        paragraphs.append(" ".join(sentences[i : i + k]))
        i += k
    paragraphs.append("Figures are gross yearly salaries before bonuses.")
    return "\n\n".join(paragraphs), records


_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
_TOPICS = ("Budget", "Design", "Hiring", "Roadmap", "Security", "Vendor", "Onboarding",
           "Quarterly", "Data platform", "Support", "Launch", "Compliance", "Mobile",
           "Pricing", "Research")  # fmt: skip
_MEETINGS = ("review", "sync", "workshop", "panel", "planning", "retro", "demo", "briefing")
_ROOMS = ("B204", "C110", "Orion", "Atlas", "Lyra", "A301", "Harbor", "Summit", "D015",
          "Cedar")  # fmt: skip
_SCHEDULE_LINES = (
    "- {day} {start_time}: {event} ({room})",
    "{event} takes place on {day} at {start_time} in room {room}.",
    "On {day} at {start_time}, the {event} meets in {room}.",
    "* {event} | {day} | {start_time} | {room}",
)


def _write_schedule(rng: random.Random, n: int) -> tuple[str, list[dict[str, Any]]]:
    events = rng.sample([f"{t} {m}" for t in _TOPICS for m in _MEETINGS], n)
    records = []
    for event in events:
        time = f"{rng.randint(7, 18):02d}:{rng.choice((0, 15, 30, 45)):02d}"
        day = rng.choice(_DAYS)
        records.append({"event": event, "day": day, "start_time": time, "room": rng.choice(_ROOMS)})
    week = rng.randint(2, 51)
    lines = [f"Schedule for week {week}", "All times are local (24-hour clock).", ""]
    lines += [rng.choice(_SCHEDULE_LINES).format(**r) for r in records]
    lines += ["", "Rooms marked with a letter are in the main building."]
    return "\n".join(lines), records


KINDS: Mapping[str, Kind] = {
    k.name: k
    for k in (
        Kind("invoice", InvoiceLine, "sku", "line item", "line items", "invoice", 8, 50,
             _write_invoice),
        Kind("log", LogEntry, "timestamp", "log entry", "log entries", "server log", 7, 45,
             _write_log),
        Kind("roster", Employee, "name", "employee", "employees", "staff memo", 8, 50,
             _write_roster),
        Kind("schedule", ScheduleItem, "event", "event", "events", "schedule", 10, 65,
             _write_schedule),
    )
}  # fmt: skip


def kind_of(name: str) -> Kind:
    """Raises ``ConfigError`` naming the known kinds."""
    if name not in KINDS:
        raise ConfigError(f"unknown document kind {name!r}; use one of {', '.join(KINDS)}")
    return KINDS[name]


def generate(
    kind: str, seed: int | str, *, records: int | None = None, doc_id: str | None = None
) -> Document:
    """One document of ``kind`` from ``seed``; ``records`` fixes the record count (otherwise
    drawn log-uniform from the kind's range, which sizes the answer for the split)."""
    k = kind_of(kind)
    rng = random.Random(f"{GENERATOR_VERSION}:{kind}:{seed}")
    lo, hi = k.min_records, k.max_records
    n = records if records is not None else round(lo * (hi / lo) ** rng.random())
    if n < 1:
        raise ConfigError(f"a document needs at least one record, got {n}")
    text, recs = k.write(rng, n)
    return Document(doc_id or f"{kind}-{seed}", kind, text, tuple(recs))


def generate_split(
    seed: int, split: str, count: int, kinds: Sequence[str] = tuple(KINDS)
) -> list[Document]:
    """``count`` documents for one partition, kinds in rotation; ids ``<split>-<kind>-<i>``."""
    return [
        generate(kinds[i % len(kinds)], f"{seed}:{split}:{i}",
                 doc_id=f"{split}-{kinds[i % len(kinds)]}-{i:03d}")
        for i in range(count)
    ]  # fmt: skip


def surface_forms(value: Any) -> tuple[str, ...]:
    """How a record value may be written in its document (the consistency test looks for
    one): strings as they are, whole numbers plainly or with thousands separators, prices
    with two decimals."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return (str(value),)
    if isinstance(value, int):
        return (str(value), f"{value:,}")
    return (f"{value:.2f}", f"{value:,.2f}")


def answer_json(doc: Document) -> str:
    """The reference answer as ``Runtime.call`` asks for it: ``{"records": [...]}``."""
    import json

    return json.dumps({"records": [dict(r) for r in doc.records]}, ensure_ascii=False)
