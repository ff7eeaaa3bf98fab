"""The agent eval: a deterministic sandbox, conversations whose later turns need earlier
results, a scorer that checks calls and state, and a run through ``rt.conversation``."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path

import pytest

from pask_agent.eval.agent_eval import AgentWorkload
from pask_agent.eval.agent_sandbox.conversations import (
    MIN_TURNS,
    check_gold,
    generate_conversation,
)
from pask_agent.eval.agent_sandbox.scoring import score_turn
from pask_agent.eval.agent_sandbox.split_files import COUNTS, load_split, split_texts
from pask_agent.eval.agent_sandbox.tools import Call, execute, result_text
from pask_agent.eval.agent_sandbox.world import make_world

# the files as committed in this checkout (an installed package may point elsewhere)
DATA = Path(__file__).resolve().parents[2] / "calibration_data" / "splits" / "agent"


@pytest.fixture(scope="module")
def dev() -> tuple:
    return load_split("dev", DATA)


def test_generation_is_deterministic_and_reproduces_the_committed_files() -> None:
    a = generate_conversation("c", 1234)
    assert a == generate_conversation("c", 1234)
    assert a.turns != generate_conversation("c", 1235).turns
    texts = split_texts()
    for name, text in texts.items():
        assert (DATA / name).read_text(encoding="utf-8") == text, f"regenerate {name}"
    manifest = json.loads(texts["manifest.json"])
    assert manifest["counts"] == COUNTS and manifest["seed"] and manifest["generator_version"]
    for split, count in COUNTS.items():
        convs = load_split(split, DATA)
        assert len(convs) == count and len({c.id for c in convs}) == count
        assert all(len(c.turns) >= MIN_TURNS for c in convs)


def test_the_recorded_results_are_what_the_tools_return(dev) -> None:
    for conv in dev[:6]:
        assert check_gold(conv) == []
    # and by hand for one conversation: every gold call, executed in order from the seed
    conv = dev[0]
    world = make_world(conv.world_seed)
    for turn in conv.turns:
        for call, recorded in zip(turn.gold, turn.results, strict=True):
            result = execute(world, call)
            assert "error" not in result and result_text(result) == recorded


def test_later_turns_need_values_only_earlier_results_hold(dev) -> None:
    said = [c.system + " ".join(t.request for t in c.turns) for c in dev]
    dependent = 0
    for conv, words in zip(dev, said, strict=True):
        for k, turn in enumerate(conv.turns):
            if not turn.depends_on:
                continue
            dependent += 1
            assert max(turn.depends_on) < k
            earlier = " ".join(r for j in turn.depends_on for r in conv.turns[j].results)
            values = [v for c in turn.gold for v in c.arguments.values() if isinstance(v, str)]
            hidden = [v for v in values if v in earlier and v not in words]
            assert hidden, f"{conv.id} turn {k} {turn.kind}: {values} all said or absent"
    assert dependent >= 0.5 * sum(len(c.turns) for c in dev)
    # a long-range example: the booking cancelled was made turns before
    far = [
        k - min(t.depends_on) for c in dev for k, t in enumerate(c.turns) if t.depends_on
    ]  # fmt: skip
    assert max(far) >= 8


def test_a_request_names_its_record_by_a_value_the_result_shows(dev) -> None:
    """Retrieval, not arithmetic: the record a booking, order, file or email turn acts on is
    named by a value its earlier result printed (a flight number or departure time, a product
    or file name) that picks exactly one record there; no request asks for an order the model
    would have to compute (those turns measured the model, not the cache; templates.py)."""
    superlatives = ("cheapest", "earliest", "latest", "shortest", "largest", "smallest",
                    "most recent", "best-rated", "most expensive")  # fmt: skip
    named = 0
    for conv in dev:
        for k, turn in enumerate(conv.turns):
            assert not any(w in turn.request for w in superlatives), turn.request
            if turn.kind not in (
                "book_flight",
                "create_order",
                "read_file_info",
                "send_email",
                "send_file",
            ):
                continue
            earlier = [json.loads(r) for j in turn.depends_on for r in conv.turns[j].results]
            records = [
                x
                for r in earlier
                for x in r.get("flights", []) + r.get("results", []) + r.get("files", [])
            ]
            target = next(iter(turn.gold[0].arguments.values()))  # the id or address asked for

            def quoted(x: dict, key: str, words: str = turn.request) -> bool:
                # a value, or a product's brand (its name's first word), written in the request
                v = x[key]
                brand = key == "name" and "product_id" in x and v.split()[0] in words.split()
                return isinstance(v, str) and (v in words or brand)

            def shows(x: dict) -> set[str]:
                return {str(x[key]) for key in x if quoted(x, key)}

            # the records whose quoted values no other record holds all of
            picked = [
                x
                for x in records
                if shows(x)
                and not any(shows(x) <= {str(v) for v in y.values()} for y in records if y is not x)
            ]
            assert len(picked) == 1, f"{conv.id} turn {k}: {turn.request!r} picks {len(picked)}"
            assert target in picked[0].values(), f"{conv.id} turn {k}: {turn.request!r}"
            named += 1
    assert named >= 100


def test_every_record_shows_its_name_before_its_id(dev) -> None:
    """The layout the model can read ids from (tools.NAMED_BY): in every recorded result, the
    fields a record is named by come first and its id right after them."""
    from pask_agent.eval.agent_sandbox.tools import NAMED_BY

    seen: set[str] = set()

    def walk(value: object) -> None:
        if isinstance(value, list):
            for v in value:
                walk(v)
        elif isinstance(value, dict):
            keys = list(value)
            ids = [k for k in NAMED_BY if k in value]
            lead = [n for k in ids for n in NAMED_BY[k] if n in value]
            if ids and lead:
                assert keys[: len(lead) + len(ids)] == lead + ids, keys
                seen.update(ids)
            for v in value.values():
                walk(v)

    for conv in dev[:10]:
        for turn in conv.turns:
            for r in turn.results:
                walk(json.loads(r))
    assert seen == set(NAMED_BY)


def test_history_is_long_and_results_are_realistically_sized(dev) -> None:
    from pask_agent.grammars.prompt import render_tool_prompt
    from pask_agent.runtime.models.loading import load_tokenizer

    tok = load_tokenizer("default")

    def count(text: str) -> int:
        return len(tok(text, add_special_tokens=False)["input_ids"])

    for conv in dev:
        last = render_tool_prompt(tok, conv.messages(len(conv.turns) - 1), None)
        assert count(last) >= 6000, conv.id
    sizes = [count(r) for conv in dev for t in conv.turns for r in t.results]
    assert 100 <= min(sizes) and max(sizes) <= 800


def _flight_turn(dev) -> tuple:
    """A booking turn of the dev split, and the state it is asked in."""
    conv = dev[0]
    k = next(k for k, t in enumerate(conv.turns) if t.kind == "book_flight")
    return conv.world_before(k), conv.turns[k].gold


def test_scorer_right_call_wrong_argument_and_wrong_state(dev) -> None:
    world, gold = _flight_turn(dev)
    before = copy.deepcopy(world)
    (call,) = gold
    assert score_turn(world, gold, gold).correct
    assert world == before  # scoring never touches the state it is given
    # the same call in another spelling: casefolded, whitespace collapsed
    loose = Call(call.name, {**call.arguments, "flight_id": f" {call.arguments['flight_id']}"})
    assert score_turn(world, [loose], gold).calls_match
    # wrong argument: another flight of the same search is booked
    other = next(f["flight_id"] for f in world["flights"]
                 if f["flight_id"] != call.arguments["flight_id"])  # fmt: skip
    wrong = score_turn(world, [Call(call.name, {**call.arguments, "flight_id": other})], gold)
    assert not wrong.correct and not wrong.calls_match and not wrong.state_match
    assert "flight_id" in wrong.error
    # wrong state: the arguments match after normalisation, but the booking keeps the name
    # as written, so the world differs
    shout = Call(call.name, {**call.arguments, "passenger_name": call.arguments[
        "passenger_name"].upper()})  # fmt: skip
    verdict = score_turn(world, [shout], gold)
    assert verdict.calls_match and not verdict.state_match and not verdict.correct
    # a search with the wrong city changes nothing, yet is wrong
    search = Call("search_flights", {"origin": "Boston", "destination": "Denver",
                                     "date": "2025-05-20"})  # fmt: skip
    gold_search = Call("search_flights", {**search.arguments, "destination": "Miami"})
    verdict = score_turn(world, [search], [gold_search])
    assert verdict.state_match and not verdict.calls_match and not verdict.correct
    assert not score_turn(world, [], gold).correct
    # an omitted optional argument is its default
    order = Call("create_order", {"product_id": world["products"][0]["product_id"]})
    spelled = Call("create_order", {**order.arguments, "quantity": 1})
    assert score_turn(world, [order], [spelled]).correct


def test_a_short_conversation_runs_through_one_runtime_conversation(
    smollm2, tmp_path: Path, dev
) -> None:
    from pask_agent.eval import harness
    from pask_agent.policy.pask import PaskPolicy
    from pask_agent.runtime.config import RuntimeConfig

    # a short first result (a product search), and a second turn that needs it
    conv = next(c for c in dev if c.turns[0].kind == "search_products" and c.turns[1].depends_on)
    workload = AgentWorkload("dev", turns=2, max_new_tokens=48, given=(conv,))
    configs = harness.configurations(["full", PaskPolicy(allow_transfer=True)], [0.5])
    per_token = 30 * 2 * 3 * 64 * 2  # SmolLM2-135M: layers x (K, V) x kv heads x dim x bf16
    out = tmp_path / "agent"
    summaries = asyncio.run(
        harness.evaluate(
            workload, configs, harness.Run(out), model=smollm2, log=lambda _: None,
            runtime_config=RuntimeConfig(kv_capacity_bytes=per_token * 6000, max_batch=2),
        )
    )  # fmt: skip
    assert {s.config for s in summaries} == {"full", "pask"}
    rows = [json.loads(line) for line in out.with_suffix(".jsonl").read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        assert row["turns_asked"] == 2 and len(row["turns"]) == 2
        first, second = row["turns"]
        assert first["gold"] == [c.to_json() for c in conv.turns[0].gold]
        assert isinstance(second["correct"], bool) and second["distance"] == 1
        # the second turn reused the whole first prompt from the conversation's KV (its
        # prompt starts with the first prompt; the answer after it was the model's own)
        reused = second["prompt_tokens"] - second["prefilled_tokens"]
        assert first["prompt_tokens"] - 1 <= reused < second["prompt_tokens"]
    pask = next(r for r in rows if r["policy"] == "pask")
    assert pask["measured_b"] < 0.9  # measured, not configured
    body = json.loads(out.with_suffix(".json").read_text())
    assert set(body["per_turn"]) == {"full", "pask @ 0.50"}
    assert body["per_turn"]["full"]["turns"] == 2 and body["git_commit"]
    assert "Per-turn accuracy" in out.with_suffix(".md").read_text()


def test_cases_cut_the_split_and_bad_input_is_refused(tmp_path: Path) -> None:
    from pask_agent.errors import ConfigError

    cases = AgentWorkload("test", count=3, turns=4, data=str(DATA)).cases()
    assert [c.id for c in cases] == [f"agent-test-{i:03d}" for i in range(3)]
    assert all(len(c.turns) == 4 for c in cases)
    assert cases[0].messages(3)[-1]["content"] == cases[0].turns[3].request
    with pytest.raises(ConfigError, match="unknown agent split"):
        load_split("calibration", DATA)
    with pytest.raises(ConfigError, match="split_files"):
        load_split("dev", tmp_path)
    with pytest.raises(ConfigError, match="turns >= 1"):
        AgentWorkload("dev", turns=0, data=str(DATA)).cases()
