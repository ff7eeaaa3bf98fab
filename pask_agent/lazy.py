"""Public names resolved on first use (PEP 562), for the packages whose ``__init__`` re-exports
from heavy modules: importing ``pask_agent`` or one runtime submodule must not pull in torch,
transformers, xgrammar or LangChain before a name that needs them is asked for (the CLI's help,
a program that only reads a policy table, ``scripts/gpu_check.py`` on a host without grammars).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: each of ``exports`` (public name ->
    the module that defines it) is imported when first read, then cached in the package."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(module), name)
        namespace[name] = value  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
