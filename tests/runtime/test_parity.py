"""Full-KV parity on the real bundled models: ``Engine.step`` (the loop users run, through our
store and seam) = transformers' own greedy ``generate``."""

from __future__ import annotations

import pytest
import torch
from engine_greedy import engine_for, greedy

PROMPTS = (
    "The capital of France is",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Here is a list of five fruits:\n1.",
)


def _check_parity(loaded, new_tokens: int = 64) -> float:
    model, tok = loaded.model, loaded.tokenizer
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    engine = engine_for(loaded, sinks=4, window=16)
    stops = engine.stop_ids
    # the three prompts run batched, as the runtime serves them
    gens = greedy(engine, ids, max_new_tokens=new_tokens, keep_logits=True)
    assert engine.store.live_bytes() == 0  # every request released its KV
    model.set_attn_implementation("sdpa")
    worst = 0.0
    for prompt, gen in zip(ids, gens, strict=True):
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=sorted(stops),
            pad_token_id=tok.eos_token_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        ref = [t for t in out.sequences[0, len(prompt) :].tolist() if t not in stops]
        assert list(gen.token_ids) == ref
        for ours, theirs in zip(gen.step_logits, out.logits, strict=False):
            worst = max(worst, float((ours - theirs[0].float()).abs().max()))
    print(f"\n{loaded.name}: greedy tokens identical; max |logit diff| = {worst:.3e}")
    return worst


def test_parity_smollm2(smollm2) -> None:
    # bf16 storage of past K/V is the only difference from HF's fp32 cache
    assert _check_parity(smollm2) < 0.5


@pytest.mark.slow
def test_parity_default_model(default_model) -> None:
    assert _check_parity(default_model) < 0.5
