"""Mixed-precision attention over bf16 + INT4 pools + current chunk: dense parity, ref parity.

Every case has non-contiguous slot ids and position gaps (released tokens). The reference is
checked against a dense fp32 softmax over fully dequantized keys written the obvious way; each
implementation in ``KERNEL_IMPLS`` is checked against the reference.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import pytest
import torch

from pask_agent.kernels.attention import (
    KeyScores,
    PoolView,
    mixed_attention,
    mixed_attention_ref,
    mixed_attention_triton,
)
from pask_agent.kernels.attention_inputs import MixedKV, QueryChunk
from pask_agent.kernels.int4 import dequantize_int4_ref, quantize_int4_ref

if TYPE_CHECKING:
    from conftest import KernelImpl

REL_TOL = 1e-3  # implementation vs reference, max-abs error relative to max |ref|


@dataclass(frozen=True)
class Case:
    """A batch: per-sequence query/high/low lengths, head layout, and the hard bits to switch on."""

    q_lens: tuple[int, ...]
    high_lens: tuple[int, ...]
    low_lens: tuple[int, ...]
    n_qh: int
    n_kvh: int
    dim: int
    q_dtype: torch.dtype = torch.float32
    interleaved: bool = False  # pool keys may sit after some chunk queries (mask inside pools)
    strided_q: bool = False  # q is a non-contiguous view


CASES = {
    "decode_b1_gqa1_d64_two_low_blocks": Case((1,), (20,), (300,), 3, 3, 64),
    "decode_b3_gqa3_d80_bf16": Case((1, 1, 1), (5, 0, 33), (0, 140, 7), 6, 2, 80, torch.bfloat16),
    "chunk17_b3_gqa7_d64": Case((17, 1, 5), (10, 3, 0), (9, 0, 30), 7, 1, 64),
    "chunk17_b1_empty_high_d80": Case((17,), (0,), (40,), 6, 2, 80),
    "chunk1_b3_empty_low_d64": Case((1, 2, 1), (12, 7, 30), (0, 0, 0), 3, 3, 64),
    "prefill_no_pools_gqa7_d80": Case((17,), (0,), (0,), 7, 1, 80),
    "odd_dim_33_b2": Case((3, 1), (4, 2), (5, 6), 6, 2, 33),
    "interleaved_positions_b2": Case((17, 4), (10, 6), (12, 3), 6, 2, 64, interleaved=True),
    "strided_q_b3": Case((2, 1, 3), (4, 0, 5), (3, 8, 0), 6, 2, 64, strided_q=True),
    "seq_without_queries_b3": Case((3, 0, 1), (2, 5, 0), (4, 3, 6), 6, 2, 64),
    "decode_b4_ragged_empty_pools": Case((1, 1, 1, 1), (0, 0, 9, 3), (0, 5, 0, 40), 6, 2, 64),
}


def _offsets(lengths: tuple[int, ...]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64)


def build_inputs(case: Case, seed: int = 0) -> dict[str, object]:
    """Random pools with spare rows, shuffled slot ids and gaps in every sequence's positions."""
    gen = torch.Generator().manual_seed(seed)
    n_h, n_l, n_t = sum(case.high_lens), sum(case.low_lens), sum(case.q_lens)
    kv = (case.n_kvh, case.dim)
    # storage larger than what is used: unused rows are garbage the kernel must not read
    high_k = torch.randn(n_h + 5 if n_h else 0, *kv, generator=gen).to(torch.bfloat16)
    high_v = torch.randn(high_k.shape, generator=gen).to(torch.bfloat16)
    low_rows = n_l + 7 if n_l else 0
    low_k_codes, low_k_scales = quantize_int4_ref(torch.randn(low_rows, *kv, generator=gen) * 2)
    low_v_codes, low_v_scales = quantize_int4_ref(torch.randn(low_rows, *kv, generator=gen))
    high_slots = torch.randperm(high_k.shape[0], generator=gen)[:n_h]
    low_slots = torch.randperm(low_rows, generator=gen)[:n_l]

    high_pos, low_pos, q_pos = [], [], []
    for n_q, n_hb, n_lb in zip(case.q_lens, case.high_lens, case.low_lens, strict=True):
        n_old = n_hb + n_lb
        if case.interleaved:  # chunk and pool positions share one gappy range
            span = torch.randperm(2 * (n_old + n_q), generator=gen)[: n_old + n_q]
            order = torch.randperm(n_old + n_q, generator=gen)
            old, chunk = span[order[:n_old]], span[order[n_old:]].sort().values
        else:  # released tokens leave gaps among the old keys and before the chunk
            old = torch.randperm(2 * n_old + 3, generator=gen)[:n_old]
            chunk = torch.arange(n_q) + 2 * n_old + 5
        high_pos.append(old[:n_hb])
        low_pos.append(old[n_hb:])
        q_pos.append(chunk)

    q = torch.randn(n_t, case.n_qh, case.dim, generator=gen)
    if case.strided_q:  # same values, non-contiguous layout [T, Hq, D] with head stride 1
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
    cur_k, cur_v = (torch.randn(n_t, *kv, generator=gen).to(case.q_dtype) for _ in range(2))
    q_offsets, q_pos = _offsets(case.q_lens), torch.cat(q_pos).to(torch.int64)
    chunk = QueryChunk(q.to(case.q_dtype), q_offsets, q_pos, cur_k, cur_v)
    high = PoolView(high_slots, _offsets(case.high_lens), torch.cat(high_pos).long())
    low = PoolView(low_slots, _offsets(case.low_lens), torch.cat(low_pos).long())
    codes = (low_k_codes, low_v_codes, low_k_scales, low_v_scales)
    return {"chunk": chunk, "kv": MixedKV(high_k, high_v, high, *codes, low)}


def _on(inputs: dict[str, object], device: str) -> dict[str, object]:
    """Move every tensor but the offsets (which stay on the CPU) to ``device``."""
    return {"chunk": inputs["chunk"].to(device), "kv": inputs["kv"].to(device)}


def dense_attention(inputs: dict[str, object], scale: float) -> tuple[torch.Tensor, list]:
    """Per query and head: gather every key of its sequence, mask, softmax, weighted sum.

    Returns the output ``[T, Hq, D]`` and, per query token, ``(probs [Hq, K], key_ids)`` with
    key ids ``("high" | "low" | "cur", index into that part's slots / tokens)``.
    """
    chunk, kv = inputs["chunk"], inputs["kv"]
    q, q_pos = chunk.q.float(), chunk.q_pos
    high, low = kv.high, kv.low
    dim = q.shape[-1]
    low_k = dequantize_int4_ref(kv.low_k_codes, kv.low_k_scales, dim)
    low_v = dequantize_int4_ref(kv.low_v_codes, kv.low_v_scales, dim)
    group = q.shape[1] // chunk.cur_k.shape[1]
    out = torch.empty(q.shape)
    probs_per_token = []
    q_off, h_off, l_off = (x.tolist() for x in (chunk.q_offsets, high.offsets, low.offsets))
    for b in range(len(q_off) - 1):
        keys, values, positions, ids = [], [], [], []
        for i in range(h_off[b], h_off[b + 1]):
            keys.append(kv.high_k[high.slots[i]].float())
            values.append(kv.high_v[high.slots[i]].float())
            positions.append(int(high.positions[i]))
            ids.append(("high", i))
        for i in range(l_off[b], l_off[b + 1]):
            keys.append(low_k[low.slots[i]])
            values.append(low_v[low.slots[i]])
            positions.append(int(low.positions[i]))
            ids.append(("low", i))
        for i in range(q_off[b], q_off[b + 1]):
            keys.append(chunk.cur_k[i].float())
            values.append(chunk.cur_v[i].float())
            positions.append(int(q_pos[i]))
            ids.append(("cur", i))
        k, v = torch.stack(keys), torch.stack(values)  # [K, Hkv, D]
        for t in range(q_off[b], q_off[b + 1]):
            visible = torch.tensor(positions) <= q_pos[t]
            probs = torch.empty(q.shape[1], len(keys))
            for h in range(q.shape[1]):
                logits = (k[:, h // group] @ q[t, h]) * scale
                p = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=0)
                out[t, h] = p @ v[:, h // group]
                probs[h] = p
            probs_per_token.append((probs, ids))
    return out, probs_per_token


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).abs().max() / want.abs().max()).item()


@pytest.mark.parametrize("name", list(CASES), ids=list(CASES))
def test_ref_matches_dense_softmax(name: str) -> None:
    case = CASES[name]
    inputs = build_inputs(case)
    scale = case.dim**-0.5
    want, _ = dense_attention(inputs, scale)
    got = mixed_attention_ref(**inputs, scale=scale)
    assert got.shape == want.shape and got.dtype == torch.float32
    assert _rel_err(got, want) <= 1e-5


@pytest.mark.parametrize("name", list(CASES), ids=list(CASES))
def test_ref_gathers_once_or_per_sequence_alike(name: str, monkeypatch) -> None:
    """The reference gathers and unpacks the whole batch's rows at once (one call per pool,
    not per sequence) while they are few; past ``HOIST_ROWS`` it does so per sequence. Both
    read the same values, so outputs and key scores are bit-identical."""
    import pask_agent.kernels.attention as attention

    case = CASES[name]
    inputs = build_inputs(case, seed=3)
    scale = case.dim**-0.5
    once, once_scores = mixed_attention_ref(**inputs, scale=scale, return_key_scores=True)
    monkeypatch.setattr(attention, "HOIST_ROWS", -1)
    each, each_scores = mixed_attention_ref(**inputs, scale=scale, return_key_scores=True)
    assert torch.equal(once, each)
    for a, b in zip(
        (once_scores.high, once_scores.low, once_scores.cur),
        (each_scores.high, each_scores.low, each_scores.cur),
        strict=True,
    ):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", list(CASES), ids=list(CASES))
def test_impl_matches_ref(impl: KernelImpl, name: str) -> None:
    case = CASES[name]
    inputs = build_inputs(case, seed=1)
    scale = case.dim**-0.5
    want = mixed_attention_ref(**inputs, scale=scale)
    got = impl.attention(**_on(inputs, impl.device), scale=scale)
    assert got.shape == want.shape and got.dtype == torch.float32
    assert got.device.type == torch.device(impl.device).type
    assert _rel_err(got.cpu(), want) <= REL_TOL


@pytest.mark.parametrize("name", ["chunk17_b3_gqa7_d64", "interleaved_positions_b2"])
def test_key_scores_are_probability_mass(name: str) -> None:
    case = CASES[name]
    inputs = build_inputs(case, seed=2)
    out, scores = mixed_attention_ref(**inputs, scale=0.3, return_key_scores=True)
    assert isinstance(scores, KeyScores)
    assert torch.equal(out, mixed_attention_ref(**inputs, scale=0.3))
    high, low, n_kvh = inputs["kv"].high, inputs["kv"].low, case.n_kvh
    assert scores.high.shape == (high.slots.shape[0], n_kvh)
    assert scores.low.shape == (low.slots.shape[0], n_kvh)
    assert scores.cur.shape == (sum(case.q_lens), n_kvh)

    # per sequence and KV head: the probabilities of each query head sum to 1
    group = case.n_qh // n_kvh
    q_offsets = inputs["chunk"].q_offsets
    q_off, h_off, l_off = (x.tolist() for x in (q_offsets, high.offsets, low.offsets))
    for b in range(len(q_off) - 1):
        total = (
            scores.high[h_off[b] : h_off[b + 1]].sum(0)
            + scores.low[l_off[b] : l_off[b + 1]].sum(0)
            + scores.cur[q_off[b] : q_off[b + 1]].sum(0)
        )
        want = torch.full((n_kvh,), float(case.q_lens[b] * group))
        torch.testing.assert_close(total, want, rtol=1e-5, atol=1e-5)

    # and each key's mass is the dense softmax probability summed over queries and group heads
    _, probs_per_token = dense_attention(inputs, 0.3)
    want_parts = {
        "high": torch.zeros_like(scores.high),
        "low": torch.zeros_like(scores.low),
        "cur": torch.zeros_like(scores.cur),
    }
    for probs, ids in probs_per_token:  # probs [Hq, K]
        per_kv = probs.reshape(n_kvh, group, -1).sum(1)  # [Hkv, K]
        for j, (part, i) in enumerate(ids):
            want_parts[part][i] += per_kv[:, j]
    for part in ("high", "low", "cur"):
        torch.testing.assert_close(getattr(scores, part), want_parts[part], rtol=1e-4, atol=1e-6)


def test_dispatcher_routes_backends(triton_device: str) -> None:
    inputs = build_inputs(CASES["odd_dim_33_b2"], seed=3)
    ref = mixed_attention_ref(**inputs, scale=0.2)
    # auto on a CPU = the C kernel, which leaves odd head dims to the torch path: the reference
    assert torch.equal(mixed_attention(**inputs, scale=0.2), ref)
    assert torch.equal(mixed_attention(**inputs, scale=0.2, backend="torch"), ref)
    out, scores = mixed_attention(**inputs, scale=0.2, return_key_scores=True)
    assert torch.equal(out, ref) and isinstance(scores, KeyScores)

    on_device = _on(inputs, triton_device)
    tri = mixed_attention_triton(**on_device, scale=0.2)
    assert torch.equal(mixed_attention(**on_device, scale=0.2, backend="triton"), tri)
    if triton_device == "cuda":  # auto on CUDA = Triton, unless key scores are asked for
        assert torch.equal(mixed_attention(**on_device, scale=0.2), tri)
        out, _ = mixed_attention(**on_device, scale=0.2, return_key_scores=True)
        assert _rel_err(out.cpu(), ref) <= REL_TOL
    assert _rel_err(tri.cpu(), ref) <= REL_TOL
    with pytest.raises(ValueError, match="valid backends"):
        mixed_attention(**inputs, scale=0.2, backend="flash")
    with pytest.raises(ValueError, match="key scores"):
        mixed_attention_triton(**on_device, scale=0.2, return_key_scores=True)


def test_bad_inputs_raise_value_errors(impl: KernelImpl) -> None:
    inputs = _on(build_inputs(CASES["odd_dim_33_b2"], seed=4), impl.device)

    def call(**changes: object) -> None:
        """Attend with some fields of the chunk or the view replaced (each checked when built,
        the two together when attended)."""
        chunk, kv = inputs["chunk"], inputs["kv"]
        on_chunk = {k: v for k, v in changes.items() if k in QueryChunk.__dataclass_fields__}
        on_kv = {k: v for k, v in changes.items() if k not in on_chunk}
        impl.attention(replace(chunk, **on_chunk), replace(kv, **on_kv), scale=0.2)

    chunk, kv = inputs["chunk"], inputs["kv"]
    with pytest.raises(ValueError, match="multiple of KV heads"):
        call(q=chunk.q[:, :5])
    with pytest.raises(ValueError, match="q_offsets must start at 0 and end at 4"):
        call(q_offsets=torch.tensor([0, 3, 5]))
    with pytest.raises(ValueError, match="non-decreasing"):
        call(q_offsets=torch.tensor([0, 4, 3, 4]))
    with pytest.raises(ValueError, match="low.offsets describes 1 sequences"):
        n_low = kv.low.slots.shape[0]
        call(low=replace(kv.low, offsets=torch.tensor([0, n_low])))
    with pytest.raises(ValueError, match="low_k_codes must have shape"):
        call(low_k_codes=kv.low_k_codes[..., :-1])
    with pytest.raises(ValueError, match="high.positions has"):
        call(high=replace(kv.high, positions=kv.high.positions[:-1]))
    with pytest.raises(TypeError, match="uint8"):
        call(low_v_codes=kv.low_v_codes.to(torch.int16))


def test_chunk_and_view_reject_inconsistent_shapes_when_built() -> None:
    """A ``QueryChunk`` and a ``MixedKV`` check themselves when built, so the KV store's view
    fails where it is made, naming the field; a chunk and a view that do not belong together
    (other head dim or KV heads) fail when attended, on every backend alike. The kernels import
    nothing of ours, so these are ValueError and TypeError rather than a ``PaskError``."""
    chunk, kv = build_inputs(CASES["odd_dim_33_b2"], seed=7).values()
    with pytest.raises(ValueError, match=r"high_v must have shape \(11, 2, 33\)"):
        replace(kv, high_v=kv.high_v[:, :1])
    with pytest.raises(ValueError, match="low_v_scales must have shape"):
        replace(kv, low_v_scales=kv.low_v_scales[:-1])
    with pytest.raises(ValueError, match="low_k_codes must have shape"):
        replace(kv, low_k_codes=kv.low_k_codes[:, :, :-1])  # 16 bytes hold 32 elements, not 33
    with pytest.raises(TypeError, match="high_k must be floating point"):
        replace(kv, high_k=kv.high_k.to(torch.int16))
    with pytest.raises(TypeError, match="low must be a PoolView"):
        replace(kv, low=(kv.low.slots, kv.low.offsets, kv.low.positions))
    with pytest.raises(ValueError, match="low.offsets must start at 0 and end at 11"):
        replace(kv, low=replace(kv.low, offsets=torch.tensor([0, 5, 10])))
    with pytest.raises(ValueError, match="cur_v must have shape"):
        replace(chunk, cur_v=chunk.cur_v[:-1])
    with pytest.raises(ValueError, match="q_pos has 3 entries, expected 4"):
        replace(chunk, q_pos=chunk.q_pos[:-1])
    # each is fine alone, but they do not belong together
    other = build_inputs(replace(CASES["odd_dim_33_b2"], dim=32), seed=7)["kv"]
    with pytest.raises(ValueError, match=r"high_k must have shape \('N', 2, 33\)"):
        mixed_attention(chunk, other, scale=0.2)
    with pytest.raises(TypeError, match="kv must be a MixedKV"):
        mixed_attention(chunk, chunk, scale=0.2)  # type: ignore[arg-type]
    # moving keeps what was read once: the offsets as Python ints
    assert kv.to("cpu").low_bounds == kv.low_bounds == (0, 5, 11)
    assert chunk.to("cpu").bounds == chunk.bounds == (0, 3, 4)


@pytest.mark.parametrize("name", list(CASES), ids=list(CASES))
@pytest.mark.parametrize("batch_rows", [1 << 15, 8], ids=["one_batch", "split_batches"])
def test_decode_batches_match_the_per_sequence_loop(
    name: str, batch_rows: int, monkeypatch
) -> None:
    """Sequences with few queries are attended in padded batches (``decode_attention.py``):
    INT4 keys as nibble matmuls times their scales, one softmax per batch. Outputs and key
    scores equal the per-sequence loop's to fp32 rounding, whether the step fits one batch or
    is split into several."""
    import pask_agent.kernels.decode_attention as decode_attention

    case = CASES[name]
    inputs = build_inputs(case, seed=5)
    scale = case.dim**-0.5
    monkeypatch.setattr(decode_attention, "BATCH_ROWS", batch_rows)
    batched, batched_scores = mixed_attention_ref(**inputs, scale=scale, return_key_scores=True)
    monkeypatch.setattr(decode_attention, "SMALL_QUERIES", 0)
    looped, looped_scores = mixed_attention_ref(**inputs, scale=scale, return_key_scores=True)
    assert _rel_err(batched, looped) <= 1e-5
    for part in ("high", "low", "cur"):
        torch.testing.assert_close(
            getattr(batched_scores, part), getattr(looped_scores, part), rtol=1e-4, atol=1e-6
        )


def test_decode_batch_with_a_long_chunk_in_the_same_step() -> None:
    """A step that mixes decoding sequences with a prefill chunk: the chunk goes through the
    loop, the others through the padded batch, and every token gets the dense answer."""
    case = Case((1, 40, 1, 2), (30, 5, 0, 7), (50, 20, 9, 0), 6, 2, 64)
    inputs = build_inputs(case, seed=6)
    want, _ = dense_attention(inputs, 0.2)
    assert _rel_err(mixed_attention_ref(**inputs, scale=0.2), want) <= 1e-5
