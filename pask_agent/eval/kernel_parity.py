"""Kernel parity at serving lengths: each Triton kernel against its torch reference, timed.

The kernel tests (``tests/kernels``) check every kernel on small, hard cases; this measures
the same comparison at the lengths a served model reaches (1k-32k stored tokens, a model's
real head layout), where a kernel compiled for a GPU could still go wrong (int32 offsets,
block loops, the online softmax over thousands of blocks) and where its speed matters.

Each attention case is one batch of ``DECODE_SEQS`` sequences that decode one token each plus
one sequence that prefills a chunk of ``chunk`` tokens, every sequence holding ``tokens``
stored keys: all BF16 (``bf16``), all INT4 (``int4``) or a random half of each (``mixed``),
at shuffled slots and gappy positions (released tokens). Errors are max-abs differences,
also relative to the largest reference output; the pass mark is the kernel tests' 1e-3.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from pask_agent.kernels.attention import mixed_attention_ref, mixed_attention_triton
from pask_agent.kernels.attention_inputs import MixedKV, PoolView, QueryChunk
from pask_agent.kernels.int4 import (
    dequantize_int4_ref,
    dequantize_int4_triton,
    quantize_int4_ref,
    quantize_int4_triton,
)

__all__ = ["REL_TOL", "HeadLayout", "attention_parity", "int4_parity", "time_call"]

REL_TOL = 1e-3  # max-abs error over max |reference| (tests/kernels/test_attention.py)
DECODE_SEQS = 3
LAYOUTS = ("bf16", "int4", "mixed")


@dataclass(frozen=True, slots=True)
class HeadLayout:
    """A model's attention heads: query heads, KV heads (GQA) and head dim."""

    n_qh: int
    n_kvh: int
    dim: int


def time_call(fn: Callable[[], Any], device: torch.device, repeats: int) -> tuple[Any, float]:
    """``fn()``'s result and its mean wall time in ms over ``repeats`` calls (at least one), a
    GPU waited for before each clock read. On a GPU one untimed call comes first: a Triton
    kernel compiles on its first call. The interpreter has nothing to compile."""
    wait = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        fn()
        wait()
    repeats = max(repeats, 1)
    start = time.perf_counter()
    for _ in range(repeats):
        out = fn()
    wait()
    return out, 1000 * (time.perf_counter() - start) / repeats


def _errors(got: torch.Tensor, want: torch.Tensor) -> dict[str, float]:
    got, want = got.float().cpu(), want.float().cpu()
    err = (got - want).abs().max().item() if want.numel() else 0.0
    top = want.abs().max().item() if want.numel() else 0.0
    return {"max_abs_err": err, "rel_err": err / top if top else err}


def _on_cpu(inputs: dict[str, Any]) -> dict[str, Any]:
    """The same inputs on the CPU (offsets already are)."""
    return {**inputs, "chunk": inputs["chunk"].to("cpu"), "kv": inputs["kv"].to("cpu")}


def int4_parity(
    rows: int, heads: HeadLayout, device: torch.device, *, repeats: int, seed: int = 0
) -> dict[str, Any]:
    """Quantize ``rows`` random BF16 K rows ``[rows, Hkv, D]`` and dequantize them with both
    implementations: codes and scales must be bit-identical, as ``int4.py`` promises."""
    gen = torch.Generator(device=device).manual_seed(seed)
    x = (torch.randn(rows, heads.n_kvh, heads.dim, generator=gen, device=device) * 2).bfloat16()
    (codes, scales), quant_ref_ms = time_call(lambda: quantize_int4_ref(x), device, repeats)
    (t_codes, t_scales), quant_ms = time_call(lambda: quantize_int4_triton(x), device, repeats)
    deq_ref, deq_ref_ms = time_call(
        lambda: dequantize_int4_ref(codes, scales, heads.dim), device, repeats
    )
    deq, deq_ms = time_call(
        lambda: dequantize_int4_triton(codes, scales, heads.dim), device, repeats
    )
    deq_err = _errors(deq, deq_ref)
    code_mismatches = int((codes != t_codes).sum())
    scale_mismatches = int((scales != t_scales).sum())
    return {
        "rows": rows,
        "code_mismatches": code_mismatches,
        "scale_mismatches": scale_mismatches,
        "dequantize_max_abs_err": deq_err["max_abs_err"],
        "roundtrip_rel_err": _errors(deq_ref, x)["rel_err"],  # INT4's own error, for scale
        "quantize_ms": round(quant_ms, 4),
        "quantize_ref_ms": round(quant_ref_ms, 4),
        "dequantize_ms": round(deq_ms, 4),
        "dequantize_ref_ms": round(deq_ref_ms, 4),
        "ok": code_mismatches == 0 and scale_mismatches == 0 and deq_err["max_abs_err"] == 0.0,
    }


def _offsets(lengths: list[int]) -> torch.Tensor:
    out = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    out[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
    return out


def attention_inputs(
    tokens: int, layout: str, chunk: int, heads: HeadLayout, device: torch.device, seed: int
) -> dict[str, Any]:
    """Keyword arguments of ``mixed_attention_*`` for one case (see the module docstring)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}; valid: {list(LAYOUTS)}")
    gen = torch.Generator().manual_seed(seed)  # indices on the CPU, values made on the device
    dgen = torch.Generator(device=device).manual_seed(seed)
    q_lens = [1] * DECODE_SEQS + [chunk]
    n_tok = sum(q_lens)
    high_lens, low_lens, high_pos, low_pos, q_pos = [], [], [], [], []
    for n_q in q_lens:
        # stored positions: `tokens` of a range a quarter longer (the rest were released)
        span = tokens + tokens // 4
        pos = torch.randperm(span, generator=gen)[:tokens].sort().values
        in_low = {
            "bf16": torch.zeros(tokens, dtype=torch.bool),
            "int4": torch.ones(tokens, dtype=torch.bool),
            "mixed": torch.rand(tokens, generator=gen) < 0.5,
        }[layout]
        high_pos.append(pos[~in_low])
        low_pos.append(pos[in_low])
        high_lens.append(int((~in_low).sum()))
        low_lens.append(int(in_low.sum()))
        q_pos.append(torch.arange(span, span + n_q))
    kv = (heads.n_kvh, heads.dim)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=dgen, device=device)

    n_high, n_low = sum(high_lens), sum(low_lens)
    spare = 7  # rows no sequence holds: the kernel must not read them
    high_k, high_v = (randn(n_high + spare, *kv).bfloat16() for _ in range(2))
    low_k_codes, low_k_scales = quantize_int4_ref(randn(n_low + spare, *kv).bfloat16())
    low_v_codes, low_v_scales = quantize_int4_ref(randn(n_low + spare, *kv).bfloat16())
    high_slots = torch.randperm(n_high + spare, generator=gen)[:n_high].to(device)
    low_slots = torch.randperm(n_low + spare, generator=gen)[:n_low].to(device)
    # queries twice the keys' scale: a softmax that picks, not a near-uniform average
    q = (randn(n_tok, heads.n_qh, heads.dim) * 2).bfloat16()
    cur_k, cur_v = (randn(n_tok, *kv).bfloat16() for _ in range(2))
    return {
        "chunk": QueryChunk(q, _offsets(q_lens), torch.cat(q_pos).to(device), cur_k, cur_v),
        "kv": MixedKV(
            high_k,
            high_v,
            PoolView(high_slots, _offsets(high_lens), torch.cat(high_pos).to(device)),
            low_k_codes,
            low_v_codes,
            low_k_scales,
            low_v_scales,
            PoolView(low_slots, _offsets(low_lens), torch.cat(low_pos).to(device)),
        ),
        "scale": heads.dim**-0.5,
    }


def attention_parity(
    tokens: int,
    layout: str,
    heads: HeadLayout,
    device: torch.device,
    *,
    chunk: int,
    repeats: int,
    seed: int = 0,
) -> dict[str, Any]:
    """One case: the Triton kernel and the reference on the same inputs, errors and ms/call.

    The reference runs on ``device`` too; should it fail there, the CPU's is the reference
    and the failure is recorded (``ref_error``) and fails the case: it is the GPU fallback
    of policies that need key scores."""
    inputs = attention_inputs(tokens, layout, chunk, heads, device, seed)
    ref_device, ref_error = device, None
    try:
        want, ref_ms = time_call(lambda: mixed_attention_ref(**inputs), device, repeats)
    except Exception as exc:  # noqa: BLE001 - recorded below; the CPU reference stands in
        if device.type == "cpu":
            raise
        ref_device, ref_error = torch.device("cpu"), f"{type(exc).__name__}: {exc}"
        cpu_inputs = _on_cpu(inputs)
        want, ref_ms = time_call(lambda: mixed_attention_ref(**cpu_inputs), ref_device, 1)
    got, triton_ms = time_call(lambda: mixed_attention_triton(**inputs), device, repeats)
    errors = _errors(got, want)
    return {
        "tokens": tokens,
        "layout": layout,
        "sequences": DECODE_SEQS + 1,
        "queries": DECODE_SEQS + chunk,
        "high_rows": int(inputs["kv"].high.slots.numel()),
        "low_rows": int(inputs["kv"].low.slots.numel()),
        "max_abs_err": errors["max_abs_err"],
        "rel_err": errors["rel_err"],
        "triton_ms": round(triton_ms, 4),
        "ref_ms": round(ref_ms, 4),
        "ref_device": str(ref_device),
        "ref_error": ref_error,
        "ok": bool(errors["rel_err"] <= REL_TOL) and ref_error is None,
    }
