"""Serving settings of one ``Runtime``: KV capacity, protection, batching, kernels, schedule.

A value users build and pass in (``Runtime.open(..., config=RuntimeConfig(...))``); validated when
made, so a bad setting fails before any model loads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pask_agent.errors import ConfigError
from pask_agent.kernels.attention import ATTENTION_BACKENDS
from pask_agent.runtime.models.quantized_linear import check_weight_format

SCHEDULES = ("interleave", "prefill_first")  # RuntimeConfig.schedule


@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    """Serving settings. ``kv_capacity_bytes`` is preallocated once for the KV pools
    (``runtime/memory/kv_pools.py``) and bounds the admitted requests' demands (what their policies
    keep, in pool rows: ``runtime/memory/admission.py``): a request that fits alone waits until the
    running ones leave it room; one that could never fit is refused with
    ``RequestTooLargeError`` when it is made. None: ``max_batch`` Full-KV requests of the
    model's context, at most 4 GiB (``admission.default_capacity_bytes``)."""

    sinks: int = 4
    window: int = 16
    kv_capacity_bytes: int | None = None
    prefill_chunk_tokens: int = 256
    max_batch: int = 16
    # Off by default: appending grammar-forced text re-tokenizes it, which gives the model token
    # boundaries it never produces itself; on 20 BFCL cases that cost 2 correct calls
    # (18/20 without, 16/20 with) for a modest speed gain.
    jump_forward: bool = False
    # Between parallel calls, start another call whenever the model gives continuing at least
    # this probability (grammar-masked), instead of only when continuing is its argmax. The
    # default 0.5B model closes the array after one call even when the request lists several
    # items: continuing gets 0.003-0.86 after a call that leaves items undone and <= 0.001
    # after the last one (an exploratory teacher-forced probe on 10 parallel dev cases).
    # Chosen on the dev split
    # (results/fullkv_variants.md: parallel 20 % -> 50 %, parallel_multiple 0 % -> 40 %).
    # None: plain greedy/sampling.
    continue_calls_at: float | None = 0.01
    # Append one trace line per finished turn to this JSONL file (record/traces.py), so
    # real use becomes calibration data. None: record nothing.
    record_traces: str | None = None
    # Keep freed scratch memory in the process instead of returning it to the OS after every
    # layer (runtime/memory/host_memory.py): a process-wide glibc setting, on by default because CPU
    # decode steps otherwise spend much of their attention time in page faults.
    retain_host_memory: bool = True
    # Run the model's fp32 CPU linear layers through oneDNN with their weights converted once
    # (runtime/models/cpu_linear.py): about 2x faster decode steps here, most at 8 rows.
    onednn_linear: bool = True
    # How the model's linear layers hold their weights (runtime/models/quantized_linear.py):
    # "fp32" (dequantized from the GGUF), "int8" (a scale per output channel) or "int4" (a
    # scale and zero per 32 inputs). Quantized weights make CPU decode steps read 4-8x fewer
    # bytes (results/cpu_paths.md). ``Runtime.open`` loads the model that way; a LoadedModel
    # passed in must have been loaded with the same ``weights``. None: as the model was loaded
    # (by name: ``DEFAULT_WEIGHTS``).
    weights: str | None = None
    # Attention kernel for the KV store (kernels/attention.py): "auto" (Triton on CUDA; on a
    # CPU the compiled C decode kernel, kernels/cpu_attention.py, where a C compiler builds
    # it, else the torch reference), "native", "torch" or "triton". The C kernel made decode
    # at 8 sequences 13-19 % faster on the serving bench (results/bench.md, runs 7 and 11).
    attention_backend: str = "auto"
    # How prefill shares steps with decoding. "interleave": every step decodes one token for
    # each running request and adds up to ``prefill_chunk_tokens`` of waiting prompts, so no
    # request stalls for long. "prefill_first": while any admitted prompt is still being
    # prefilled, steps run prefill only and decoding waits, so the requests admitted together
    # decode together in full batches: more tokens per second for batch jobs, longer pauses
    # between one request's tokens (with 4,096-token prompts on this CPU, the first requests
    # of a burst otherwise finish before the last ones are prefilled: results/bench.md).
    schedule: str = "interleave"
    # Store the keys of requests whose policy may quantize them relative to the model's mean
    # key (runtime/models/key_offsets.py): attention is unchanged, INT4 rows lose a shared channel
    # offset that otherwise sets their scale. Full KV and release-only policies never are.
    center_keys: bool = True
    # Where the model and the KV pools live: "cuda", "cuda:1", "cpu". None: wherever the
    # model was loaded, the pools beside it. A model on "cuda" attends with the Triton kernels
    # (attention_backend "auto") and computes in its own dtype (bf16 for a GPU is usual).
    device: str | None = None

    def __post_init__(self) -> None:
        capacity = 1 if self.kv_capacity_bytes is None else self.kv_capacity_bytes
        if self.prefill_chunk_tokens < 1 or self.max_batch < 1 or capacity < 1:
            raise ConfigError("prefill_chunk_tokens, max_batch and kv_capacity_bytes must be >= 1")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ConfigError(
                f"attention_backend={self.attention_backend!r}; valid: {list(ATTENTION_BACKENDS)}"
            )
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"schedule={self.schedule!r}; valid: {list(SCHEDULES)}")
        if self.continue_calls_at is not None and not 0 < self.continue_calls_at < 1:
            raise ConfigError(
                f"continue_calls_at must lie in (0, 1) or be None, got {self.continue_calls_at}"
            )
        if self.weights is not None:
            check_weight_format(self.weights)
        if self.device is not None:
            try:
                torch.device(self.device)
            except (RuntimeError, TypeError) as exc:
                raise ConfigError(
                    f"device={self.device!r} is not a torch device; use 'cpu', 'cuda' or 'cuda:N'"
                ) from exc
