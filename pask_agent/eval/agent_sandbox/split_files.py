"""The fixed dev and test conversations, written once to ``calibration_data/splits/agent/``.

Why files and not a generator call at eval time: a table reported on the test split must be
reproducible after the generator changes, so the conversations every command reads are the
committed ones, and ``manifest.json`` records the seed and generator version that wrote them.
``python -m pask_agent.eval.agent_sandbox.split_files`` rewrites them; it is deterministic, so
rewriting changes nothing unless the generator or the sandbox changed (a test regenerates and
compares).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from pask_agent.errors import ConfigError
from pask_agent.eval.agent_sandbox.conversations import (
    GENERATOR_VERSION,
    AgentConversation,
    conversations_json,
    generate_split,
)
from pask_agent.package_data import calibration_data_dir

SEED = 20260131
COUNTS = {"dev": 40, "test": 60}


def split_dir() -> Path:
    """``calibration_data/splits/agent/`` (in a checkout or an installed wheel)."""
    return calibration_data_dir() / "splits" / "agent"


def load_split(split: str, folder: Path | None = None) -> tuple[AgentConversation, ...]:
    """The committed conversations of ``split``, in file order.

    Raises
    ------
    ConfigError
        Unknown split, or the file is missing or malformed (the message names the command
        that writes it).
    """
    if split not in COUNTS:
        raise ConfigError(f"unknown agent split {split!r}; use one of {', '.join(COUNTS)}")
    path = (folder or split_dir()) / f"{split}.jsonl"
    if not path.is_file():
        raise ConfigError(
            f"no agent conversations at {path}; write them with: "
            "python -m pask_agent.eval.agent_sandbox.split_files"
        )
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        return tuple(AgentConversation.of(json.loads(line)) for line in lines if line.strip())
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"malformed agent conversations {path}: {exc}") from exc


def split_texts(seed: int = SEED) -> dict[str, str]:
    """Every file's text: ``dev.jsonl``, ``test.jsonl`` and ``manifest.json``."""
    texts = {
        f"{s}.jsonl": conversations_json(generate_split(s, n, seed)) for s, n in COUNTS.items()
    }
    manifest = {
        "generator_version": GENERATOR_VERSION,
        "seed": seed,
        "counts": COUNTS,
        "command": "python -m pask_agent.eval.agent_sandbox.split_files",
        "sha256": {name: hashlib.sha256(t.encode()).hexdigest() for name, t in texts.items()},
    }
    texts["manifest.json"] = json.dumps(manifest, indent=1) + "\n"
    return texts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pask_agent.eval.agent_sandbox.split_files")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--out", type=Path, default=None, help="folder (default the shipped one)")
    args = parser.parse_args(argv)
    out = args.out or split_dir()
    out.mkdir(parents=True, exist_ok=True)
    for name, text in split_texts(args.seed).items():
        (out / name).write_text(text, encoding="utf-8")
        print(f"wrote {out / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
