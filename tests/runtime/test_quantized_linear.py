"""Quantized weights: each layer computes with the weights it claims to hold, a model converted
to them answers within a stated tolerance of its fp32 self (tiny model and SmolLM2), the default
model's process holds the codes and not the checkpoint, and bad settings fail before loading."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_models import tiny_qwen2
from torch import nn

from pask_agent.errors import ConfigError
from pask_agent.runtime.config import RuntimeConfig
from pask_agent.runtime.models.cpu_linear import step_weight_bytes
from pask_agent.runtime.models.loading import LoadedModel, load_model
from pask_agent.runtime.models.quantized_linear import (
    INT4_GROUP,
    Int4Linear,
    Int8Linear,
    QuantizedLinear,
    check_weight_format,
    quantize_linear_layers,
)
from pask_agent.runtime.models.seam import stock_attention


def _linear(n: int = 48, k: int = 96, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    layer = nn.Linear(k, n)
    with torch.no_grad():
        layer.weight[3, 5] = 4.0  # an outlier: its channel's (or group's) scale is wider
    return layer


@pytest.mark.parametrize("kind", [Int8Linear, Int4Linear])
def test_layer_computes_with_the_weight_it_holds(kind: type[QuantizedLinear]) -> None:
    dense = _linear()
    q = kind(dense)
    x = torch.randn(5, dense.in_features, generator=torch.Generator().manual_seed(1))
    held = q.weight  # dequantized from the codes
    # the held weight is the dense one, within half a quantization step per element
    w = dense.weight.detach()
    if kind is Int8Linear:
        size = w.abs().amax(dim=1, keepdim=True)
        step = size / 127
    else:
        g = w.reshape(w.shape[0], -1, INT4_GROUP)
        size = g.abs().amax(-1).repeat_interleave(INT4_GROUP, dim=1)
        step = ((g.amax(-1) - g.amin(-1)) / 15).repeat_interleave(INT4_GROUP, dim=1)
    # bf16 scales, zeros and outputs add a few 2**-9 of the channel's (group's) size
    bound = step / 2 + size * 2**-6
    assert ((held - w).abs() <= bound).all()
    # and the forward pass is x @ held.T + bias, up to bf16 activations and outputs
    want = x @ held.T + dense.bias.detach()
    torch.testing.assert_close(q(x), want, rtol=2e-2, atol=2e-2)
    assert q(x).dtype == torch.float32
    assert q(x.reshape(5, 1, -1)).shape == (5, 1, dense.out_features)


def test_int8_is_closer_to_the_dense_weight_than_int4() -> None:
    dense = _linear(seed=2)
    err8 = (Int8Linear(dense).weight - dense.weight).abs().mean()
    err4 = (Int4Linear(dense).weight - dense.weight).abs().mean()
    assert err8 < err4 / 4


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_tiny_model_converts_every_layer_and_stays_close(weights: str) -> None:
    dense = tiny_qwen2()
    model = copy.deepcopy(dense)
    n_linear = sum(type(m) is nn.Linear for m in dense.modules())
    fp32_bytes = step_weight_bytes(dense)
    assert quantize_linear_layers(model, weights) == n_linear
    assert not any(type(m) is nn.Linear for m in model.modules())
    # a step reads the codes and scales: about a quarter (int8) or an eighth (int4) of fp32
    assert step_weight_bytes(model) < fp32_bytes * (0.45 if weights == "int8" else 0.35)
    ids = torch.randint(0, 512, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        want, got = dense(ids).logits, model(ids).logits
    tolerance = 0.05 if weights == "int8" else 0.25  # of the logits' spread, per element
    assert (got - want).abs().mean() < tolerance * want.std()
    # the tied embedding is still read as it was: only the head's copy is quantized
    assert model.get_input_embeddings().weight.dtype == torch.float32
    assert quantize_linear_layers(model, weights) == 0  # nothing left to convert


def test_fp32_converts_nothing_and_int4_skips_shapes_its_kernel_cannot_pack() -> None:
    model = tiny_qwen2()
    assert quantize_linear_layers(model, "fp32") == 0
    odd = nn.Sequential(nn.Linear(40, 16), nn.Linear(64, 16))  # 40 inputs: not whole groups
    assert quantize_linear_layers(odd, "int4") == 1
    assert type(odd[0]) is nn.Linear and isinstance(odd[1], Int4Linear)


def test_bad_weight_settings_fail_before_any_model_loads() -> None:
    with pytest.raises(ConfigError, match="fp32, int8, int4"):
        check_weight_format("int3")
    with pytest.raises(ConfigError, match="weights="):
        RuntimeConfig(weights="q4_0")
    with pytest.raises(ConfigError, match="fp32, int8, int4"):
        load_model("no-such-model", weights="int2")  # the format, before the name's lookup


def test_runtime_refuses_a_model_loaded_with_other_weights() -> None:
    from pask_agent.runtime.engine import Engine
    from pask_agent.runtime.models.loading import load_tokenizer

    loaded = LoadedModel("tiny-qwen2", Path("."), tiny_qwen2(151936), load_tokenizer("default"))
    with pytest.raises(ConfigError, match=r"load_model\(\.\.\., weights='int8'\)"):
        Engine(loaded, RuntimeConfig(weights="int8"))
    int8 = LoadedModel("tiny-int8", Path("."), tiny_qwen2(151936), loaded.tokenizer, "int8")
    quantize_linear_layers(int8.model, "int8")
    assert Engine(int8, RuntimeConfig()).config.weights is None  # None: as it was loaded
    with pytest.raises(ConfigError, match="loaded with weights='int8'"):
        Engine(int8, RuntimeConfig(weights="fp32"))


def test_smollm2_int8_and_int4_against_fp32(smollm2: LoadedModel) -> None:
    """On a real bundled model: the logits of a chat prompt stay within a stated tolerance
    of fp32 (mean |diff| under 5 % of the logits' spread for int8, 7.5 % for int4; measured
    3.8 % and 5.2 %, most of it the bf16 activations), and the process keeps one copy per
    weight format (a second load returns the first)."""
    tok = smollm2.tokenizer
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Give the weather in Lisbon as JSON with city and unit."}],
        add_generation_prompt=True,
        tokenize=False,
    )
    ids = torch.tensor([tok.encode(text)])
    # a runtime may have opened these models already (attention through its KV store)
    with torch.inference_mode(), stock_attention(smollm2.model):
        want = smollm2.model(ids).logits[0]
    for weights, bound in (("int8", 0.05), ("int4", 0.075)):
        loaded = load_model("smollm2-135m", weights=weights)
        assert loaded.weights == weights and loaded.model is not smollm2.model
        assert load_model("smollm2-135m", weights=weights).model is loaded.model
        with torch.inference_mode(), stock_attention(loaded.model):
            got = loaded.model(ids).logits[0]
        diff = ((got - want).abs().mean() / want.std()).item()
        assert diff < bound, (weights, diff)
        top1 = (got.argmax(-1) == want.argmax(-1)).float().mean().item()  # 0.93 and 0.86
        assert top1 > (0.85 if weights == "int8" else 0.75), (weights, top1)


PROBE = """
from pask_agent.runtime.models.loading import load_model

loaded = load_model("default", weights="int8")
fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
checkpoint = sum(f.stat().st_size for f in loaded.path.glob("*.safetensors"))
kib = [int(fields[k].split()[0]) for k in ("RssAnon", "RssFile")]
print(*kib, checkpoint // 1024)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
@pytest.mark.usefixtures("no_default_model_here")  # the probe loads its own copy
def test_default_model_int8_holds_codes_not_the_checkpoint() -> None:
    """The default model loaded with int8 weights holds its codes (0.49 GB) and the fp32
    embedding (0.55 GB), not the 2.5 GB checkpoint: about a third of the fp32 process."""
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    anon_kib, file_kib, checkpoint_kib = (int(x) for x in done.stdout.split())
    assert file_kib < checkpoint_kib / 4
    assert anon_kib < 1.6 * 1024 * 1024, anon_kib


def test_integrations_carry_the_weight_format() -> None:
    """A LangChain model names its weights; the shared registry keeps one runtime host per
    (model, weights), so an int8 model never serves through an fp32 host; a bad format
    fails when the object is made, before any model loads."""
    from pydantic import ValidationError

    from pask_agent import PaskChatModel
    from pask_agent.integrations._portal import RuntimeRegistry
    from pask_agent.runtime.models.weight_formats import weight_formats

    assert PaskChatModel(weights="int8").weights == "int8"
    with pytest.raises((ConfigError, ValidationError), match="fp32, int8, int4"):
        PaskChatModel(weights="q4_0")
    registry = RuntimeRegistry()
    plain, int8 = registry.host("smollm2-135m"), registry.host("smollm2-135m", "int8")
    assert plain is not int8 and (plain.weights, int8.weights) == ("fp32", "int8")
    assert registry.host("smollm2-135m", "int8") is int8
    with pytest.raises(ConfigError, match="fp32, int8, int4"):
        registry.host("smollm2-135m", "int2")
    assert weight_formats("fp32, int8") == ["fp32", "int8"]
    with pytest.raises(ConfigError, match="names no format"):
        weight_formats(" , ")


def test_bench_refuses_weight_lists_it_cannot_run(capsys: pytest.CaptureFixture[str]) -> None:
    """``pask-agent bench``: a bad format, or several without ``--peer``, is a typed error
    (exit 2) before any model loads."""
    from pask_agent.cli import main

    assert main(["bench", "--weights", "int3", "--policies", "full"]) == 2
    assert "fp32, int8, int4" in capsys.readouterr().err
    assert main(["bench", "--weights", "fp32,int8", "--policies", "full"]) == 2
    assert "one format at a time without --peer" in capsys.readouterr().err
