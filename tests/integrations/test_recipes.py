"""Smoke runs of every recipe in ``recipes/`` on the real default model."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from langchain_core.messages import AIMessage, ToolMessage

pytestmark = pytest.mark.slow
RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", RECIPES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # Pydantic resolves postponed annotations through it
    spec.loader.exec_module(module)
    return module


def test_langchain_agent_recipe() -> None:
    recipe = _load("langchain_agent")
    history = recipe.run_agent("How many days are there from 2024-01-15 to 2024-03-01?")
    tool_results = [m for m in history if isinstance(m, ToolMessage)]
    assert [m.content for m in tool_results] == ["46"]
    assert isinstance(history[-1], AIMessage) and not history[-1].tool_calls
    assert history[-1].text.strip()


def test_structured_async_recipe() -> None:
    recipe = _load("structured_async")
    tickets = asyncio.run(recipe.main())
    assert [t.order_id for t in tickets] == [4471, 9120]
    assert [t.issue for t in tickets] == ["damaged", "billing"]


def test_text_to_sql_recipe() -> None:
    recipe = _load("text_to_sql")
    answers = asyncio.run(recipe.main(["How many customers live in Germany?"]))
    (answer,) = answers
    assert answer.error is None and answer.sql.startswith("SELECT")
    assert answer.rows == ((56,),)
