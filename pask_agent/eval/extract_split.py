"""The fixed dev / test documents of the extraction eval, written once, read by every run.

Why a committed file and not the generator at run time: a result must name the documents it
was measured on even after the generator changes, and tuning on the documents one reports on
is what the BFCL split (``splits.py``) exists to prevent. So ``python -m
pask_agent.eval.extract_split`` writes ``calibration_data/splits/extract.jsonl`` from a seed:
line one is the header (generator version, seed, counts, and the answer lengths in the
default model's tokens), then one document per line. Regenerating with the same seed and
version gives the same bytes (a test checks it), so a change to the generator shows up as a
diff of the file, never silently.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pask_agent.errors import ConfigError
from pask_agent.eval.extract_docs import (
    GENERATOR_VERSION,
    KINDS,
    Document,
    answer_json,
    generate_split,
)
from pask_agent.eval.splits import existing_split
from pask_agent.package_data import calibration_data_dir

SPLITS: tuple[str, ...] = ("dev", "test")
COUNTS: dict[str, int] = {"dev": 40, "test": 60}
DEFAULT_SEED = 20260531
TOKENIZER = "default"  # the model whose tokens size the answers (Qwen2.5-Coder-0.5B)
# the answers' length in tokens must lie in this range, with this median or more
MIN_TOKENS, MAX_TOKENS, MIN_MEDIAN = 300, 3000, 600


@dataclass(frozen=True, slots=True)
class ExtractSplit:
    """The header and the documents of the split file; ``answer_tokens[id]`` is the length of
    the reference answer (``answer_json``) in the header tokenizer's tokens."""

    header: dict[str, Any]
    documents: tuple[Document, ...]
    splits: dict[str, str]  # document id -> partition
    answer_tokens: dict[str, int]

    def partition(self, split: str) -> tuple[Document, ...]:
        if split not in SPLITS:
            raise ConfigError(f"unknown split {split!r}; the extraction split has {SPLITS}")
        return tuple(d for d in self.documents if self.splits[d.id] == split)


def split_file() -> Path:
    """``calibration_data/splits/extract.jsonl`` (in a checkout or an installed wheel)."""
    return calibration_data_dir() / "splits" / "extract.jsonl"


def _stats(tokens: Sequence[int]) -> dict[str, float]:
    return {"min": min(tokens), "median": statistics.median(tokens), "max": max(tokens)}


def build_lines(seed: int, tokenizer: Any, counts: dict[str, int] = COUNTS) -> list[str]:
    """The split file's lines: the header, then each document with its partition and the
    token length of its reference answer.

    Raises
    ------
    ConfigError
        An answer outside ``[MIN_TOKENS, MAX_TOKENS]`` or a median below ``MIN_MEDIAN``: the
        kinds' record ranges in ``extract_docs.py`` need retuning.
    """
    docs = {split: generate_split(seed, split, counts[split]) for split in SPLITS}
    tokens = {d.id: len(tokenizer.encode(answer_json(d))) for ds in docs.values() for d in ds}
    out_of_range = {i: n for i, n in tokens.items() if not MIN_TOKENS <= n <= MAX_TOKENS}
    median = statistics.median(tokens.values())
    if out_of_range or median < MIN_MEDIAN:
        raise ConfigError(
            f"answers must be {MIN_TOKENS}-{MAX_TOKENS} tokens with median >= {MIN_MEDIAN}; "
            f"got median {median} and out of range {out_of_range}"
        )
    header = {
        "version": GENERATOR_VERSION,
        "seed": seed,
        "counts": {s: len(ds) for s, ds in docs.items()},
        "kinds": list(KINDS),
        "command": "python -m pask_agent.eval.extract_split",
        "answer": 'json.dumps({"records": [...]}) of the truth records (extract_docs.answer_json)',
        "answer_tokens_by": TOKENIZER,
        "answer_tokens": {
            **{s: _stats([tokens[d.id] for d in ds]) for s, ds in docs.items()},
            "all": _stats(list(tokens.values())),
        },
    }
    lines = [json.dumps(header, sort_keys=True)]
    for split, ds in docs.items():
        for d in ds:
            row = {"split": split, "answer_tokens": tokens[d.id], **d.to_json()}
            lines.append(json.dumps(row, ensure_ascii=False))
    return lines


def write_split(path: Path, seed: int, tokenizer: Any) -> ExtractSplit:
    lines = build_lines(seed, tokenizer)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return load_split(path)


def load_split(path: Path | None = None) -> ExtractSplit:
    """Read the split file.

    Raises
    ------
    ConfigError
        The file is missing or malformed (the message names the command that writes it).
    """
    path = existing_split(path or split_file(), "extraction split", "pask_agent.eval.extract_split")
    try:
        header, *rows = (json.loads(line) for line in path.read_text("utf-8").splitlines())
        docs = tuple(Document.from_json(r) for r in rows)
        return ExtractSplit(
            header, docs, {r["id"]: r["split"] for r in rows},
            {r["id"]: int(r["answer_tokens"]) for r in rows},
        )  # fmt: skip
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"malformed extraction split file {path}: {exc}") from exc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pask_agent.eval.extract_split")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    from pask_agent.runtime.models.loading import load_tokenizer

    split = write_split(args.out or split_file(), args.seed, load_tokenizer(TOKENIZER))
    print(json.dumps(split.header["counts"]), json.dumps(split.header["answer_tokens"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
