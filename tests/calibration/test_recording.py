"""Real use becomes calibration data: a runtime with ``record_traces`` writes one trace per turn,
on a real model, that replays to the same text and names the model that made it."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from pask_agent.record.traces import ModelId, TraceError, read_traces
from pask_agent.runtime.config import RuntimeConfig
from pask_agent.runtime.models.identity import model_identity
from pask_agent.runtime.runtime import Runtime


def get_weather(city: str) -> str:
    """Get the weather in a city.

    Args:
        city: The city name.
    """
    return "sunny"


def test_runtime_records_one_trace_per_finished_turn(smollm2, tmp_path: Path) -> None:
    path = tmp_path / "rec" / "traces.jsonl"
    config = RuntimeConfig(record_traces=str(path))
    asked = [{"role": "user", "content": "Weather in Oslo?"}]

    async def main() -> list:
        async with Runtime.open(smollm2, config=config) as rt:
            a = await rt.chat(asked, tools=[get_weather], tool_choice="required", max_new_tokens=40)
            b = await rt.chat([{"role": "user", "content": "Say hi"}], max_new_tokens=4)
            return [a, b]

    results = anyio.run(main)
    model = model_identity(smollm2.name, smollm2.path)
    assert model.weights_sha256.startswith("b179c952")
    traces = read_traces(path, model=model)
    assert len(traces) == 2
    call, text = traces
    assert call.messages[0] == asked[0] and call.tool_choice == "required"
    assert call.tools[0]["function"]["name"] == "get_weather"
    assert call.output == results[0].text and call.output_token_ids == results[0].token_ids
    assert smollm2.tokenizer.decode(list(call.output_token_ids)) == call.output
    assert call.ok is True  # a complete call, not cut at the token limit
    assert text.tools == () and text.ok is False  # 4 tokens: stopped by the limit
    with pytest.raises(TraceError, match="recorded with model"):
        read_traces(path, model=ModelId("default", "1d96" + "0" * 60))


@pytest.mark.slow
def test_traces_record_cli_on_bfcl(default_model, tmp_path: Path) -> None:
    from pask_agent.cli import main
    from pask_agent.eval.bfcl import ast_check, parse_calls
    from pask_agent.eval.splits import cases_in

    out = tmp_path / "cal.jsonl"
    args = ["traces", "record", "--bfcl", "simple,parallel", "--split", "calibration"]
    assert main([*args, "--cases", "1", "--out", str(out)]) == 0
    traces = read_traces(out, model=model_identity(default_model.name, default_model.path))
    expected = cases_in("calibration", per_category=1, categories=("simple_python", "parallel"))
    assert [t.id for t in traces] == [c.id for c in expected]
    for trace, case in zip(traces, expected, strict=True):
        assert trace.reference == {
            "checker": "bfcl_ast",
            "case_id": case.id,
            "category": case.category,
        }
        assert default_model.tokenizer.decode(list(trace.output_token_ids)) == trace.output
        assert trace.ok == ast_check(case, parse_calls(trace.output))
        assert trace.parallel_tool_calls == case.parallel
    assert (
        main(["traces", "record", "--bfcl", "simple,nope", "--split", "dev", "--out", str(out)])
        == 2
    )


@pytest.mark.slow
def test_traces_record_cli_on_sql(default_model, tmp_path: Path) -> None:
    from pask_agent.cli import main
    from pask_agent.eval.sql_data import load_sample_questions
    from pask_agent.eval.sql_scoring import gold_orders, results_match
    from pask_agent.integrations.sql_db import ReadOnlyDatabase, SqlExecutionError

    out = tmp_path / "sql.jsonl"
    args = ["traces", "record", "--sql", "--split", "dev", "--cases", "2", "--out", str(out)]
    assert main(args) == 0
    traces = read_traces(out, model=model_identity(default_model.name, default_model.path))
    data = load_sample_questions(split="dev")
    expected = data.questions[:2]
    assert [t.id for t in traces] == [q.id for q in expected]
    for trace, q in zip(traces, expected, strict=True):
        assert trace.reference == {
            "checker": "sql_exec", "db": q.db, "gold_sql": q.gold_sql, "category": q.difficulty
        }  # fmt: skip
        assert trace.group == q.difficulty and trace.tools == ()
        assert trace.sql_schema and "CREATE TABLE" in trace.sql_schema
        assert trace.messages[-1] == {"role": "user", "content": q.question}
        assert default_model.tokenizer.decode(list(trace.output_token_ids)) == trace.output
        db = ReadOnlyDatabase(data.db_path(q.db))
        try:  # ok is execution accuracy, checked here independently
            got, gold = db.query(trace.output.strip()), db.query(q.gold_sql)
            want = results_match(got, gold, ordered=gold_orders(q.gold_sql))
        except SqlExecutionError:
            want = False
        finally:
            db.close()
        assert trace.ok == want
    # calibration replays them through the assistant's grammar and tagger, DDL labelled
    from pask_agent.calibration.replay import TraceReplayer
    from pask_agent.grammars.tags import SPAN_LABELS

    replayer = TraceReplayer(default_model.tokenizer, default_model.model.config.vocab_size)
    for trace in traces:
        replayed = replayer.replay(trace)
        labels = {SPAN_LABELS[i] for i in replayed.prompt_labels}
        assert {"function_name", "parameter_key", "type_constraint"} <= labels
        assert all(tag is not None for tag in replayed.tags)
        for tag in replayed.tags:
            tag.validate("sql")  # SQL roles (projection, relation, ...), not tool-call ones
    bad = ["traces", "record", "--sql", "--split", "calibration", "--out", str(out)]
    assert main(bad) == 2  # the SQL questions are split dev/test only


def test_langchain_model_records_traces(tmp_path: Path) -> None:
    from langchain_core.messages import HumanMessage

    from pask_agent.integrations.langchain import PaskChatModel

    path = tmp_path / "agent.jsonl"
    llm = PaskChatModel(model="smollm2-135m", max_tokens=24, record_traces=str(path))
    llm = llm.bind_tools([get_weather], tool_choice="any")
    message = llm.invoke([HumanMessage("Weather in Oslo?")])
    (trace,) = read_traces(path)
    assert trace.model.name == "smollm2-135m" and trace.tool_choice in ("any", "required")
    assert trace.messages[-1]["content"] == "Weather in Oslo?"
    assert [c["name"] for c in message.tool_calls] == ["get_weather"]
    assert trace.tools[0]["function"]["name"] == "get_weather"
