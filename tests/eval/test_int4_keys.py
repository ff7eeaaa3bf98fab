"""The INT4 keys-or-values study (``eval/int4_keys.py``) on the real SmolLM2 model."""

from __future__ import annotations

import math

import torch

from pask_agent.eval.int4_keys import STORAGES, _stored, score_question, write
from pask_agent.runtime.models.seam import use_pask_attention


def test_storages_quantize_what_they_name() -> None:
    g = torch.Generator().manual_seed(0)
    k = torch.randn(1, 2, 12, 64, generator=g) + 30 * (torch.arange(64) == 5)  # one offset channel
    v = torch.randn(1, 2, 12, 64, generator=g)
    mu = k[:, :, 2:].mean(2, keepdim=True)
    err = {}
    for storage in STORAGES:
        k2, v2 = _stored(k, v, storage, mu, sinks=2)
        if storage != "bf16":
            assert torch.equal(k2[:, :, :2], k[:, :, :2])  # sinks are never quantized
        rest = (slice(None), slice(None), slice(2, None))  # past the sinks
        err[storage] = (float((k2 - k)[rest].norm()), float((v2 - v)[rest].norm()))
    assert err["int4_values"][0] == err["bf16"][0] and err["int4_keys"][1] == err["bf16"][1]
    assert err["int4"][0] > 5 * err["bf16"][0]
    # centering takes the offset channel out of the row scale
    assert err["int4_centered"][0] < 0.5 * err["int4"][0]


def test_scores_a_prompt_on_smollm2(smollm2, tmp_path) -> None:
    tok = smollm2.tokenizer
    text = "Here is a list of five fruits and their colours:\n1. Banana, yellow\n2."
    ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    use_pask_attention(smollm2.model)  # as an engine leaves the shared model
    scores = score_question(smollm2.model, ids, smollm2.key_offsets, answer_tokens=8, sinks=4)
    assert smollm2.model.config._attn_implementation == "pask"  # given back as it was
    assert set(scores) == set(STORAGES)
    n = scores["bf16"]["tokens"]
    assert 1 <= n <= 8
    for s in scores.values():
        assert s["tokens"] == n and 0 <= s["kept"] <= n and math.isfinite(s["nll"])
    report = {
        "meta": {"command": "c", "git_commit": "g", "machine": "m", "split": "dev", "every": 1,
                 "questions": 1, "answer_tokens": 8, "sinks": 4, "answer_tokens_total": n},
        "totals": {s: {"excess_nll": v["nll"] - scores["bf16"]["nll"], "tokens_kept": v["kept"],
                       "answers_unchanged": int(v["unchanged"])} for s, v in scores.items()},
        "questions": [],
    }  # fmt: skip
    write(report, tmp_path)
    md = (tmp_path / "int4_keys.md").read_text()
    assert all(f"| {s} |" in md for s in STORAGES)
