"""Text-to-SQL question sets: the project's sample set, or a user-supplied BIRD dev folder.

Why: BIRD's databases are a multi-GB download we cannot ship, so tests, calibration and the
SQL assistant use ``recipes/data/`` (four SQLite databases built by ``build_databases.py`` and
``questions.jsonl``, whose gold SQL is stored in the SQL grammar's canonical form and whose
``split`` field fixes the dev/test split once for every command), which ships
in the wheel as package data (``pask_agent.package_data``). A user who
has BIRD can point ``load_bird_dev`` at its dev folder (``dev.json`` +
``dev_databases/<db>/<db>.sqlite``) and run the same harness.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pask_agent import package_data
from pask_agent.errors import ConfigError

SPLITS = ("dev", "test")
_FIELDS = ("id", "db", "question", "gold_sql", "difficulty", "split")


@dataclass(frozen=True, slots=True)
class SqlQuestion:
    """One question with its gold SQL; ``evidence`` is BIRD's external-knowledge hint."""

    id: str
    db: str
    question: str
    gold_sql: str
    difficulty: str
    split: str
    evidence: str = ""


@dataclass(frozen=True, slots=True)
class SqlQuestionSet:
    """Questions plus the SQLite file of every database they use."""

    questions: tuple[SqlQuestion, ...]
    databases: tuple[tuple[str, Path], ...]

    def db_path(self, db: str) -> Path:
        for name, path in self.databases:
            if name == db:
                return path
        known = ", ".join(name for name, _ in self.databases)
        raise ConfigError(f"no database {db!r} in this question set; databases: {known}")

    def select(self, *, split: str | None = None, db: str | None = None) -> SqlQuestionSet:
        """The questions of one split and/or one database (databases kept as they are)."""
        if split is not None and split not in SPLITS:
            raise ConfigError(f"unknown split {split!r}; use one of {SPLITS}")
        kept = tuple(
            q
            for q in self.questions
            if (split is None or q.split == split) and (db is None or q.db == db)
        )
        return SqlQuestionSet(questions=kept, databases=self.databases)


def sample_data_dir() -> Path:
    """``recipes/data``: in a checkout the folder itself, in a wheel its packaged copy."""
    return package_data.sample_data_dir()


def load_sample_questions(
    *, split: str | None = None, data_dir: str | Path | None = None
) -> SqlQuestionSet:
    """Load ``questions.jsonl`` and the databases next to it.

    Raises
    ------
    ConfigError
        The folder, the question file or a database is missing, or a line is malformed.
    """
    folder = Path(data_dir) if data_dir is not None else sample_data_dir()
    path = folder / "questions.jsonl"
    if not path.is_file():
        raise ConfigError(
            f"{path} not found; run from a checkout of pask-agent or pass data_dir= "
            "(databases are rebuilt by recipes/data/build_databases.py)"
        )
    questions = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            questions.append(SqlQuestion(**{k: str(row[k]) for k in _FIELDS}))
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(
                f"{path}:{number}: each line must be a JSON object with {_FIELDS} ({exc})"
            ) from exc
    databases = []
    for db in dict.fromkeys(q.db for q in questions):
        db_file = folder / f"{db}.sqlite"
        if not db_file.is_file():
            raise ConfigError(
                f"{db_file} is missing; rebuild it with python recipes/data/build_databases.py"
            )
        databases.append((db, db_file))
    full = SqlQuestionSet(questions=tuple(questions), databases=tuple(databases))
    return full if split is None else full.select(split=split)


def load_bird_dev(folder: str | Path, *, limit: int | None = None) -> SqlQuestionSet:
    """Read a BIRD dev folder: ``dev.json`` and ``dev_databases/<db>/<db>.sqlite``.

    Every question gets split ``dev``; ``gold_sql`` is BIRD's ``SQL`` as written (it may use
    syntax outside our grammar, which matters only for grammar-acceptance checks).

    Raises
    ------
    ConfigError
        ``dev.json`` or a database it names is missing, or an entry lacks a field.
    """
    root = Path(folder)
    dev_json = root / "dev.json"
    if not dev_json.is_file():
        raise ConfigError(f"{dev_json} not found; pass the folder that holds BIRD's dev.json")
    try:
        entries = json.loads(dev_json.read_text())
    except ValueError as exc:
        raise ConfigError(f"{dev_json} is not valid JSON ({exc})") from exc
    if not isinstance(entries, list):
        raise ConfigError(f"{dev_json} must hold a JSON list of questions")
    questions = []
    for index, entry in enumerate(entries[:limit] if limit is not None else entries):
        try:
            questions.append(
                SqlQuestion(
                    id=str(entry.get("question_id", index)),
                    db=str(entry["db_id"]),
                    question=str(entry["question"]),
                    gold_sql=str(entry["SQL"]),
                    difficulty=str(entry.get("difficulty", "unknown")),
                    split="dev",
                    evidence=str(entry.get("evidence", "")),
                )
            )
        except (KeyError, AttributeError) as exc:
            raise ConfigError(
                f"{dev_json} entry {index} lacks {exc}; BIRD entries have db_id, question, SQL"
            ) from exc
    databases = []
    for db in dict.fromkeys(q.db for q in questions):
        db_file = root / "dev_databases" / db / f"{db}.sqlite"
        if not db_file.is_file():
            raise ConfigError(f"{db_file} is missing; unpack BIRD's dev_databases into {root}")
        databases.append((db, db_file))
    return SqlQuestionSet(questions=tuple(questions), databases=tuple(databases))
