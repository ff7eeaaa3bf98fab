"""Per-channel key offsets: what a sequence's keys are stored relative to before INT4.

Keys of these models carry a few channels with a large offset shared by every token (Qwen2's
``k_proj`` has a bias; RoPE turns a slowly rotating channel pair into a nearly constant one).
The INT4 format (App. B.5) scales each row by its largest magnitude, so one such channel sets
the scale and the small channels that tell tokens apart round to zero. Subtracting a fixed
vector ``μ`` from every key of a sequence changes each of its queries' logits by the same
``q·μ``, which the softmax cancels, so attention is unchanged while INT4 rows lose most of
their error. On the default model INT4 keys, not values, carry most of the error that
quantizing a prompt adds (``eval/int4_keys.py``; docs/policies.md, "Centered keys").

``μ`` is a property of the model, measured once when the runtime opens: the mean key of each
layer and KV head over a fixed chat prompt (prose, a tool schema, SQL DDL and code, about 1,400
tokens on the default model), sinks excluded, after RoPE, as the store sees keys. Only
sequences whose policy may store INT4 are centered (``KVStore.add_sequence(centered=True)``);
Full KV and the release-only baselines store their keys exactly as before.

That forward pass over about 1,400 tokens costs seconds on a CPU, paid by every process that
opens a runtime: a server's start, each CLI call. ``cached_key_offsets`` keeps the result in
the user cache, keyed by what it depends on (the weight files' path, size and mtime, the dtype,
the config, the prompt's token ids, the torch version), so only the first process measures.
What it measured is what every later process uses, equal to a fresh measurement up to fp32
rounding (thread count and oneDNN layers change the order of sums).
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

import torch

from pask_agent.errors import ConfigError
from pask_agent.runtime.memory.kv_layout import KVLayout
from pask_agent.runtime.models.seam import cache_argument, stock_attention

log = logging.getLogger(__name__)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf")

# A fixed mix of what the runtime serves, sent twice as a system message before one question;
# its tokens' keys are averaged (after the sinks).
OFFSET_SYSTEM = """You are a helpful assistant that answers questions about a database \
and calls tools.
The harbour was quiet in the early morning; the ships rocked slowly and the gulls circled over the
fish market while the first traders arrived with their carts.
{"type": "function", "function": {"name": "get_weather", "description": "Current weather for a
city", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description":
"City name, e.g. Berlin"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
"required": ["city"]}}}
CREATE TABLE customers (customer_id INTEGER PRIMARY KEY, name TEXT NOT NULL, country TEXT,
signup_date TEXT);
CREATE TABLE orders (order_id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES
customers(customer_id), total REAL, status TEXT);
/* 3 example rows: (1, 'Olivia Smith', 'Germany', '2023-04-01') */
-- orders.status is one of: 'shipped', 'pending', 'cancelled'
SELECT customers.name, SUM(orders.total) FROM customers JOIN orders ON customers.customer_id =
orders.customer_id WHERE orders.status = 'shipped' GROUP BY customers.name ORDER BY 2 DESC;
def moving_average(values: list[float], window: int) -> list[float]:
    \"\"\"Return the mean of each run of `window` consecutive values.\"\"\"
    return [sum(values[i : i + window]) / window for i in range(len(values) - window + 1)]
"""
OFFSET_QUESTION = (
    "How many orders were shipped to customers in Germany last year? Answer with one query."
)


def offset_prompt(tokenizer: Any) -> str:
    """The text the offsets are measured on, in the tokenizer's chat format when it has one
    (the runtime serves chat prompts; a plain text's keys sit measurably elsewhere)."""
    if getattr(tokenizer, "chat_template", None):
        messages = [
            {"role": "system", "content": OFFSET_SYSTEM * 2},
            {"role": "user", "content": OFFSET_QUESTION},
        ]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return str(text)
    return OFFSET_SYSTEM * 2 + OFFSET_QUESTION


def offset_ids(model: Any, tokenizer: Any) -> torch.Tensor:
    """``[1, T]`` the token ids of ``offset_prompt`` the model can embed (a test model paired
    with a larger tokenizer embeds only its own ids)."""
    text = offset_prompt(tokenizer)
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    return ids[:, ids[0] < model.config.vocab_size]


def measure_key_offsets(model: Any, tokenizer: Any, *, skip: int = 4) -> torch.Tensor:
    """``[layers, kv_heads, head_dim]`` fp32: the mean post-RoPE key over ``offset_prompt``.

    Runs the unmodified model once with transformers' own cache (``sdpa``), so it does not
    depend on the store it configures. The first ``skip`` tokens (attention sinks, whose keys
    are outliers of their own) are left out.

    Raises
    ------
    ConfigError
        The model can embed no more than ``skip`` of the text's tokens.
    """
    from transformers import DynamicCache

    ids = offset_ids(model, tokenizer).to(model.device)
    if ids.shape[1] <= skip:
        n = ids.shape[1]
        raise ConfigError(f"the model embeds {n} tokens of the offset text; need more than {skip}")
    cache = DynamicCache()
    with stock_attention(model), torch.no_grad():
        model(input_ids=ids, use_cache=True, **{cache_argument(model): cache})
    means = [layer.keys[0, :, skip:].float().mean(dim=1) for layer in cache.layers]
    return torch.stack(means)  # [L, Hkv, D]


def offsets_cache_key(
    model: Any, tokenizer: Any, folder: Path, *, skip: int = 4, weights: str = "fp32"
) -> str | None:
    """What the offsets of ``model`` depend on, hashed; None when its folder holds no weight
    files (a model built in memory has no identity to key on). Besides the files' stat, the
    config and a few values of the first parameter (the embedding, which oneDNN prepacking
    leaves alone) go in, so a model that was not loaded from that folder never reads its
    offsets."""
    files = [f for f in folder.glob("*") if f.suffix in WEIGHT_SUFFIXES] if folder.is_dir() else []
    if not files:
        return None
    digest = hashlib.sha256()
    parts = [str(folder.resolve()), str(model.dtype), torch.__version__, str(skip), weights]
    parts += [f"{f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in sorted(files)]
    parts.append(model.config.to_json_string())
    for part in parts:
        digest.update(part.encode() + b"\0")
    digest.update(offset_ids(model, tokenizer).numpy().tobytes())
    first = next(model.parameters())
    digest.update(first.detach().flatten()[:256].float().cpu().numpy().tobytes())
    return digest.hexdigest()[:24]


def cached_key_offsets(
    model: Any, tokenizer: Any, folder: Path, cache_dir: Path, weights: str = "fp32"
) -> torch.Tensor:
    """:func:`measure_key_offsets`, read from ``cache_dir`` when an earlier process measured the
    same weights (``offsets_cache_key``), else measured and written there atomically. A file
    that does not read back as the model's shape is measured again; a cache that cannot be
    written only costs the next process the measurement."""
    key = offsets_cache_key(model, tokenizer, folder, weights=weights)
    if key is None:
        return measure_key_offsets(model, tokenizer)
    target = cache_dir / "key_offsets" / f"{key}.pt"
    layout = KVLayout.from_config(model.config)
    shape = (layout.num_layers, layout.num_kv_heads, layout.head_dim)
    if target.is_file():
        try:
            stored = torch.load(target, weights_only=True)
            if isinstance(stored, torch.Tensor) and tuple(stored.shape) == shape:
                return stored.to(model.device)
        except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as exc:
            log.warning("key offsets cache %s unreadable (%s); measuring again", target, exc)
    offsets = measure_key_offsets(model, tokenizer)
    tmp: str | None = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".tmp")
        os.close(fd)
        torch.save(offsets.cpu(), tmp)
        os.replace(tmp, target)
        tmp = None
    except OSError as exc:
        log.warning("key offsets not cached at %s: %s", target, exc)
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    return offsets
