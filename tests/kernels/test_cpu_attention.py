"""The compiled CPU decode kernel (``kernels/cpu_attention.py``, ``_decode_attention.c``).

The shared parity cases run it through ``KERNEL_IMPLS`` (``test_attention.py``); here: it is
really built on this machine, ``backend="auto"`` picks it on a CPU, it agrees with the dense
softmax on the shape the server runs (GQA 7, head dim 64, thousands of INT4 rows, key blocks
cut mid-sequence, masked pool keys), and without it everything falls back to the torch path.
"""

from __future__ import annotations

import os
import platform
import shutil

import pytest
import torch
from test_attention import CASES, Case, _rel_err, build_inputs, dense_attention

from pask_agent.kernels import cpu_attention
from pask_agent.kernels.attention import mixed_attention, mixed_attention_cpu, mixed_attention_ref

# the builds here run gcc (cc1 takes 1.3 GB building the kernel): a worker's default model
# goes meanwhile, or the suite's peak passes 10 GB (two workers' models plus the compiler)
pytestmark = pytest.mark.usefixtures("no_default_model_here")

SERVER_SHAPE = Case((1,) * 11, (36, 0, 5, 70, 1, 2, 3, 4, 5, 6, 7), (700,) * 10 + (65,), 14, 2, 64)


def test_the_kernel_builds_here() -> None:
    # the CI image has a C compiler, so a missing kernel there is a regression, not a skip
    assert cpu_attention.native_status() == "compiled"
    assert cpu_attention.native_kernel() is not None


def test_server_shaped_decode_step_matches_the_dense_softmax() -> None:
    inputs = build_inputs(SERVER_SHAPE, seed=11)
    want, _ = dense_attention(inputs, 0.125)
    got = mixed_attention_cpu(**inputs, scale=0.125)
    assert _rel_err(got, want) <= 1e-5


def test_pool_keys_after_a_query_stay_hidden() -> None:
    """Interleaved positions put pool keys after some queries; a decode-sized step of such
    sequences goes through the kernel, which must mask them as the dense softmax does."""
    case = Case((4, 3), (10, 6), (12, 3), 6, 2, 64, interleaved=True)
    inputs = build_inputs(case, seed=12)
    want, _ = dense_attention(inputs, 0.3)
    assert _rel_err(mixed_attention_cpu(**inputs, scale=0.3), want) <= 1e-5


def test_auto_on_a_cpu_is_native_except_for_key_scores() -> None:
    inputs = build_inputs(CASES["decode_b4_ragged_empty_pools"], seed=13)
    native = mixed_attention_cpu(**inputs, scale=0.2)
    ref = mixed_attention_ref(**inputs, scale=0.2)
    assert torch.equal(mixed_attention(**inputs, scale=0.2), native)  # auto on a CPU: native
    assert torch.equal(mixed_attention(**inputs, scale=0.2, backend="native"), native)
    assert torch.equal(mixed_attention(**inputs, scale=0.2, backend="torch"), ref)
    for backend in ("auto", "native"):
        out, _ = mixed_attention(**inputs, scale=0.2, backend=backend, return_key_scores=True)
        assert torch.equal(out, ref)
    assert _rel_err(native, ref) <= 1e-5


def test_without_the_kernel_auto_is_torch_and_native_says_why(monkeypatch) -> None:
    monkeypatch.setattr(cpu_attention, "_state", {"lib": None, "status": "no C compiler"})
    inputs = build_inputs(CASES["decode_b4_ragged_empty_pools"], seed=14)
    ref = mixed_attention_ref(**inputs, scale=0.2)
    assert torch.equal(mixed_attention(**inputs, scale=0.2), ref)
    with pytest.raises(RuntimeError, match="no C compiler"):
        mixed_attention(**inputs, scale=0.2, backend="native")


def test_a_failed_build_is_reported_not_raised(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(cpu_attention, "_state", {})
    monkeypatch.setenv("PASK_AGENT_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    assert cpu_attention.native_kernel() is None
    assert cpu_attention.native_status().startswith("build failed")
    monkeypatch.setattr(cpu_attention, "_state", {})
    monkeypatch.setenv(cpu_attention.DISABLE_ENV, "1")
    assert cpu_attention.native_kernel() is None
    assert "disabled" in cpu_attention.native_status()


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 build flags")
@pytest.mark.parametrize(
    "extra",
    [("-mno-avx512f",), ("-mno-avx512f", "-mno-avx2")],
    ids=["avx2_widening", "portable_widening"],
)
def test_builds_without_avx512_agree_with_the_dense_softmax(monkeypatch, tmp_path, extra) -> None:
    """AVX2 builds use eight-lane vectors and their own widening instructions; portable builds
    use sixteen lanes and GCC's generic conversions. CI runs on an AVX-512 machine, so both
    other branches are built here on purpose and run on the server's shape."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    assert compiler is not None  # the CI image has one (test_the_kernel_builds_here)
    monkeypatch.setenv("PASK_AGENT_CACHE", str(tmp_path))
    lib = cpu_attention._load(cpu_attention._build(compiler, (*cpu_attention.FLAGS, *extra)))
    monkeypatch.setattr(cpu_attention, "_state", {"lib": lib, "status": "compiled"})
    inputs = build_inputs(SERVER_SHAPE, seed=15)
    want, _ = dense_attention(inputs, 0.125)
    assert _rel_err(mixed_attention_cpu(**inputs, scale=0.125), want) <= 1e-5
