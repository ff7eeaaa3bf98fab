"""The sandbox's tool registry: specs the runtime offers, and one ``execute`` for every call.

Why one door: the generator records the gold results, the scorer replays predicted calls and
the test replays gold ones, all through ``execute``, so the three cannot disagree on what a
call does. A call with unknown names or ill-typed arguments returns an ``{"error": ...}``
result and leaves the world as it was, as a real API would answer a bad request.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pask_agent.eval.agent_sandbox import files, orders, travel
from pask_agent.eval.agent_sandbox.world import World

_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool}


@dataclass(frozen=True, slots=True)
class Call:
    """One tool call: a name and its arguments (JSON values)."""

    name: str
    arguments: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": dict(self.arguments)}

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Call:
        return cls(str(data["name"]), dict(data.get("arguments") or {}))


SPECS: dict[str, dict[str, Any]] = {
    s["name"]: s for module in (travel, files, orders) for s in module.SPECS
}
FUNCTIONS = {**travel.FUNCTIONS, **files.FUNCTIONS, **orders.FUNCTIONS}
# what an omitted optional argument means (the functions' own defaults), so a call that spells
# a default out and one that leaves it out are the same call
DEFAULTS: dict[tuple[str, str], Any] = {("list_orders", "status"): "all",
                                        ("create_order", "quantity"): 1}  # fmt: skip
DOMAINS = {
    "travel": tuple(travel.FUNCTIONS), "files": tuple(files.FUNCTIONS),
    "orders": tuple(orders.FUNCTIONS),
}  # fmt: skip


def openai_tools(names: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """The tools as OpenAI tool dicts (``ToolSpec.from_any`` takes them), in registry order."""
    chosen = names if names is not None else tuple(SPECS)
    return [{"type": "function", "function": copy.deepcopy(SPECS[n])} for n in chosen]


def argument_error(name: str, arguments: Mapping[str, Any]) -> str:
    """Why a call does not fit its tool's schema ("" when it does)."""
    spec = SPECS.get(name)
    if spec is None:
        return f"unknown tool {name!r}"
    params = spec["parameters"]
    props = params["properties"]
    for key in params["required"]:
        if key not in arguments:
            return f"{name}: missing required argument {key!r}"
    for key, value in arguments.items():
        if key not in props:
            return f"{name}: unknown argument {key!r}"
        want = _TYPES[props[key]["type"]]
        if not isinstance(value, want) or (isinstance(value, bool) and want is not bool):
            return f"{name}: argument {key!r} must be {props[key]['type']}"
        if "enum" in props[key] and value not in props[key]["enum"]:
            return f"{name}: argument {key!r} must be one of {props[key]['enum']}"
    return ""


# A record's id follows the fields a user names it by (its name, its flight number and time,
# the flight a booking is for, the items of an order). Why: asked "book flight B6 1843" or
# "the file press_kit_v2.pptx", the default model copies the id that *follows* the name it
# finds; with the id first (the records' previous key order) it copied a neighbour's id even at
# Full KV: on the same 56 turns of three dev conversations, 22 right with the id first, 32 with
# this order (``results/dev_checks/agent_layout_{id_first,name_first}.md``; orders placed 0 → 3
# of 3, file details 0 → 5 of 7, orders cancelled 0 → 2 of 7).
NAMED_BY: dict[str, tuple[str, ...]] = {
    "flight_id": ("flight_number", "airline", "departure"),
    "file_id": ("name",),
    "product_id": ("name",),
    "order_id": ("items",),
    "booking_id": ("flight", "passenger_name"),
}


def name_first(value: Any) -> Any:
    """``value`` with every record's naming fields, then its id, ahead of its other fields."""
    if isinstance(value, list):
        return [name_first(v) for v in value]
    if not isinstance(value, dict):
        return value
    ids = [k for k in NAMED_BY if k in value]
    lead = [n for k in ids for n in NAMED_BY[k] if n in value] + ids
    order = lead + [k for k in value if k not in lead]
    return {k: name_first(value[k]) for k in dict.fromkeys(order)}


def execute(world: World, call: Call) -> dict[str, Any]:
    """Run ``call`` against ``world`` (mutated in place) and return the tool's JSON result, a
    copy that later calls cannot change, its records laid out name first (``NAMED_BY``)."""
    error = argument_error(call.name, call.arguments)
    if error:
        return {"error": error}
    return name_first(copy.deepcopy(FUNCTIONS[call.name](world, **call.arguments)))


def result_text(result: Mapping[str, Any]) -> str:
    """A result as the tool message's content (what the model reads)."""
    return json.dumps(result, ensure_ascii=False)
