"""Inside ``grammars``, each language (JSON, SQL) lives in its own folder and ignores the other.
That the grammars import nothing above them is ``tests/test_import_layers.py``'s job.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pask_agent.grammars

ROOT = Path(pask_agent.grammars.__file__).parent


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return names


def test_each_language_lives_in_its_own_folder_and_ignores_the_other() -> None:
    top = {p.name for p in ROOT.glob("*.py")}
    assert not {name for name in top if name.startswith(("json_", "sql_", "fc_", "bfcl"))}
    for language, other in (("json", "sql"), ("sql", "json")):
        for path in (ROOT / language).glob("*.py"):
            crossing = [m for m in _imports(path) if m.startswith(f"pask_agent.grammars.{other}")]
            assert crossing == [], f"{path.relative_to(ROOT)} imports {crossing}"
