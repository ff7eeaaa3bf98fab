"""Agent conversations over the sandbox: user turns whose right call needs earlier results.

Why generated, with the gold trajectory recorded: a turn such as "cancel the order you placed
first" has one right call only given what the earlier turns returned, so the generator runs
every gold call against the world as it goes and records each result. The model is asked turn
``k`` with the gold trajectory of turns ``0..k-1`` as its history (teacher forcing): a wrong
turn does not poison the turns after it, so per-turn accuracy measures reading the history,
not recovering from one's own mistakes.

A conversation is kept going until it has at least ``min_turns`` turns and its history holds
at least ``min_history_chars`` characters of text (about 6,000+ tokens of the default model's
tokenizer; ``tests/eval/test_agent_eval.py`` measures it), at most ``max_turns``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pask_agent.errors import ConfigError
from pask_agent.eval.agent_sandbox import templates
from pask_agent.eval.agent_sandbox.tools import SPECS, Call, execute, result_text
from pask_agent.eval.agent_sandbox.world import World, make_world

GENERATOR_VERSION = 3
MIN_TURNS = 12
MAX_TURNS = 20
MIN_HISTORY_CHARS = 15_000  # JSON results run about 2.5 characters per token
DEPENDENT_WEIGHT = 2.5


@dataclass(frozen=True, slots=True)
class AgentTurn:
    """One user request, the gold calls that answer it and the results they returned, the
    assistant's closing line, and the earlier turns whose results the gold calls need."""

    request: str
    kind: str
    gold: tuple[Call, ...]
    results: tuple[str, ...]
    reply: str
    depends_on: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "request": self.request, "kind": self.kind,
            "gold": [c.to_json() for c in self.gold], "results": list(self.results),
            "reply": self.reply, "depends_on": list(self.depends_on),
        }  # fmt: skip

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> AgentTurn:
        return cls(
            str(data["request"]), str(data["kind"]), tuple(Call.of(c) for c in data["gold"]),
            tuple(str(r) for r in data["results"]), str(data["reply"]),
            tuple(int(t) for t in data.get("depends_on", ())),
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class AgentConversation:
    """A conversation of the sandbox: its world's seed, system prompt and turns."""

    id: str
    world_seed: int
    system: str
    turns: tuple[AgentTurn, ...]

    def messages(self, k: int) -> list[dict[str, Any]]:
        """The prompt of turn ``k``: the system line, turns ``0..k-1`` as the gold trajectory
        (request, the gold calls, their results, the closing line) and request ``k``."""
        if not 0 <= k < len(self.turns):
            raise ConfigError(f"{self.id} has {len(self.turns)} turns; no turn {k}")
        out: list[dict[str, Any]] = [{"role": "system", "content": self.system}]
        for j, turn in enumerate(self.turns[:k]):
            ids = [f"call_{j}_{m}" for m in range(len(turn.gold))]
            out.append({"role": "user", "content": turn.request})
            out.append({
                "role": "assistant", "content": "",
                "tool_calls": [
                    {"id": i, "type": "function",
                     "function": {"name": c.name, "arguments": json.dumps(dict(c.arguments))}}
                    for i, c in zip(ids, turn.gold, strict=True)
                ],
            })  # fmt: skip
            out += [{"role": "tool", "tool_call_id": i, "content": r}
                    for i, r in zip(ids, turn.results, strict=True)]  # fmt: skip
            out.append({"role": "assistant", "content": turn.reply})
        out.append({"role": "user", "content": self.turns[k].request})
        return out

    def world_before(self, k: int) -> World:
        """The sandbox state when turn ``k`` is asked: the seed's world after every gold call
        of turns ``0..k-1``."""
        world = make_world(self.world_seed)
        for turn in self.turns[:k]:
            for call in turn.gold:
                execute(world, call)
        return world

    def tool_names(self) -> tuple[str, ...]:
        """The tools its gold calls use, in registry order: what the model is offered on every
        turn (as a deployed agent is given its tools once, not the right one per turn)."""
        used = {c.name for t in self.turns for c in t.gold}
        return tuple(name for name in SPECS if name in used)

    def history_chars(self) -> int:
        return sum(len(m.get("content") or "") for m in self.messages(len(self.turns) - 1))

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "world_seed": self.world_seed, "system": self.system,
                "turns": [t.to_json() for t in self.turns]}  # fmt: skip

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> AgentConversation:
        return cls(str(data["id"]), int(data["world_seed"]), str(data["system"]),
                   tuple(AgentTurn.of(t) for t in data["turns"]))  # fmt: skip


def system_prompt(world: World) -> str:
    user = world["user"]
    return (
        f"You are an assistant with access to travel, shared-drive and shopping tools. You act "
        f"for {user['name']} ({user['email']}), who lives at {user['address']}. Today is "
        f"{world['today']}. Answer each request with the right tool call, using ids and values "
        "from earlier tool results in this conversation when the request refers to them."
    )


def generate_conversation(
    conversation_id: str,
    world_seed: int,
    *,
    min_turns: int = MIN_TURNS,
    max_turns: int = MAX_TURNS,
    min_history_chars: int = MIN_HISTORY_CHARS,
) -> AgentConversation:
    """One conversation, from ``world_seed`` alone (the same seed gives the same turns).

    Raises
    ------
    ConfigError
        ``min_turns`` below 2 or above ``max_turns``.
    """
    if not 2 <= min_turns <= max_turns:
        raise ConfigError(f"need 2 <= min_turns <= max_turns, got {min_turns} and {max_turns}")
    world = make_world(world_seed)
    rng = random.Random(f"turns:{world_seed}")
    memo = templates.Memo()
    turns: list[AgentTurn] = []
    system = system_prompt(world)
    chars = before_last = len(system)
    uses: dict[str, int] = {}
    asked: set[str] = set()  # gold calls so far: a request is never repeated word for word
    while len(turns) < max_turns and (len(turns) < min_turns or before_last < min_history_chars):
        plan = _next_plan(memo, world, rng, uses, asked)
        if plan is None:
            break
        result = execute(world, plan.call)
        if "error" in result:  # a template asked for something the world refuses: a bug
            raise ConfigError(f"{conversation_id}: gold call {plan.call} failed: {result}")
        text = result_text(result)
        turns.append(AgentTurn(plan.request, plan.kind, (plan.call,), (text,),
                               plan.reply(result), plan.depends_on))  # fmt: skip
        memo.remember(plan.kind, len(turns) - 1, plan.call, result)
        uses[plan.kind] = uses.get(plan.kind, 0) + 1
        asked.add(_key(plan.call))
        before_last = chars + len(plan.request)
        chars += len(plan.request) + len(text) + len(turns[-1].reply)
        chars += len(json.dumps(dict(plan.call.arguments)))
    return AgentConversation(conversation_id, world_seed, system, tuple(turns))


def _key(call: Call) -> str:
    return json.dumps(call.to_json(), sort_keys=True)


def _next_plan(
    memo: templates.Memo,
    world: World,
    rng: random.Random,
    uses: Mapping[str, int],
    asked: set[str],
) -> templates.Plan | None:
    """A random applicable template: dependent ones weighted up (the point of the eval), each
    weighted down by how often it ran already (so the kinds stay mixed), the first turn always
    opening a thread. A template gets the world's copy and its own random generator, so one
    that declines changes nothing; a plan whose gold call was asked before is declined too
    (the same request twice tests nothing new)."""
    first = not uses
    pool = list(templates.INDEPENDENT) + ([] if first else list(templates.DEPENDENT))
    weights = [
        (1.0 if t in templates.INDEPENDENT else DEPENDENT_WEIGHT) / (1 + uses.get(t.__name__, 0))
        for t in pool
    ]
    while pool:
        (make,) = rng.choices(pool, weights)
        plan = make(memo, copy.deepcopy(world), random.Random(rng.random()))
        if plan is not None and _key(plan.call) not in asked:
            return plan
        k = pool.index(make)
        del pool[k], weights[k]
    return None


def conversation_seed(version: int, seed: int, split: str, index: int) -> int:
    """The world seed of conversation ``index`` of a split: a stable function of its names."""
    digest = hashlib.sha256(f"{version}:{seed}:{split}:{index}".encode()).hexdigest()
    return int(digest[:12], 16)


def generate_split(split: str, count: int, seed: int) -> tuple[AgentConversation, ...]:
    """``count`` conversations of one split (ids ``agent-<split>-NNN``)."""
    return tuple(
        generate_conversation(
            f"agent-{split}-{i:03d}", conversation_seed(GENERATOR_VERSION, seed, split, i)
        )
        for i in range(count)
    )


def check_gold(conv: AgentConversation) -> list[str]:
    """Replay every gold call from the seed; the mismatches between what the tools return and
    what the conversation records (empty when the record is the tools' own answer)."""
    world = make_world(conv.world_seed)
    problems = []
    for k, turn in enumerate(conv.turns):
        for call, recorded in zip(turn.gold, turn.results, strict=True):
            got = result_text(execute(world, call))
            if got != recorded:
                problems.append(f"{conv.id} turn {k} {call.name}: {got[:80]} != {recorded[:80]}")
    return problems


def conversations_json(convs: Sequence[AgentConversation]) -> str:
    """A split's file text: one conversation per line."""
    return "".join(json.dumps(c.to_json(), ensure_ascii=False) + "\n" for c in convs)
