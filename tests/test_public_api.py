"""The public API imports from the top of the package, and importing it stays light.

``pask_agent/__init__.py`` resolves its names on first use, so reading a policy table or
printing the CLI's help does not pay for torch and transformers.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import pask_agent

PROBE = """
import sys
from pask_agent import PolicyTable
heavy = ("torch", "transformers", "langchain_core")
print(PolicyTable.__module__, *(m in sys.modules for m in heavy))
"""


def test_top_level_names_resolve_lazily() -> None:
    """A fresh interpreter: the table class comes without torch, transformers or LangChain
    (the heavy names are imported from the top in ``test_wheel_install.py``)."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, check=True
    ).stdout.split()
    assert out == ["pask_agent.policy.table", "False", "False", "False"]


def test_every_export_is_listed_and_unknown_names_raise() -> None:
    assert set(pask_agent.__all__) == {"__version__", *pask_agent._EXPORTS}
    assert set(pask_agent._EXPORTS) <= set(dir(pask_agent))
    assert pask_agent.ToolSpec.__name__ == "ToolSpec" and pask_agent.Runtime.__name__ == "Runtime"
    with pytest.raises(AttributeError, match="has no attribute 'Runtim'"):
        _ = pask_agent.Runtim
