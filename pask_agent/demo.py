"""``make demo``: one short generation on the default model at full KV and at compressed
settings, through our KV store, with the measured KV bytes of each."""

from __future__ import annotations

import time

from pask_agent.policy.actions import Action
from pask_agent.runtime.generate import greedy_generate, stop_token_ids
from pask_agent.runtime.kv_store import KVLayout, KVStore, StoreConfig
from pask_agent.runtime.models import load_model

PROMPT = (
    "Write a Python function `is_prime(n)` that returns True when n is prime. "
    "Reply with the code only."
)


def main() -> None:
    t0 = time.perf_counter()
    print("loading the default model (the first run converts it once; later runs take seconds)")
    loaded = load_model("default")
    print(f"loaded {loaded.path} in {time.perf_counter() - t0:.1f}s")
    tok = loaded.tokenizer
    text = tok.apply_chat_template(
        [{"role": "user", "content": PROMPT}], tokenize=False, add_generation_prompt=True
    )
    ids = tok(text, add_special_tokens=False)["input_ids"]
    layout = KVLayout.from_config(loaded.model.config)
    for label, action, window in (
        ("full KV", Action.H, 16),
        ("INT4 after a 16-token window", Action.L, 16),
    ):
        store = KVStore(layout, StoreConfig(sinks=4, window=window))
        t0 = time.perf_counter()
        gen = greedy_generate(
            loaded.model,
            store,
            [ids],
            max_new_tokens=48,
            action=action,
            stop_ids=stop_token_ids(loaded.model, tok),
        )[0]
        dt = time.perf_counter() - t0
        kv = gen.kv
        print(f"\n=== {label}: {len(gen.token_ids)} tokens in {dt:.1f}s ===")
        print(tok.decode(list(gen.token_ids)))
        print(
            f"[kv] tokens={kv.tokens} high={kv.high_bytes}B low={kv.low_bytes}B "
            f"scales={kv.scale_bytes}B full={kv.full_bytes}B measured B={kv.measured_b:.3f} "
            f"peak={kv.peak_bytes}B"
        )


if __name__ == "__main__":
    main()
