"""The identity of the tokenizer a policy table is tied to: the SHA-256 of its ``tokenizer.json``.

A table's buckets are per token; served with another tokenizer they would tag other tokens, so
the runtime refuses a table whose tokenizer hash differs (``PolicyTable.check_model``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from pask_agent.errors import PolicyTableError


def tokenizer_hash(tokenizer_or_folder: Any) -> str:
    """SHA-256 of the ``tokenizer.json`` a table is tied to.

    Accepts a model folder (str or Path), a ``tokenizer.json`` path, or a loaded Hugging Face
    tokenizer (its ``name_or_path`` folder is used).

    Raises
    ------
    PolicyTableError
        No ``tokenizer.json`` can be found for the argument.
    """
    if isinstance(tokenizer_or_folder, str | Path):
        location = Path(tokenizer_or_folder)
    else:
        location = Path(str(getattr(tokenizer_or_folder, "name_or_path", "")))
    file = location if location.name == "tokenizer.json" else location / "tokenizer.json"
    if not file.is_file():
        raise PolicyTableError(
            f"no tokenizer.json at {file}; pass the model folder the tokenizer was loaded from"
        )
    digest = hashlib.sha256()
    with file.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
