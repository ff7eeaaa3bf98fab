"""Teacher-forced replay of one trace under many KV interventions at once (Runtime-V and -D).

An intervention says, per layer group, which action (H, L or R) every prompt key and every
output key gets once it has left the recent window. Replaying the recorded answer under it
shows what the model would have *seen* at each decision: a key's precision depends only on
the query's distance to it (inside ``window`` of the query, or one of the first ``sinks``
prompt tokens: full precision; beyond: its action), exactly as the KV store serves it. So one
teacher-forced pass reproduces the logits free-running decoding would have had, up to the
first position where the argmax flips — and a flip is all Runtime-V needs to know.

Speed (the issue asks for CPU minutes, the paper spent A100-hours):

* the prompt is run once per trace (``TraceContext``) and its K/V are shared by every
  intervention, in their stored forms (BF16 rows and INT4-dequantized rows);
* an intervention on layer group ``c`` starts at that group's first layer from the control
  run's hidden states, since lower layers cannot see it;
* only output positions from the first one that can see a degraded key are recomputed;
* interventions are rows of one batch, with an all-H control row computed by the same
  kernels, so a flip is never a batching artefact;
* logits are only formed for the few grammar-legal tokens the control ranked highest.

The pass runs in the model's dtype (BF16 on CPU is ~4× faster than FP32 here); agreement with
free-running FP32 decoding is measured by ``pask-agent calibrate --check-agreement``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import xgrammar as xgr

from pask_agent.calibration.replay import ReplayedTrace
from pask_agent.kernels.int4 import dequantize_int4_ref, quantize_int4_ref
from pask_agent.policy.actions import Action, LayerGroups

H, L, R = int(Action.H), int(Action.L), int(Action.R)


def _stored_high(x: torch.Tensor) -> torch.Tensor:
    """What the store hands back for a high row: a BF16 copy (identity when computing in BF16)."""
    return x if x.dtype == torch.bfloat16 else x.to(torch.bfloat16).to(x.dtype)


def _stored_low(x: torch.Tensor) -> torch.Tensor:
    """What the store hands back for an INT4 row: quantized, then dequantized (App. B.5)."""
    codes, scales = quantize_int4_ref(x)
    return dequantize_int4_ref(codes, scales, x.shape[-1], dtype=x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@dataclass(frozen=True)
class ModelParts:
    """The pieces of a decoder-only transformers model the replay runs layer by layer."""

    embed: Any
    layers: Any
    norm: Any
    lm_head_weight: torch.Tensor  # [V, d]
    rotary: Any
    num_heads: int
    num_kv_heads: int
    head_dim: int
    groups: LayerGroups
    dtype: torch.dtype
    # [layers, Hkv, D]: what the store centers INT4-stored keys on (runtime/key_offsets.py);
    # None: keys quantized as they are
    key_offsets: torch.Tensor | None = None

    @classmethod
    def of(cls, model: Any, key_offsets: torch.Tensor | None = None) -> ModelParts:
        cfg = model.config
        heads = int(cfg.num_attention_heads)
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
        return cls(
            embed=model.model.embed_tokens,
            layers=model.model.layers,
            norm=model.model.norm,
            lm_head_weight=model.lm_head.weight,
            rotary=model.model.rotary_emb,
            num_heads=heads,
            num_kv_heads=int(cfg.num_key_value_heads),
            head_dim=head_dim,
            groups=LayerGroups.for_layers(len(model.model.layers)),
            dtype=next(model.parameters()).dtype,
            key_offsets=None if key_offsets is None else key_offsets.to(next(model.parameters())),
        )

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def low_keys(self, layer: int, k: torch.Tensor) -> torch.Tensor:
        """Keys ``[.., Hkv, D]`` as an INT4 row hands them back: centered as the store keeps
        a PASK request's keys, quantized, dequantized, and moved back (the shift cancels in
        the softmax, so only the quantization error remains)."""
        if self.key_offsets is None:
            return _stored_low(k)
        mu = self.key_offsets[layer].to(k.dtype)
        return _stored_low(k - mu) + mu

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x [..., T, heads, D]; cos/sin [T, D]
        return x * cos[:, None, :] + _rotate_half(x) * sin[:, None, :]

    def qkv(
        self, layer: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Normed input → RoPE'd ``q [.., T, Hq, D]``, ``k``, ``v [.., T, Hkv, D]``."""
        attn = self.layers[layer].self_attn
        shape = (*x.shape[:-1], -1, self.head_dim)
        q = self.rope(attn.q_proj(x).view(shape), cos, sin)
        k = self.rope(attn.k_proj(x).view(shape), cos, sin)
        return q, k, attn.v_proj(x).view(shape)


def answer_keys(candidates: list[list[str]], continuations: list[str]) -> np.ndarray:
    """``[T, K]`` ids such that two candidates of a decision share an id iff choosing either
    leaves the answer's text unchanged, as far as that one decision can tell.

    ``candidates[t]`` are the texts of decision ``t``'s candidates, the recorded choice first;
    ``continuations[t]`` is the recorded text from that choice on. Two kinds of difference are
    not changes: whitespace only (JSON ignores it), and a candidate whose text starts the
    recorded continuation (``"}}"`` where ``"}},"`` was recorded, ``"cal"`` where ``"calc"``
    was): the same text split into other tokens, which free-running decoding completes the
    same way. Measured on 200 (trace, probe) pairs: 34 of the 38 proxy flips that free-running
    decoding did not confirm were such re-tokenizations, against 3 of the 62 it did confirm
    (results/calibration_agreement.md).
    """
    keys = np.zeros((len(candidates), len(candidates[0]) if candidates else 0), dtype=np.int64)
    for t, texts in enumerate(candidates):
        seen: dict[str, int] = {}
        for j, piece in enumerate(texts):
            if j > 0 and piece and continuations[t].startswith(piece):
                keys[t, j] = keys[t, 0]
            else:
                keys[t, j] = seen.setdefault(piece.strip(), len(seen))
    return keys


def choose_with_continue_rule(
    logits: torch.Tensor,
    at: torch.Tensor,
    real: torch.Tensor,
    is_next: torch.Tensor,
    is_close: torch.Tensor,
    tau: float,
) -> torch.Tensor:
    """Each row's choice among the candidates (``logits [N, T, K]``), with the runtime's
    continue-calls rule (``RuntimeConfig.continue_calls_at``) applied to that row's own
    probabilities at the between-calls positions ``at``: where a row gives another call at
    least ``tau``, closing the array is not an option for it. ``real``, ``is_next`` and
    ``is_close`` (``[len(at), K]``) say which candidates are legal tokens, start another call,
    and close the array."""
    return continue_rule_logits(logits, at, real, is_next, is_close, tau).argmax(-1)


def continue_rule_logits(
    logits: torch.Tensor,
    at: torch.Tensor,
    real: torch.Tensor,
    is_next: torch.Tensor,
    is_close: torch.Tensor,
    tau: float,
) -> torch.Tensor:
    """``logits`` with what the continue-calls rule takes out of the running at ``-inf``
    (arguments as for :func:`choose_with_continue_rule`)."""
    logits = logits.clone()
    sub = logits[:, at].masked_fill(~real[None], float("-inf"))
    p_next = (torch.softmax(sub, dim=-1) * is_next[None]).sum(-1)  # [N, len(at)]
    block = (p_next >= tau)[..., None] & is_close[None]
    logits[:, at] = logits[:, at].masked_fill(block, float("-inf"))
    return logits


@dataclass(frozen=True)
class Interventions:
    """A batch of interventions on one trace (row 0 must be the all-H control).

    ``prompt`` and ``output`` hold ``int8 [N, 3, P]`` / ``[N, 3, T]`` actions per layer group
    (None: all H). ``start_layer`` is the first layer any row changes; ``first_query`` the
    first output position whose attention can see a degraded key in any row.
    """

    prompt: np.ndarray | None
    output: np.ndarray | None
    start_layer: int
    first_query: int

    @property
    def rows(self) -> int:
        arr = self.prompt if self.prompt is not None else self.output
        assert arr is not None
        return int(arr.shape[0])


MARGIN_LIMIT = 1e4  # |margin| of a verdict no decision can change (beyond any logit gap)


def _margins(
    logits: torch.Tensor, texts: np.ndarray, control: np.ndarray, valid: np.ndarray
) -> np.ndarray:
    """``ReplayOutcome.margin`` of each row from its candidates' logits ``[N, T, K]`` (after
    the continue-calls rule), their answer keys ``texts [T, K]``, the control row's chosen
    keys ``control [1, T]`` and the checked decisions ``valid [1, T]``."""
    keeps = torch.from_numpy(texts[None] == control[..., None])  # [1, T, K]
    inf = torch.tensor(float("inf"))
    change = logits.masked_fill(keeps, -inf).amax(-1)
    keep = logits.masked_fill(~keeps, -inf).amax(-1)
    # a decision whose every answer-keeping candidate the rule took out has flipped for sure
    gap = torch.where(torch.isinf(keep), torch.where(torch.isinf(change), -inf, inf), change - keep)
    gap = gap.masked_fill(~torch.from_numpy(valid), -inf)
    return gap.amax(-1).clamp(-MARGIN_LIMIT, MARGIN_LIMIT).double().numpy()


@dataclass(frozen=True)
class ReplayOutcome:
    """What a batch of interventions did.

    ``flipped[n]``: row ``n`` changed the checked output somewhere (row 0 is always False).
    ``distortion[n]``: ``Σ_u Σ_ℓ max_h ‖o_ctrl − o_n‖²`` over recomputed query positions and
    the layers of ``distortion_layers`` (the intervened group's).
    ``margin[n]``: how far row ``n``'s verdict is from the other one, in logits: the largest,
    over its checked decisions, of (best logit of a candidate that changes the answer − best
    logit of one that keeps the control's). Positive: it flipped; negative: it did not, and
    would have to move that far to (0, an exact tie, either way; ``-MARGIN_LIMIT`` when no
    decision is checked). Verdicts within a small margin are near-ties that rounding decides
    (a batch's shape, another CPU's kernels); only verdicts beyond it are stable.
    """

    flipped: np.ndarray
    distortion: np.ndarray
    margin: np.ndarray


class TraceContext:
    """One trace's shared state: the prompt's K/V per layer and the all-H control run.

    Build it once per trace with :meth:`build`; then :meth:`run` any number of intervention
    batches against it.
    """

    def __init__(
        self,
        parts: ModelParts,
        trace: ReplayedTrace,
        *,
        sinks: int,
        window: int,
        top_k: int = 16,
        continue_calls_at: float | None = 0.01,
        next_call_ids: torch.Tensor | None = None,
        close_ids: torch.Tensor | None = None,
        token_text: Any = None,
        stop_ids: frozenset[int] = frozenset(),
    ) -> None:
        self.parts = parts
        self.trace = trace
        self.sinks = sinks
        self.window = window
        self.top_k = top_k
        self._tau = continue_calls_at
        self._next_ids = next_call_ids
        self._close_ids = close_ids
        self._token_text = token_text
        self._stop_ids = stop_ids

    @torch.inference_mode()
    def build(self) -> TraceContext:
        parts, tr = self.parts, self.trace
        ids = torch.tensor(tr.prompt_ids + tr.output_ids, dtype=torch.long)
        n_p, n_t = tr.prompt_len, tr.output_len
        positions = torch.arange(n_p + n_t)
        x = parts.embed(ids)
        cos, sin = parts.rotary(x[None], positions[None])
        self.cos, self.sin = cos[0].to(parts.dtype), sin[0].to(parts.dtype)
        # Prompt: ordinary causal attention at full precision (the prompt forward is high
        # precision; its R/L/H forms exist only after it, paper §3.6).
        self.kp_hi, self.vp_hi, self.kp_lo, self.vp_lo = [], [], [], []
        h = x[:n_p]
        cp, sp = self.cos[:n_p], self.sin[:n_p]
        for layer in range(parts.num_layers):
            block = parts.layers[layer]
            q, k, v = parts.qkv(layer, block.input_layernorm(h), cp, sp)
            out = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(0, 1),
                k.transpose(0, 1),
                v.transpose(0, 1),
                is_causal=True,
                enable_gqa=True,
            ).transpose(0, 1)
            h = h + block.self_attn.o_proj(out.reshape(n_p, -1))
            h = h + block.mlp(block.post_attention_layernorm(h))
            self.kp_hi.append(_stored_high(k))
            self.vp_hi.append(_stored_high(v))
            self.kp_lo.append(parts.low_keys(layer, k))
            self.vp_lo.append(_stored_low(v))
        # Control run over the answer: every later batch restarts from these hidden states.
        self.ctrl_in: list[torch.Tensor] = []  # [T, d] input of each layer
        self.ctrl_k: list[torch.Tensor] = []
        self.ctrl_v: list[torch.Tensor] = []
        h = x[n_p:][None]
        for layer in range(parts.num_layers):
            self.ctrl_in.append(h[0])
            h, k, v, _ = self._layer(layer, h, 0, None, None, collect=False)
            self.ctrl_k.append(k[0])
            self.ctrl_v.append(v[0])
        self.ctrl_final = h[0]
        self._candidates()
        return self

    # ------------------------------------------------------------------ decisions
    def _candidates(self) -> None:
        """The legal tokens the control ranks highest at every decision position.

        Query position ``t`` (the ``t``-th output token as input) decides output token
        ``t + 1`` (``t = T - 1`` decides whether to stop). Position 0's token is decided by the
        prompt's last position, which no intervention can reach, so it is not a decision here.
        """
        tr, parts = self.trace, self.parts
        n_t = tr.output_len
        # FP32 logits: in BF16 two candidates' logits are often exactly equal (8-bit mantissa)
        logits = parts.norm(self.ctrl_final).float() @ parts.lm_head_weight.float().T  # [T, V]
        vocab = logits.shape[-1]
        if tr.allowed is not None:
            rows = torch.arange(1, n_t + 1) if not tr.terminated else torch.arange(1, n_t)
            masked = logits[: len(rows)].clone()
            xgr.apply_token_bitmask_inplace(masked, tr.allowed[rows].contiguous(), vocab_size=vocab)
        else:
            masked = logits.clone()
        k = min(self.top_k, vocab)
        valid = np.zeros(n_t, dtype=bool)
        rule = np.zeros(n_t, dtype=bool)  # the continue-calls rule applies at this decision
        real = torch.zeros((n_t, k), dtype=torch.bool)
        contested = 0
        cand = torch.zeros((n_t, k), dtype=torch.long)
        for t in range(len(masked)):
            row = masked[t]
            chooses = row
            if self._tau is not None and tr.between_calls[t + 1] and self._next_ids is not None:
                rule[t] = True
                p = torch.softmax(row, dim=-1)
                if float(p[self._next_ids].sum()) >= self._tau:
                    chooses = row.clone()
                    chooses[self._close_ids] = float("-inf")
            # Candidates come from the row *before* the rule: an intervention that lowers the
            # chance of another call below tau lets the array close, and that must be seen.
            top = torch.topk(row, k)
            finite = torch.isfinite(top.values)
            ids = top.indices.clone()
            recorded = tr.output_ids[t + 1] if t + 1 < n_t else None
            first = int(chooses.argmax())
            if recorded is not None and bool(chooses[recorded] == chooses[first]):
                first = recorded  # a tie: the recorded (FP32) decision is the control's
            hit = (ids == first).nonzero()
            j = int(hit[0, 0]) if len(hit) else k - 1
            ids[j], finite[j] = ids[0].clone(), finite[0].clone()
            ids[0], finite[0] = first, True  # the control's choice is candidate 0
            ids[~finite] = first  # pad with the choice: never a flip
            cand[t], real[t] = ids, finite
            # A decision counts when the control's choice is what was recorded (a near-tie
            # that BF16 rounding broke the other way is noise, not a decision we can flip)
            # and when more than one legal token was in the running.
            chosen = first in self._stop_ids if recorded is None else first == recorded
            contested += int(finite.sum() > 1)
            valid[t] = bool(finite.sum() > 1) and chosen
        self.rule = rule
        self.cand_real = real
        if self._next_ids is not None and self._close_ids is not None:
            self.cand_next = torch.isin(cand, self._next_ids)
            self.cand_close = torch.isin(cand, self._close_ids)
        self.cand = cand
        self.cand_weight = parts.lm_head_weight[cand].float()  # [T, K, d]
        self.valid = valid
        text = self._token_text or (lambda i: str(i))
        continuations = [""] * n_t  # continuations[t]: the recorded text from token t + 1 on
        for t in range(n_t - 2, -1, -1):
            continuations[t] = text(int(tr.output_ids[t + 1])) + continuations[t + 1]
        self.cand_text = answer_keys(
            [[text(int(i)) for i in row] for row in cand.tolist()], continuations
        )
        # Of the decisions with a choice, the share whose control argmax is the recorded token.
        self.stable_fraction = float(valid.sum()) / max(1, contested)

    # ------------------------------------------------------------------ batches
    @torch.inference_mode()
    def run(self, batch: Interventions, *, distortion_group: int | None = None) -> ReplayOutcome:
        """Replay the answer under every row of ``batch`` (row 0: control)."""
        parts = self.parts
        t0, start = batch.first_query, batch.start_layer
        n = batch.rows
        n_t = self.trace.output_len
        if t0 >= n_t:
            return ReplayOutcome(np.zeros(n, bool), np.zeros(n), np.full(n, -MARGIN_LIMIT))
        h = self.ctrl_in[start][t0:].expand(n, -1, -1).contiguous()
        dist = torch.zeros(n)
        dist_layers = (
            set(parts.groups.layers_of(distortion_group)) if distortion_group is not None else set()
        )
        for layer in range(start, parts.num_layers):
            collect = layer in dist_layers
            h, _, _, o = self._layer(layer, h, t0, batch.prompt, batch.output, collect=collect)
            if collect:
                diff = (o.float() - o[:1].float()).pow(2).sum(-1)  # [N, T', Hq]
                dist += diff.amax(-1).sum(-1)
        logits = torch.einsum(
            "ntd,tkd->ntk", parts.norm(h).float(), self.cand_weight[t0:]
        )  # [N, T', K]
        logits = self._ruled(logits, t0)
        best = logits.argmax(-1).numpy()  # [N, T']
        keys = np.take_along_axis(self.cand_text[t0:][None], best[..., None], -1)[..., 0]
        valid = self.valid[t0:][None]
        changed = (keys != keys[:1]) & valid
        return ReplayOutcome(
            changed.any(-1), dist.numpy(), _margins(logits, self.cand_text[t0:], keys[:1], valid)
        )

    def _ruled(self, logits: torch.Tensor, t0: int) -> torch.Tensor:
        at = np.nonzero(self.rule[t0:])[0]
        if self._tau is None or not len(at):
            return logits
        pos = torch.from_numpy(at + t0)
        return continue_rule_logits(
            logits, torch.from_numpy(at), self.cand_real[pos], self.cand_next[pos],
            self.cand_close[pos], self._tau,
        )  # fmt: skip

    @torch.inference_mode()
    def local_distortion(
        self, group: int, prompt_modes: np.ndarray | None, output_modes: np.ndarray | None
    ) -> np.ndarray:
        """Runtime-D on the fixed reference trajectory: per row, ``Σ_u Σ_{ℓ∈c} max_h
        ‖o_ctrl − o_row‖²`` where every layer of group ``c`` reads the control run's queries
        and keys and only the row's degraded keys differ (attention only: no MLP, no
        propagation, so every probe's distortion costs a few attention products)."""
        parts = self.parts
        n_p = self.trace.prompt_len
        modes = prompt_modes if prompt_modes is not None else output_modes
        assert modes is not None
        n = int(modes.shape[0])
        cos, sin = self.cos[n_p:], self.sin[n_p:]
        total = torch.zeros(n)
        for layer in parts.groups.layers_of(group):
            block = parts.layers[layer]
            q, k, v = parts.qkv(layer, block.input_layernorm(self.ctrl_in[layer]), cos, sin)
            o = self._attend(
                layer,
                q[None].expand(n, -1, -1, -1),
                k[None].expand(n, -1, -1, -1),
                v[None].expand(n, -1, -1, -1),
                0,
                None if prompt_modes is None else prompt_modes[:, group],
                None if output_modes is None else output_modes[:, group],
            )
            total += (o.float() - o[:1].float()).pow(2).sum(-1).amax(-1).sum(-1)
        return total.numpy()

    def _layer(
        self,
        layer: int,
        h: torch.Tensor,
        t0: int,
        prompt_modes: np.ndarray | None,
        output_modes: np.ndarray | None,
        *,
        collect: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """One decoder layer over output positions ``t0..T-1`` of every row."""
        parts = self.parts
        block = parts.layers[layer]
        n, tq, _ = h.shape
        n_p = self.trace.prompt_len
        cos = self.cos[n_p + t0 :]
        sin = self.sin[n_p + t0 :]
        q, k_new, v_new = parts.qkv(layer, block.input_layernorm(h), cos, sin)
        if t0:
            k = torch.cat([self.ctrl_k[layer][:t0].expand(n, -1, -1, -1), k_new], dim=1)
            v = torch.cat([self.ctrl_v[layer][:t0].expand(n, -1, -1, -1), v_new], dim=1)
        else:
            k, v = k_new, v_new
        c = parts.groups.group_of(layer)
        pm = None if prompt_modes is None else prompt_modes[:, c]
        om = None if output_modes is None else output_modes[:, c]
        o = self._attend(layer, q, k, v, t0, pm, om)  # [N, T', Hq, D]
        h = h + block.self_attn.o_proj(o.reshape(n, tq, -1))
        h = h + block.mlp(block.post_attention_layernorm(h))
        return h, k, v, (o if collect else None)

    def _attend(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        t0: int,
        prompt_modes: np.ndarray | None,
        output_modes: np.ndarray | None,
    ) -> torch.Tensor:
        """Attention of queries ``t0..T-1`` over the prompt and the answer, per row's actions.

        Each row's keys are assembled in their stored form (BF16, INT4-dequantized, or masked
        out when released); the few (query, key) pairs inside the recent window or on a sink
        are then overwritten with the full-precision key, so the big products run once.
        """
        parts = self.parts
        n, tq, hq, d = q.shape
        hk = parts.num_kv_heads
        g = hq // hk
        n_p, n_t = self.trace.prompt_len, k.shape[1]
        qg = q.view(n, tq, hk, g, d).permute(0, 2, 3, 1, 4) * d**-0.5  # [N, Hkv, G, T', D]
        q_abs = n_p + t0 + torch.arange(tq)
        # ---- prompt keys: sinks and the keys within `window` of a query are shielded
        kp, vp, gone_p = self._stored(
            layer, self.kp_hi[layer], self.vp_hi[layer], self.kp_lo[layer], self.vp_lo[layer],
            prompt_modes,
        )  # fmt: skip
        sp = torch.einsum("nkgtd,npkd->nkgtp", qg, kp)
        if gone_p is not None:
            sp = sp.masked_fill(gone_p[:, None, None, None, :], float("-inf"))
        shield = torch.unique(
            torch.cat(
                [torch.arange(min(self.sinks, n_p)), torch.arange(max(0, n_p - self.window), n_p)]
            )
        )
        near = (shield[None, :] < self.sinks) | (q_abs[:, None] - shield[None, :] <= self.window)
        s_near = torch.einsum("nkgtd,pkd->nkgtp", qg, self.kp_hi[layer][shield])
        sp[..., shield] = torch.where(near, s_near, sp[..., shield])
        # ---- answer keys (causal): the band within `window` of each query is shielded
        # the answer's keys as stored (a query's own key is in the store by then as well)
        k, v = _stored_high(k), _stored_high(v)
        ko, vo, gone_o = self._stored(layer, k, v, None, None, output_modes, per_row=True)
        so = torch.einsum("nkgtd,nskd->nkgts", qg, ko)
        if gone_o is not None:
            so = so.masked_fill(gone_o[:, None, None, None, :], float("-inf"))
        o_abs = n_p + torch.arange(n_t)
        band = (q_abs[:, None] - o_abs[None, :] <= self.window) & (o_abs[None, :] <= q_abs[:, None])
        if output_modes is not None:
            so = torch.where(band, torch.einsum("nkgtd,nskd->nkgts", qg, k), so)
        so = so.masked_fill(o_abs[None, :] > q_abs[:, None], float("-inf"))
        probs = torch.softmax(torch.cat([sp, so], dim=-1), dim=-1, dtype=torch.float32)
        probs = probs.to(q.dtype)
        pp, po = probs[..., :n_p], probs[..., n_p:]
        near_p = pp[..., shield] * near
        pp[..., shield] -= near_p
        out = torch.einsum("nkgtp,npkd->nkgtd", pp, vp)
        out += torch.einsum("nkgtp,pkd->nkgtd", near_p, self.vp_hi[layer][shield])
        if output_modes is not None:
            near_o = po * band
            out += torch.einsum("nkgts,nskd->nkgtd", po - near_o, vo)
            out += torch.einsum("nkgts,nskd->nkgtd", near_o, v)
        else:
            out += torch.einsum("nkgts,nskd->nkgtd", po, v)
        return out.permute(0, 3, 1, 2, 4).reshape(n, tq, hq, d)

    def _stored(
        self,
        layer: int,
        k_hi: torch.Tensor,
        v_hi: torch.Tensor,
        k_lo: torch.Tensor | None,
        v_lo: torch.Tensor | None,
        modes: np.ndarray | None,
        *,
        per_row: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Keys and values as each row's store holds them, and which ones are released."""
        if modes is None:
            if per_row:
                return k_hi, v_hi, None
            return k_hi[None], v_hi[None], None
        m = torch.from_numpy(np.ascontiguousarray(modes, dtype=np.int8))  # [N, keys]
        low = (m == L)[..., None, None]
        if k_lo is None and bool(low.any()):
            k_lo, v_lo = self.parts.low_keys(layer, k_hi), _stored_low(v_hi)
        k_rows = k_hi if per_row else k_hi[None]
        v_rows = v_hi if per_row else v_hi[None]
        if k_lo is not None:
            k_low = k_lo if per_row else k_lo[None]
            v_low = v_lo if per_row else v_lo[None]  # type: ignore[index]
            k_rows = torch.where(low, k_low, k_rows)
            v_rows = torch.where(low, v_low, v_rows)
        gone = m == R
        return k_rows, v_rows, (gone if bool(gone.any()) else None)
