"""``pask-agent generate``: greedy generation through the KV store, printing KV bytes."""

from __future__ import annotations

import argparse
import json
from typing import Any

from pask_agent.policy.actions import Action


def add_parser(sub: Any) -> None:
    p = sub.add_parser("generate", help="greedy generation through the mixed-precision KV store")
    p.add_argument("--model", default="default", help="bundled name, HF folder or .gguf file")
    p.add_argument("--prompt", required=True, help="raw text, tokenized as is (see --chat)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    p.add_argument("--sinks", type=int, default=4, help="first tokens always kept high")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--keep-all", action="store_true", help="keep every token high (default)")
    mode.add_argument(
        "--int4-after",
        type=int,
        metavar="W",
        help="quantize each token to INT4 once it leaves a W-token recent window",
    )
    mode.add_argument(
        "--release-after",
        type=int,
        metavar="W",
        help="release each token once it leaves a W-token recent window",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pask_agent.policy.uniform import UniformPolicy
    from pask_agent.runtime.config import RuntimeConfig
    from pask_agent.runtime.engine import Engine
    from pask_agent.runtime.models.loading import load_model
    from pask_agent.runtime.requests import Failed, Request, SamplingParams
    from pask_agent.runtime.turns.outputs import TEXT

    if args.int4_after is not None:
        action, window = Action.L, args.int4_after
    elif args.release_after is not None:
        action, window = Action.R, args.release_after
    else:
        action, window = Action.H, 16
    loaded = load_model(args.model)
    tok = loaded.tokenizer
    text = args.prompt
    if args.chat:
        text = tok.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
    prompt_ids = tok(text, add_special_tokens=False)["input_ids"]
    # The same engine step the runtime and server run: a uniform policy, free text, greedy.
    # One request alone needs no chunking (chunks keep long prompts from stalling others), so
    # the prompt runs as one chunk and the peak is what it keeps plus one window.
    config = RuntimeConfig(
        sinks=args.sinks, window=window, prefill_chunk_tokens=max(1, len(prompt_ids))
    )
    engine = Engine(loaded, config)
    policy = UniformPolicy(action)
    request = Request(
        prompt_ids,
        None,
        TEXT,
        SamplingParams(max_new_tokens=args.max_new_tokens),
        engine.new_sequence(policy.start()),
        policy,
    )
    (end,) = engine.run([request])
    if isinstance(end, Failed):
        raise end.error
    result = {
        "token_ids": list(end.token_ids),
        "text": tok.decode(list(end.token_ids), skip_special_tokens=False),
        "kv": end.kv.as_dict(),
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(result["text"])
        kv = result["kv"]
        print(
            f"[kv] tokens={kv['tokens']} high={kv['high_bytes']} low={kv['low_bytes']} "
            f"scales={kv['scale_bytes']} full={kv['full_bytes']} B={kv['measured_b']:.4f} "
            f"peak={kv['peak_bytes']}"
        )
    return 0
