"""Dependencies point one way (DESIGN.md, "Packages"): a module imports only from its own
package or from packages below it. Every import counts, deferred and type-only ones included:
an upward edge is a dependency whether it runs at import time or later.

The order, lowest first (the one place it is written in code; DESIGN.md says the same):
"""

from __future__ import annotations

import ast
from pathlib import Path

import pask_agent

LAYERS: tuple[tuple[str, ...], ...] = (
    ("pask_agent.errors",),
    ("pask_agent.record", "pask_agent.package_data", "pask_agent.lazy"),
    ("pask_agent.kernels",),
    ("pask_agent.grammars",),
    ("pask_agent.policy",),
    ("pask_agent.runtime.memory",),
    ("pask_agent.runtime.models",),
    ("pask_agent.runtime.turns",),
    ("pask_agent.runtime",),
    ("pask_agent.calibration", "pask_agent.integrations"),
    ("pask_agent.server",),
    ("pask_agent.eval",),
    ("pask_agent.cli", "pask_agent.demo"),
    ("pask_agent",),  # the public facade (``from pask_agent import Runtime``)
)
ROOT = Path(pask_agent.__file__).parent


def _unit(module: str) -> tuple[int, str]:
    """The most specific layer unit that holds ``module``: (rank, unit)."""
    best: tuple[int, str] | None = None
    for rank, units in enumerate(LAYERS):
        for unit in units:
            if module == unit or module.startswith(unit + "."):
                if best is None or len(unit) > len(best[1]):
                    best = (rank, unit)
    assert best is not None, f"{module} is in no layer: add it to LAYERS and DESIGN.md"
    return best


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [base]
            if base in ("pask_agent", "pask_agent.runtime"):  # a package: its submodules count
                names = [f"{base}.{a.name}" for a in node.names]
            found.extend((node.lineno, n) for n in names if n.startswith("pask_agent"))
        elif isinstance(node, ast.Import):
            found.extend(
                (node.lineno, a.name) for a in node.names if a.name.startswith("pask_agent")
            )
    return found


def _is_module(name: str) -> bool:
    path = ROOT.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def edges_from(module: str, source: str, is_package: bool = False) -> list[str]:
    """The imports of one module's source that point up or sideways."""
    rank, unit = _unit(module)
    edges = []
    for line, target in _imports(source, module, is_package):
        if not _is_module(target):  # `from pask_agent.runtime import Runtime`: a name
            target = target.rpartition(".")[0]
        t_rank, t_unit = _unit(target)
        if t_unit != unit and t_rank >= rank:
            edges.append(f"{module}:{line} ({unit}) imports {target}")
    return edges


def upward_edges() -> list[str]:
    return [
        edge
        for path in sorted(ROOT.rglob("*.py"))
        for edge in edges_from(
            _module_name(path), path.read_text(encoding="utf-8"), path.name == "__init__.py"
        )
    ]


def test_no_module_imports_a_package_above_it_or_beside_it() -> None:
    assert upward_edges() == []


def test_every_module_sits_in_a_layer_and_the_walk_sees_the_whole_package() -> None:
    modules = [_module_name(p) for p in ROOT.rglob("*.py")]
    assert len(modules) > 150
    units = {_unit(m)[1] for m in modules}
    assert {"pask_agent.runtime.memory", "pask_agent.record", "pask_agent.eval"} <= units


def test_upward_and_sideways_imports_are_caught() -> None:
    """The walk sees the edges it exists to forbid, deferred ones included."""
    probe = "def f():\n    from pask_agent.calibration.inputs import load_traces\n"
    assert edges_from("pask_agent.runtime.memory.probe", probe) == [
        "pask_agent.runtime.memory.probe:2 (pask_agent.runtime.memory) "
        "imports pask_agent.calibration.inputs"
    ]
    sideways = "from pask_agent.integrations.sql import SQLiteAssistant\n"
    assert edges_from("pask_agent.calibration.probe", sideways) != []
    relative_up = "from ..engine import Engine\n"
    assert edges_from("pask_agent.runtime.turns.probe", relative_up) != []
    assert edges_from("pask_agent.runtime.engine", "from .memory.kv_store import KVStore\n") == []


def test_the_runtime_is_split_by_concern() -> None:
    top = sorted(p.name for p in (ROOT / "runtime").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= 8, top
    for folder in ("memory", "models", "turns"):
        doc = ast.get_docstring(ast.parse((ROOT / "runtime" / folder / "__init__.py").read_text()))
        assert doc and "import" in doc.lower(), (
            f"runtime/{folder}/__init__.py must say what it imports"
        )
