"""``grammars`` sits below ``policy``, ``runtime`` and ``eval`` (DESIGN.md, "Packages").

The census used to reach up into ``policy`` (layer groups) and ``runtime`` (model files), and the
BFCL loader lived here; an import that points up again would quietly make the grammars depend on
torch and on the benchmark. This reads every module's imports, deferred ones included.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pask_agent.grammars

ABOVE = (
    "pask_agent.policy",
    "pask_agent.runtime",
    "pask_agent.eval",
    "pask_agent.integrations",
    "pask_agent.server",
    "pask_agent.calibration",
    "pask_agent.cli",
)
ROOT = Path(pask_agent.grammars.__file__).parent


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return names


def test_no_grammar_module_imports_a_package_above_it() -> None:
    modules = sorted(ROOT.rglob("*.py"))
    assert {p.relative_to(ROOT).parts[0] for p in modules} >= {"json", "sql", "tags.py"}
    upward = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in modules
        for name in _imports(path)
        if name.startswith(ABOVE)
    ]
    assert upward == []


def test_each_language_lives_in_its_own_folder_and_ignores_the_other() -> None:
    top = {p.name for p in ROOT.glob("*.py")}
    assert not {name for name in top if name.startswith(("json_", "sql_", "fc_", "bfcl"))}
    for language, other in (("json", "sql"), ("sql", "json")):
        for path in (ROOT / language).glob("*.py"):
            crossing = [m for m in _imports(path) if m.startswith(f"pask_agent.grammars.{other}")]
            assert crossing == [], f"{path.relative_to(ROOT)} imports {crossing}"
