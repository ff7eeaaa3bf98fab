"""A wheel that works (issue 14 item 6): build it, install it outside the checkout, run it.

``python -m build`` makes the sdist and, from it, the wheel; the wheel goes into a fresh venv
in a temporary folder with ``--no-deps --no-index`` (pip can neither download nor touch torch,
which must stay the pinned CPU build). The venv then reuses this environment's installed
dependencies through a ``.pth`` line written *after* the install, so pip never sees the
checkout's editable install. From a folder outside the checkout, the installed package must
find its own data (the default policy table, ``calibration_data/``, the SQL samples), import
the public API from the top, and answer ``pask-agent call`` under the default PASK policy on
the default model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

# its subprocesses load the default model: this worker's copy goes meanwhile
pytestmark = pytest.mark.usefixtures("no_default_model_here")

ROOT = Path(__file__).resolve().parents[1]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "The city name."}},
                "required": ["city"],
            },
        },
    }
]
PROBE = """
import json, pask_agent
from pask_agent import Runtime, PaskChatModel, SQLiteAssistant, PolicyTable
from pask_agent.eval.sql_data import load_sample_questions
from pask_agent.package_data import calibration_data_dir, policy_table_path, sample_data_dir
from pask_agent.kernels.cpu_attention import native_status
table = PolicyTable.from_json(policy_table_path().read_text())
print(json.dumps({
    "package": pask_agent.__file__,
    "api": [c.__module__ for c in (Runtime, PaskChatModel, SQLiteAssistant, PolicyTable)],
    "calibration_data": str(calibration_data_dir()),
    "samples": str(sample_data_dir()),
    "table_model": table.model_id,
    "questions": len(load_sample_questions().questions),
    "native_kernel": native_status(),
}))
"""


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{cmd[:3]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def _data_files(folder: Path) -> set[str]:
    skip = {"__init__.py"}
    return {
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.name not in skip
        and p.suffix not in (".pyc", ".tmp")
    }  # fmt: skip


@pytest.mark.slow
@pytest.mark.wheel
def test_built_wheel_runs_outside_the_checkout(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    # no PYTHONPATH: pip must not see a checkout's egg-info as an installed pask-agent
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # the folder as it was when the wheel was built (others may write into it meanwhile)
    expected = _data_files(ROOT / "calibration_data")
    build = [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(ROOT)]
    _run(build, ROOT, env)
    (wheel,) = dist.glob("pask_agent-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {n.removeprefix("pask_agent/calibration_data/") for n in names}
    assert expected <= shipped, sorted(expected - shipped)
    for sample in ("shop.sqlite", "school.sqlite", "questions.jsonl"):
        assert f"pask_agent/sample_data/{sample}" in names
    assert "pask_agent/kernels/_decode_attention.c" in names  # built on first use
    assert "pask_agent/kernels/_vector_ops.h" in names  # which it includes

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, env)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q"]
    _run([*pip, "--no-deps", "--no-index", str(wheel)], tmp_path, env)
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(_run([str(python), "-c", purelib], tmp_path, env).strip())
    (site / "_pask_reuse_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    work = tmp_path / "elsewhere"  # no checkout here: nothing can be found by accident
    work.mkdir()
    probe = json.loads(_run([str(python), "-c", PROBE], work, env).strip().splitlines()[-1])
    for key in ("package", "calibration_data", "samples"):
        assert Path(probe[key]).is_relative_to(venv), (key, probe[key])
    assert probe["api"][0] == "pask_agent.runtime.runtime"
    assert probe["table_model"] == "Qwen2.5-Coder-0.5B-Instruct" and probe["questions"] > 0
    assert probe["native_kernel"] == "compiled"  # the installed source builds outside the checkout

    (work / "tools.json").write_text(json.dumps(TOOLS))
    cli = [str(venv / "bin" / "pask-agent"), "call", "--tools", "tools.json"]
    cli += ["--prompt", "What is the weather in Oslo?", "--policy", "pask", "--budget", "0.5"]
    out = json.loads(_run([*cli, "--max-new-tokens", "48", "--json"], work, env))
    (call,) = out["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert "oslo" in json.loads(call["function"]["arguments"])["city"].lower()
    assert 0 < out["usage"]["measured_b"] < 1  # the shipped table compressed the cache
