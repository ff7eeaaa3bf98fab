"""Opening a model folder's tokenizer quickly when the folder is one our model cache wrote.

Kept apart from ``models.py`` (which finds, converts and caches model folders): this is only
about turning a folder's tokenizer files into a tokenizer object, and why that can skip
AutoTokenizer for our own caches.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# tokenizer_config.json keys the direct load in ``open_tokenizer`` reproduces (the special
# tokens, the length) or that change nothing for a complete tokenizer.json (where it came from,
# which class wrote it). A folder whose config has any other key goes through AutoTokenizer.
_SPECIAL_TOKENS = ("bos_token", "eos_token", "pad_token", "unk_token")
_REPRODUCED_KEYS = frozenset(
    {
        *_SPECIAL_TOKENS,
        "model_max_length",
        "backend",
        "is_local",
        "local_files_only",
        "tokenizer_class",
        "add_prefix_space",
    }
)


def open_tokenizer(folder: Path, *, ours: bool) -> Any:
    """The tokenizer of a model folder; ``ours`` (a folder ``models.py`` wrote) loads without
    AutoTokenizer.

    Why: transformers 5's ``AutoTokenizer`` parses the cached tokenizer.json several times in
    Python and rebuilds the tokenizer from its vocabulary and merges: 1.4-1.7 s of CPU for
    each bundled model, about a fifth of a server's start. A folder our model cache wrote holds
    a complete tokenizer.json, so ``PreTrainedTokenizerFast`` reads it
    directly with the config's special tokens and the chat template (0.3-0.4 s);
    tests/runtime/test_models.py checks it against AutoTokenizer on both bundled models.
    Other folders, and configs with keys this load does not reproduce, use AutoTokenizer.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    config_file = folder / "tokenizer_config.json"
    if not ours or not config_file.is_file():
        return AutoTokenizer.from_pretrained(folder)
    config = json.loads(config_file.read_text(encoding="utf-8"))
    if set(config) - _REPRODUCED_KEYS or config.get("add_prefix_space") is not None:
        return AutoTokenizer.from_pretrained(folder)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"),
        name_or_path=str(folder),
        **{k: config[k] for k in (*_SPECIAL_TOKENS, "model_max_length") if config.get(k)},
    )
    template = folder / "chat_template.jinja"
    if template.is_file():
        tokenizer.chat_template = template.read_text(encoding="utf-8")
    return tokenizer
