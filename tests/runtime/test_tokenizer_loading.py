"""Our model caches open their tokenizer without AutoTokenizer, and get the same tokenizer.

The direct load skips AutoTokenizer's repeated JSON parsing (a fifth of a server's start), so
it must agree with AutoTokenizer on everything the runtime uses: token ids with and without
special tokens, decoding, the vocabulary, the special and added tokens (the grammar masks
them), the chat template with tools, and the folder the policy table hashes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from pask_agent.runtime.models.loading import resolve_model_dir
from pask_agent.runtime.models.tokenizer_loading import open_tokenizer

TEXTS = (
    "Hello world",
    " leading space and  double  spaces",
    "<|im_start|>user\nhi<|im_end|>",
    "日本語, émoji 🚀 and \t tabs",
    '{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}',
)
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def assert_same_tokenizer(ours: Any, ref: Any) -> None:
    for text in TEXTS:
        assert ours(text)["input_ids"] == ref(text)["input_ids"], text
        plain = ours(text, add_special_tokens=False)["input_ids"]
        assert plain == ref(text, add_special_tokens=False)["input_ids"], text
        assert ours.decode(plain) == ref.decode(plain)
        assert ours.convert_ids_to_tokens(plain) == ref.convert_ids_to_tokens(plain)
    assert ours.get_vocab() == ref.get_vocab()
    for name in ("eos_token_id", "bos_token_id", "pad_token_id", "unk_token_id", "name_or_path"):
        assert getattr(ours, name) == getattr(ref, name), name
    assert ours.model_max_length == ref.model_max_length
    added = {i: (str(t), t.special) for i, t in ours.added_tokens_decoder.items()}
    assert added == {i: (str(t), t.special) for i, t in ref.added_tokens_decoder.items()}
    for tools in (None, TOOLS):
        kw = {"tools": tools, "tokenize": False, "add_generation_prompt": True}
        assert ours.apply_chat_template(MESSAGES, **kw) == ref.apply_chat_template(MESSAGES, **kw)


@pytest.mark.parametrize("name", ["smollm2-135m", pytest.param("default", marks=pytest.mark.slow)])
def test_a_cached_model_opens_the_same_tokenizer_as_autotokenizer(name: str) -> None:
    folder = resolve_model_dir(name)
    assert_same_tokenizer(open_tokenizer(folder, ours=True), AutoTokenizer.from_pretrained(folder))


def test_a_config_key_the_direct_load_does_not_know_goes_through_autotokenizer(
    tmp_path: Path,
) -> None:
    source = resolve_model_dir("smollm2-135m")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(source / name, tmp_path / name)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    # A key the direct load would drop: AutoTokenizer must read it, so the result keeps it.
    config["padding_side"] = "left"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = open_tokenizer(tmp_path, ours=True)
    assert tokenizer.padding_side == "left"
    assert_same_tokenizer(tokenizer, AutoTokenizer.from_pretrained(tmp_path))
