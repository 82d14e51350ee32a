"""The lean forward (decoder.py) computes what transformers' forward computes.

Each family it claims (Llama, Qwen2 with q/k/v biases, Qwen3 with q/k norms) is built
with random weights in a small shape and run both ways over the same KV buffers: a
prefill in two chunks, a decode step, a padded batch step and a step that reads a
shared prefix in place. In float32 the two agree to rounding; the fused and packed
matrices change summation order at most.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from hearth_engine.model import attention
from hearth_engine.model.attention import PARTS_KWARG, PrefixPart
from hearth_engine.model.decoder import LeanDecoder, UnsupportedModelError, unsupported_reason
from hearth_engine.model.kv import KVBuffer, KVLayout
from hearth_engine.model.linear import FrozenLinear, Quantization, quantize_int8
from hearth_engine.model.quant import linear as quant_linear
from hearth_engine.model.runner import ModelRunner
from hearth_engine.serving.engine import Engine
from hearth_engine.serving.sampling import SamplingParams

from .conftest import free_port, run_serve

SHAPE = {
    "vocab_size": 300,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
}
FAMILIES = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, {"head_dim": 16}),
    "llama-untied": (LlamaConfig, LlamaForCausalLM, {"tie_word_embeddings": False}),
}


def build(family: str, dtype: torch.dtype = torch.float32) -> Any:
    config_cls, model_cls, extra = FAMILIES[family]
    torch.manual_seed(0)
    config = config_cls(**SHAPE, **extra, attn_implementation=attention.register())
    model = model_cls(config).eval().to(dtype)
    with torch.no_grad():  # transformers initialises biases and norms to 0 and 1
        for name, param in model.named_parameters():
            if name.endswith(("bias", "norm.weight", "layernorm.weight")):
                param.normal_(0, 0.5 if name.endswith("bias") else 0.2).add_(
                    0 if name.endswith("bias") else 1
                )
    return model


def layout_of(model: Any) -> KVLayout:
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // (
        config.num_attention_heads
    )
    return KVLayout(
        config.num_hidden_layers,
        config.num_key_value_heads,
        head_dim,
        model.dtype,
        torch.device("cpu"),
    )


class Reference:
    """transformers' forward over a KVBuffer, as the runner called it before."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        cache: KVBuffer,
        mask: torch.Tensor | None,
        parts: tuple[PrefixPart, ...] = (),
    ) -> torch.Tensor:
        kwargs: dict[str, Any] = {"cache": cache}
        if parts:
            kwargs[PARTS_KWARG] = parts
        with torch.inference_mode():
            out = self.model(
                input_ids=ids,
                position_ids=positions,
                attention_mask=mask,
                use_cache=True,
                logits_to_keep=1,
                **kwargs,
            )
        return out.logits[:, -1].float()


def run_script(forward: Any, layout: KVLayout) -> list[torch.Tensor]:
    """Prefill 40 tokens in chunks of 25 + 15, decode, then batch steps."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 300, (1, 41), generator=gen)
    outs = []
    own = KVBuffer(layout, 1, 64)
    with torch.inference_mode():
        outs.append(forward(ids[:, :25], torch.arange(25)[None], own, None))
        outs.append(forward(ids[:, 25:40], torch.arange(25, 40)[None], own, None))
        outs.append(forward(ids[:, 40:41], torch.tensor([[40]]), own, None))
        # A left-padded batch of two: row 0 holds 41 tokens, row 1 the last 20 of them.
        batch = KVBuffer(layout, 2, 64, length=41)
        batch.data[:, :, 0, :, :41] = own.data[:, :, 0, :, :41]
        batch.data[:, :, 1, :, 21:41] = own.data[:, :, 0, :, 21:41]
        batch.data[:, :, 1, :, :21] = 0
        mask = torch.ones(2, 42, dtype=torch.bool)
        mask[1, :21] = False
        step = torch.tensor([[7], [9]])
        outs.append(forward(step, torch.tensor([[41], [20]]), batch, mask))
        # Two rows that read the first 30 tokens in place and own 10 more each.
        segment = own.read_segment(0, 0, 30)
        shared = KVBuffer(layout, 2, 16, length=10)
        shared.data[:, :, 0, :, :10] = own.data[:, :, 0, :, 30:40]
        shared.data[:, :, 1, :, :10] = own.data[:, :, 0, :, 30:40]
        outs.append(forward(step, torch.tensor([[40], [40]]), shared, None, (PrefixPart(segment),)))
        # A prefill chunk after a shared prefix (a warm request's suffix).
        warm = KVBuffer(layout, 1, 16)
        part = (PrefixPart(segment),)
        outs.append(forward(ids[:, 30:38], torch.arange(30, 38)[None], warm, None, part))
    return outs


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_lean_forward_matches_transformers(family: str) -> None:
    model = build(family)
    layout = layout_of(model)
    expected = run_script(Reference(copy.deepcopy(model)).forward, layout)
    lean = LeanDecoder(model)
    got = run_script(lean.forward, layout)
    for n, (want, have) in enumerate(zip(expected, got, strict=True)):
        torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-5, msg=f"step {n}")


def test_bfloat16_stays_close_to_float32() -> None:
    """In bfloat16 (packed linears where the CPU has native bf16) the logits stay within
    bf16 rounding of the float32 forward, and the greedy token mostly agrees."""
    reference = run_script(Reference(build("qwen2")).forward, layout_of(build("qwen2")))
    model = build("qwen2", torch.bfloat16)
    got = run_script(LeanDecoder(model).forward, layout_of(model))
    for want, have in zip(reference, got, strict=True):
        scale = want.abs().max()
        assert (have - want).abs().max() < 0.05 * scale


def test_int8_weights_stay_close() -> None:
    model = build("llama", torch.bfloat16)
    layout = layout_of(model)
    reference = run_script(Reference(copy.deepcopy(model)).forward, layout)
    lean = LeanDecoder(model, Quantization.INT8)
    assert {layer.qkv.kind for layer in lean.layers} == {"int8"}  # K = 64
    assert {layer.down.kind for layer in lean.layers} != {"int8"}  # K = 96: kept
    got = run_script(lean.forward, layout)
    for want, have in zip(reference, got, strict=True):
        assert (have - want).abs().max() < 0.05 * want.abs().max()


def test_the_originals_are_released_but_the_embedding_stays() -> None:
    model = build("llama")
    embed = model.model.embed_tokens.weight.clone()
    LeanDecoder(model)
    assert model.model.layers[0].self_attn.q_proj.weight.numel() == 0
    assert model.model.layers[1].mlp.down_proj.weight.numel() == 0
    assert torch.equal(model.model.embed_tokens.weight, embed)


def test_int8_quantization_round_trips_within_half_a_step() -> None:
    weight = torch.randn(48, 32) * torch.linspace(0.01, 3, 48)[:, None]
    q, scales = quantize_int8(weight)
    assert q.dtype == torch.int8 and int(q.abs().max()) <= 127
    error = (q.float() * scales[:, None] - weight).abs()
    assert bool((error <= scales[:, None] / 2 + 1e-6).all())
    weight = torch.randn(48, 64) * torch.linspace(0.01, 3, 48)[:, None]
    linear = FrozenLinear(weight.to(torch.bfloat16), None, Quantization.INT8)
    assert linear.kind == "int8"
    for rows in (3, 40):  # the int8 kernel (decode), and expanded weights (prefill)
        x = torch.randn(rows, 64, dtype=torch.bfloat16)
        want = x.float() @ weight.T
        assert (linear(x).float() - want).abs().max() < 0.05 * want.abs().max()


def test_int8_keeps_layers_its_kernel_cannot_multiply() -> None:
    """The int8 kernel needs the input width in multiples of 64; a 72-wide layer stays
    unquantized (torch 2.13 returned NaN or sums off by 10^4 for it)."""
    weight = torch.randn(120, 72, dtype=torch.bfloat16)
    x = torch.randn(3, 72, dtype=torch.bfloat16)
    linear = FrozenLinear(weight, None, Quantization.INT8)
    assert linear.kind != "int8"
    want = x.float() @ weight.float().T
    assert (linear(x).float() - want).abs().max() < 0.02 * want.abs().max()
    assert FrozenLinear(torch.randn(120, 128, dtype=torch.bfloat16), None, "int8").kind == "int8"


def test_unsupported_models_are_named() -> None:
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    assert "gpt2" in (unsupported_reason(gpt2) or "")
    with pytest.raises(UnsupportedModelError, match="gpt2"):
        LeanDecoder(gpt2)
    gelu = LlamaForCausalLM(LlamaConfig(**{**SHAPE, "hidden_act": "gelu"}))
    assert "activation" in (unsupported_reason(gelu) or "")


# ---------------------------------------------------------------- in the engine


@pytest.fixture(scope="module")
def tiny_runner_int8() -> ModelRunner:
    return ModelRunner.load("tiny", dtype="bfloat16", quantize="int8")


async def test_a_pin_made_without_int8_is_never_served_to_int8(
    make_engine: Callable[..., Engine],
    tiny_runner_bf16: ModelRunner,
    tiny_runner_int8: ModelRunner,
    tmp_path: Path,
) -> None:
    """The prefix store is keyed by quantization: same model and dtype, other weights."""
    assert tiny_runner_int8.info.namespace != tiny_runner_bf16.info.namespace
    house = list(range(20, 320))
    plain = make_engine(tiny_runner_bf16, prefix_store=tmp_path)
    await plain.pin("house", house)
    await plain.shutdown()
    quantized = make_engine(tiny_runner_int8, prefix_store=tmp_path)
    assert quantized.pin_status("house") is None  # nothing restored across quantizations
    _, _, fin = await quantized.generate([*house, 7], SamplingParams(max_tokens=2))
    assert fin.stats.cached_tokens == 0
    again = make_engine(tiny_runner_bf16, prefix_store=tmp_path)
    assert again.pin_status("house")["restored"] is True  # its own namespace still there


def test_a_packed_models_prefill_path_keys_its_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Packed linears meet prefill rows as int8 rows or dequantized: the two prefills'
    KV differ (slightly), so their pins never mix, in memory or in the prefix store;
    the dense path keeps the namespace packed models always had."""
    tokens = list(range(20, 120))  # prefill-sized: more rows than a decode step's
    runs = {}
    for path in ("integer", "dense"):
        monkeypatch.setenv(quant_linear.PREFILL_SWITCH, path)
        runner = ModelRunner.load("tiny", dtype="float32", quantize="int4")
        logits = runner.prefill(runner.new_buffer(1, len(tokens)), tokens)
        runs[path] = (runner.info, logits)
    (integer, int_logits), (dense, dense_logits) = runs["integer"], runs["dense"]
    assert (integer.quant_prefill, dense.quant_prefill) == ("integer", "dense")
    assert dense.namespace == f"{dense.fingerprint}:float32:int4"
    assert integer.namespace == f"{dense.namespace}:int8-prefill"
    assert not torch.equal(int_logits, dense_logits)  # the switch took effect
    assert torch.allclose(int_logits, dense_logits, atol=0.2 * float(dense_logits.abs().max()))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--quantize", "int8", "--dtype", "float32"), "--quantize int8: int8 weights compute"),
        (
            ("--quantize", "int8", "--dtype", "bfloat16", "--forward", "transformers"),
            "--quantize int8 needs --forward",
        ),
    ],
)
def test_unsupported_combinations_are_one_line_at_start(
    args: tuple[str, ...], message: str
) -> None:
    result = run_serve("--model", "tiny", "--port", str(free_port()), *args)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith(f"error: {message}"), result.stderr
    assert "Traceback" not in result.stderr
