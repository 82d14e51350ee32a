"""A decode step's layers in one native call (native_step.py, kernels/decode_step.cpp)
give the Python loop's logits bit for bit, and step aside where they cannot run.

Each case runs test_decoder's script (chunked prefill, a decode step, a left-padded
batch step, two rows on a shared prefix, a warm chunk) twice on the same weights: once
with the native layers, once with them off. The one-token steps are the native ones.
"""

from __future__ import annotations

import logging

import pytest
import torch

from hearth_engine.model import native
from hearth_engine.model.attention import PrefixPart
from hearth_engine.model.decoder import LeanDecoder
from hearth_engine.model.kv import KVBuffer
from hearth_engine.model.linear import Quantization

from .test_decoder import build, layout_of, run_script

FORMS = {
    "int4": (torch.float32, Quantization.INT4),
    "int4-bf16": (torch.bfloat16, Quantization.INT4),
    "tiles": (torch.float32, Quantization.NONE),
    "tiles-bf16": (torch.bfloat16, Quantization.NONE),
}


@pytest.fixture(scope="module", autouse=True)
def kernels() -> object:
    module = native.load()
    assert module is not None, f"the native kernels did not build: {native.error()}"
    return module


def lean(family: str, form: str, *, native_layers: bool) -> LeanDecoder:
    dtype, quantization = FORMS[form]
    decoder = LeanDecoder(build(family, dtype), quantization)
    if not native_layers:
        decoder._native = False
    return decoder


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "llama-untied"])
def test_native_layers_give_the_loops_logits_bit_for_bit(family: str, form: str) -> None:
    model_dtype, _ = FORMS[form]
    layout = layout_of(build(family, model_dtype))
    on = lean(family, form, native_layers=True)
    off = lean(family, form, native_layers=False)
    got = run_script(on.forward, layout)
    want = run_script(off.forward, layout)
    assert type(on._native).__name__ == "DecodeLayers"  # it ran, and never stepped aside
    for n, (have, expected) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(have, expected), f"step {n}"


def test_a_model_whose_linears_have_no_native_form_keeps_the_loop() -> None:
    """Built while the kernels were not loaded (a host still building them), its linears
    have no decode tiles: the native layers step aside for good, and the loop serves."""
    with native.paused():
        decoder = lean("llama", "tiles", native_layers=True)
    assert decoder.layers[0].qkv.tiles is None
    layout = layout_of(build("llama"))
    got = run_script(decoder.forward, layout)
    assert decoder._native is False
    want = run_script(lean("llama", "tiles", native_layers=False).forward, layout)
    for have, expected in zip(got, want, strict=True):
        assert torch.allclose(have, expected, rtol=1e-4, atol=1e-4)


def test_a_refused_step_falls_back_to_the_loop_with_the_same_result(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A prefix segment with a layer more than the model: the loop reads the model's
    layers of it, the native layers refuse it (and stay off); the step is still right,
    its KV column written once more by the loop."""
    layout = layout_of(build("llama"))
    gen = torch.Generator().manual_seed(3)
    segment = torch.randn(layout.layers + 1, 2, layout.kv_heads, 12, layout.head_dim, generator=gen)
    step = torch.tensor([[5]])

    def run(decoder: LeanDecoder) -> tuple[torch.Tensor, torch.Tensor]:
        cache = KVBuffer(layout, 1, 8)
        with torch.inference_mode():
            logits = decoder.forward(
                step, torch.tensor([[12]]), cache, None, (PrefixPart(segment),)
            )
        assert cache.length == 1
        return logits, cache.data[:, :, :, :, :1].clone()

    decoder = lean("llama", "int4", native_layers=True)
    with caplog.at_level(logging.WARNING, logger="hearth_engine.model.decoder"):
        logits, kv = run(decoder)
    assert decoder._native is False
    assert "Native decode layers off" in caplog.text
    want_logits, want_kv = run(lean("llama", "int4", native_layers=False))
    assert torch.equal(logits, want_logits)
    assert torch.equal(kv, want_kv)
