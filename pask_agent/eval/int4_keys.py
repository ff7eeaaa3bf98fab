"""Where INT4 hurts a SQL prompt: keys or values, and what centering the keys buys.

PASK at B = 0.33 holds nearly the whole schema prompt in INT4 (App. B.5 rows). This study takes
the SQL assistant's prompts, lets the unmodified model write its greedy answer over an exact
cache (the reference), then replays that answer teacher-forced over the same prompt cache
stored five ways: BF16 (what Full KV stores), K and V in INT4, only K in INT4, only V in INT4,
and K and V in INT4 with the keys centered on the model's key offsets
(``runtime/models/key_offsets.py``). The first ``sinks`` tokens are never quantized (the store
holds them in BF16; here they stay exact in the INT4 storages).

Per storage it reports the answer's negative log-likelihood beyond BF16's (nats, summed over
the questions), how many answer tokens are still the argmax, and how many answers would be
written unchanged (no token flipped). It needs no grammar and no runtime: the storage is
simulated on the model's own cache with the store's INT4 kernels' reference functions.

    python -m pask_agent.eval.int4_keys --split dev --out results/int4_keys
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pask_agent.kernels.int4 import dequantize_int4_ref, quantize_int4_ref
from pask_agent.record.provenance import provenance

STORAGES = ("bf16", "int4", "int4_keys", "int4_values", "int4_centered")


@dataclass
class Tally:
    excess_nll: float = 0.0
    tokens_kept: int = 0
    answers_unchanged: int = 0


def _int4(x: torch.Tensor) -> torch.Tensor:
    """INT4 round trip of ``[.., D]`` rows, as the store keeps an ``L`` row."""
    codes, scales = quantize_int4_ref(x.to(torch.bfloat16))
    return dequantize_int4_ref(codes, scales, x.shape[-1]).float()


def _stored(
    k: torch.Tensor, v: torch.Tensor, storage: str, mu: torch.Tensor, sinks: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's ``[1, Hkv, T, D]`` K/V as ``storage`` would hold them (sinks exact)."""
    bf16 = (k.to(torch.bfloat16).float(), v.to(torch.bfloat16).float())
    if storage == "bf16":
        return bf16
    if storage == "int4_centered":
        k2, v2 = _int4(k - mu) + mu, _int4(v)
    else:
        k2 = _int4(k) if storage in ("int4", "int4_keys") else bf16[0]
        v2 = _int4(v) if storage in ("int4", "int4_values") else bf16[1]
    k2[:, :, :sinks], v2[:, :, :sinks] = k[:, :, :sinks], v[:, :, :sinks]
    return k2, v2


def score_question(
    model: Any, ids: torch.Tensor, offsets: torch.Tensor, *, answer_tokens: int, sinks: int
) -> dict[str, dict[str, float]]:
    """Per storage: the reference answer's NLL, argmax tokens kept, and whether none flipped."""
    from transformers import DynamicCache

    from pask_agent.runtime.models.seam import stock_attention

    n = ids.shape[1]
    with stock_attention(model), torch.no_grad():
        ref = model.generate(ids, max_new_tokens=answer_tokens, do_sample=False)
        answer = ref[:, n:]
        cache = DynamicCache()
        model(input_ids=ids[:, :-1], cache=cache, use_cache=True)  # the prompt but its last token
        layers = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
        inputs = torch.cat([ids[:, -1:], answer[:, :-1]], 1)
        positions = torch.arange(n - 1, n - 1 + inputs.shape[1]).unsqueeze(0)
        out = {}
        for storage in STORAGES:
            replay = DynamicCache()
            for i, (k, v) in enumerate(layers):
                mu = offsets[i][None, :, None, :]
                replay.update(*_stored(k, v, storage, mu, sinks), i)
            logits = (
                model(input_ids=inputs, position_ids=positions, cache=replay, use_cache=True)
                .logits[0]
                .float()
            )
            logp = torch.log_softmax(logits, -1).gather(1, answer[0][:, None])
            kept = (logits.argmax(-1) == answer[0]).tolist()
            out[storage] = {"nll": -float(logp.sum()), "kept": sum(kept), "tokens": len(kept),
                            "unchanged": all(kept)}  # fmt: skip
    return out


def run(
    split: str, limit: int | None, every: int, answer_tokens: int, sinks: int
) -> dict[str, Any]:
    from pask_agent.eval.sql_data import load_sample_questions
    from pask_agent.integrations.sql import SQLiteAssistant
    from pask_agent.runtime.models.loading import load_model

    loaded = load_model("default")
    model, tok = loaded.model, loaded.tokenizer
    offsets = loaded.key_offsets
    data = load_sample_questions(split=None if split == "all" else split)
    questions = data.questions[::every][:limit]
    assistants: dict[str, SQLiteAssistant] = {}
    rows = []
    for q in questions:
        if q.db not in assistants:
            assistants[q.db] = SQLiteAssistant(data.db_path(q.db), runtime=None)
        text = tok.apply_chat_template(
            assistants[q.db].messages(q.question), tokenize=False, add_generation_prompt=True
        )
        ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        scores = score_question(model, ids, offsets, answer_tokens=answer_tokens, sinks=sinks)
        rows.append({"id": q.id, "prompt_tokens": int(ids.shape[1]), "storages": scores})
        print(q.id, {s: round(v["nll"] - scores["bf16"]["nll"], 3) for s, v in scores.items()})
    totals = {s: Tally() for s in STORAGES}
    for row in rows:
        base = row["storages"]["bf16"]["nll"]
        for s, v in row["storages"].items():
            totals[s].excess_nll += v["nll"] - base
            totals[s].tokens_kept += v["kept"]
            totals[s].answers_unchanged += int(v["unchanged"])
    return {
        "meta": {**provenance(), "split": split, "every": every, "questions": len(rows),
                 "answer_tokens": answer_tokens, "sinks": sinks,
                 "answer_tokens_total": sum(r["storages"]["bf16"]["tokens"] for r in rows)},
        "totals": {s: vars(t) for s, t in totals.items()},
        "questions": rows,
    }  # fmt: skip


def write(report: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "int4_keys.json").write_text(json.dumps(report, indent=2))
    meta = report["meta"]
    lines = [
        "# INT4 on SQL prompts: keys or values, and centered keys",
        "",
        f"Command: `{meta['command']}`  ",
        f"Commit: `{meta['git_commit']}`  ",
        f"Machine: {meta['machine']}  ",
        f"{meta['questions']} questions (one in {meta['every']} of the `{meta['split']}` split); "
        "the default model's "
        f"greedy answer over an exact cache ({meta['answer_tokens']} tokens at most, "
        f"{meta['answer_tokens_total']} in all), replayed teacher-forced over the prompt's "
        f"cache stored each way; the first {meta['sinks']} tokens are never quantized.",
        "",
        "| prompt K/V stored as | NLL beyond BF16 (nats, total) | answer tokens still argmax "
        "| answers unchanged |",
        "|---|---:|---:|---:|",
    ]
    total = meta["answer_tokens_total"]
    for s, t in report["totals"].items():
        lines.append(
            f"| {s} | {t['excess_nll']:.2f} | {t['tokens_kept']}/{total} "
            f"| {t['answers_unchanged']}/{meta['questions']} |"
        )
    (out / "int4_keys.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", default="dev", choices=["dev", "test", "all"])
    parser.add_argument("--every", type=int, default=1, help="every k-th question of the split")
    parser.add_argument("--limit", type=int, default=None, help="first N questions only")
    parser.add_argument("--answer-tokens", type=int, default=40)
    parser.add_argument("--sinks", type=int, default=4)
    parser.add_argument("--out", default="results/int4_keys")
    args = parser.parse_args(argv)
    if args.every < 1:
        parser.error("--every must be >= 1")
    report = run(args.split, args.limit, args.every, args.answer_tokens, args.sinks)
    write(report, Path(args.out))
    print((Path(args.out) / "int4_keys.md").read_text())


if __name__ == "__main__":
    main()
