"""The model's linear layers through oneDNN: same logits, a tied head still tied to its
embedding, weight bytes counted as before, and other dtypes left alone."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
from tiny_models import tiny_qwen2
from torch import nn

from pask_agent.runtime.models.cpu_linear import (
    OneDNNLinear,
    prepack_linear_layers,
    step_weight_bytes,
)


def _linears(model: nn.Module) -> int:
    return sum(type(m) is nn.Linear for m in model.modules())


def test_prepacked_model_gives_the_same_logits() -> None:
    dense = tiny_qwen2()
    packed = copy.deepcopy(dense)
    n_linear = _linears(dense)
    before = step_weight_bytes(dense)
    assert prepack_linear_layers(packed) == n_linear > 0
    assert _linears(packed) == 0
    assert sum(isinstance(m, OneDNNLinear) for m in packed.modules()) == n_linear
    ids = torch.randint(0, 512, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        want, got = dense(ids).logits, packed(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert step_weight_bytes(packed) == before  # the same bytes, now held by oneDNN
    # a second runtime on the same model converts nothing and copies nothing
    embedding = packed.get_input_embeddings().weight.data_ptr()
    assert prepack_linear_layers(packed) == 0
    assert packed.get_input_embeddings().weight.data_ptr() == embedding


def test_tied_head_keeps_reading_the_embedding() -> None:
    model = tiny_qwen2()
    embedding = model.get_input_embeddings().weight
    prepack_linear_layers(model)
    head = model.lm_head
    assert isinstance(head, OneDNNLinear)
    assert head.weight.data_ptr() == embedding.data_ptr()  # no second dense copy
    q_proj = model.model.layers[0].self_attn.q_proj
    assert q_proj.weight.shape == (q_proj.out_features, q_proj.in_features)


def test_other_dtypes_are_left_as_they_are() -> None:
    model = tiny_qwen2().to(torch.bfloat16)
    assert prepack_linear_layers(model) == 0
    assert _linears(model) > 0


PROBE = """
from pask_agent.runtime.models.cpu_linear import prepack_linear_layers
from pask_agent.runtime.models.loading import load_model

loaded = load_model("default")
replaced = prepack_linear_layers(loaded.model)
fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
checkpoint = sum(f.stat().st_size for f in loaded.path.glob("*.safetensors"))
kib = [int(fields[k].split()[0]) for k in ("RssAnon", "RssFile", "VmRSS", "VmHWM")]
print(replaced, *kib, checkpoint // 1024)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
@pytest.mark.usefixtures("no_default_model_here")  # the probe loads its own copy
def test_default_model_leaves_its_checkpoint_pages_behind() -> None:
    """On the real default model: every linear layer is converted, and the checkpoint pages the
    conversion read do not stay resident, neither after it (the file mapping is let go) nor
    during it (each weight's pages go once its copy exists), so the process holds the oneDNN
    weights plus the embedding, not the checkpoint on top, at any moment."""
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    replaced, anon_kib, file_kib, rss_kib, peak_kib, checkpoint_kib = (
        int(x) for x in done.stdout.split()
    )
    assert replaced == 24 * 7 + 1  # q, k, v, o, gate, up, down per layer, and the head
    # file-backed pages: the shared libraries (a few hundred MB), not the 2 GB checkpoint
    assert file_kib < checkpoint_kib / 4
    assert anon_kib < 3.2 * 1024 * 1024  # 2.5 GB of oneDNN weights + 0.55 GB embedding
    # the peak: what is held at the end plus about one layer, not plus the checkpoint (5.3 GB
    # at the peak before the pages were dropped as the conversion went)
    assert peak_kib < rss_kib + checkpoint_kib / 8, (peak_kib, rss_kib)
