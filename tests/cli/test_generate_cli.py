"""``pask-agent generate`` on a bundled model: measured B vs the analytic INT4 value.

The byte accounting does not depend on which model fills the rows, only on the head size (64
for both bundled models), so SmolLM2 runs it."""

from __future__ import annotations

import json

from pask_agent.cli import main

PARAGRAPH = (
    "Tool-calling agents send the model a long list of function schemas, then a user request. "
    "Most of the prompt is JSON describing parameters, their types and enums. "
)


def _run(capsys, *args: str) -> dict:
    assert main(["generate", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_measured_b_int4_and_release_on_512_token_prompt(smollm2, capsys) -> None:
    tok = smollm2.tokenizer
    ids = tok(PARAGRAPH * 40, add_special_tokens=False)["input_ids"][:512]
    prompt = tok.decode(ids)
    common = ["--model", "smollm2-135m", "--prompt", prompt, "--max-new-tokens", "4"]
    full = _run(capsys, *common, "--keep-all")["kv"]
    low = _run(capsys, *common, "--int4-after", "16")["kv"]
    rel = _run(capsys, *common, "--release-after", "16")["kv"]
    n, s, w, d = low["tokens"], low["sinks"], low["window"], 64
    assert 510 <= n - 3 <= 514 and (s, w) == (4, 16)
    # analytic: sinks + window at 16 bits, the rest at 4-bit codes + one fp16 scale per row of d
    analytic = ((s + w) * 16 + (n - s - w) * (4 + 16 / d)) / (16 * n)
    assert abs(low["measured_b"] - analytic) / analytic < 0.01
    assert full["measured_b"] == 1.0 and full["high_bytes"] == full["full_bytes"]
    # release: only sinks + window stay; live bytes fall to (s + w) / n of full, peak = prefill
    assert rel["low_bytes"] == 0 and rel["scale_bytes"] == 0
    assert rel["high_bytes"] == full["full_bytes"] * (s + w) // n
    # keep-all peaks at the end; release never holds the prompt at BF16 (its old tokens are
    # never stored): its peak is sinks + window + the token in flight
    assert full["peak_bytes"] == full["full_bytes"]
    assert rel["peak_bytes"] == full["full_bytes"] * (s + w + 1) // n
    assert rel["measured_b"] < 0.05 < low["measured_b"] < 0.35
    print(
        f"\nN={n}: full B=1.0, int4-after-16 B={low['measured_b']:.4f} "
        f"(analytic {analytic:.4f}), release-after-16 B={rel['measured_b']:.4f}"
    )
