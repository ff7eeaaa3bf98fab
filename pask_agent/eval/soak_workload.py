"""What the soak sends: the three workloads, their prompts, and a seeded plan of fates.

Why a file of its own: the requests and their mix are the soak's input, kept apart from how
it runs them (``soak.py``) and how it judges the result (``soak_report.py``). Outputs are
kept short and bounded on purpose (enum-only schemas, enum tool arguments), so a request
ends by its grammar, not by ``max_new_tokens``; SQL is free-form and may be cut, which
shows up as a query SQLite refuses, a model miss rather than a runtime fault.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import BaseModel

KINDS = ("tools", "structured", "sql")

CITIES = ("Oslo", "Paris", "Tokyo", "Lima", "Cairo", "Perth", "Quito", "Seoul")
TOOLS: list[dict[str, Any]] = [
    {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": list(CITIES)},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
    {
        "name": "local_time",
        "description": "The local time in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": list(CITIES)}},
            "required": ["city"],
        },
    },
]
TOOL_PROMPTS = (
    "What is the weather like in {city} right now?",
    "What time is it in {city}?",
    "Is it cold in {city} today, in fahrenheit?",
    "Tell me the local time in {city}, please.",
)


class Sentiment(BaseModel):
    """A review's sentiment: enum-only, so a grammar-complete answer is a few tokens."""

    label: Literal["positive", "negative", "neutral"]


class Rating(BaseModel):
    """A score out of five and whether to recommend."""

    stars: Literal[1, 2, 3, 4, 5]  # an enum: the grammar enforces it (ge/le it would not)
    recommend: bool


STRUCTURED = (
    (Sentiment, "Classify the sentiment of this review: '{text}'"),
    (Rating, "Rate this review from 1 to 5 stars: '{text}'"),
)
REVIEWS = (
    "The soup was cold and the waiter ignored us.",
    "Lovely little place, great coffee.",
    "It was fine, nothing special.",
    "Best pizza I have had in years!",
    "The room was noisy but the staff were kind.",
)


@dataclass(frozen=True, slots=True)
class SoakConfig:
    """How hard to push. The defaults are the full soak of issue 14 on the default model."""

    model: str = "default"
    requests: int = 200
    concurrency: int = 32
    cancel_fraction: float = 0.25
    timeout_fraction: float = 0.1
    max_new_tokens: int = 32
    time_limit_s: float = 1800.0
    rss_tolerance: float = 0.10
    seed: int = 0
    max_batch: int = 16


@dataclass(frozen=True, slots=True)
class Planned:
    """One request of the soak: its workload, its fate and the text it sends."""

    index: int
    kind: str
    fate: Literal["complete", "cancel", "timeout"]
    prompt: str
    delay_s: float  # cancel: seconds before the cancel (0: right after the first token)


def plan(config: SoakConfig, sql_questions: list[tuple[str, str]]) -> list[Planned]:
    """A seeded request list: kinds in turn, a quarter cancelled, some with short deadlines."""
    rng = random.Random(config.seed)
    n = config.requests
    n_cancel = round(n * config.cancel_fraction)
    n_timeout = round(n * config.timeout_fraction)
    fates = ["cancel"] * n_cancel + ["timeout"] * n_timeout
    fates += ["complete"] * (n - len(fates))
    rng.shuffle(fates)
    out = []
    for i, fate in enumerate(fates):
        kind = KINDS[i % len(KINDS)]
        if kind == "tools":
            prompt = rng.choice(TOOL_PROMPTS).format(city=rng.choice(CITIES))
        elif kind == "structured":
            prompt = str(rng.randrange(len(STRUCTURED))) + "|" + rng.choice(REVIEWS)
        else:
            db, question = rng.choice(sql_questions)
            prompt = f"{db}|{question}"
        # Tool requests are cancelled right after their first token (surely mid-decode); the
        # others after a random delay, which lands in the queue, the prefill, the decode or
        # the SQL execution.
        delay = 0.0 if kind == "tools" else rng.uniform(0.2, 6.0)
        if fate == "timeout":
            delay = rng.uniform(0.05, 0.4)
        out.append(Planned(i, kind, fate, prompt, delay))  # type: ignore[arg-type]
    return out


def warm_up_plan(config: SoakConfig, sql_questions: list[tuple[str, str]]) -> list[Planned]:
    """Requests that bring the process to its working size before the RSS baseline.

    As many SQL questions (the longest prompts) as can be live at once, started together,
    take the KV pools to their high-water mark (pools keep their capacity by design, so
    growth during the soak would read as a leak); two requests of each other kind compile
    their grammars.
    """
    live = min(config.concurrency, config.max_batch)
    n = 3 * live + 6
    calm = plan(replace(config, requests=n, cancel_fraction=0.0, timeout_fraction=0.0),
                sql_questions)  # fmt: skip
    sql = [p for p in calm if p.kind == "sql"][:live]
    return (
        sql
        + [p for p in calm if p.kind == "tools"][:2]
        + [p for p in calm if p.kind == "structured"][:2]
    )
