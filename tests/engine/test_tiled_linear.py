"""The decode tiles (kernels/decode_linear.cpp, linear.FrozenLinear): a linear for the
few rows of a decode step, from weights re-laid out as tiles of 16 output features.

The kernel is checked against float64 over the shapes it meets: feature counts that
leave a partial tile, odd input widths (a bfloat16 tile pairs its inputs), one to
sixteen rows behind any leading dimensions, biases, and int8 weights with scales. Then
``FrozenLinear`` with it: decode-sized calls take the tiles, prefill chunks do not, and
a call the kernel refuses is computed by torch's kernels, never failed.
"""

from __future__ import annotations

import logging

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hearth_engine.model import linear, native
from hearth_engine.model.linear import FrozenLinear, Quantization
from hearth_engine.model.runner import ModelRunner


@pytest.fixture(scope="module")
def kernels() -> object:
    module = native.load()
    assert module is not None, f"the native kernels did not build: {native.error()}"
    return module


# Float32 sums, one rounding to the output dtype.
ROUNDING = {torch.float32: 2**-23, torch.bfloat16: 2**-8}


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    features=st.integers(1, 70),
    width=st.integers(1, 90),
    rows=st.integers(1, linear.TILED_MAX_ROWS),
    dtype=st.sampled_from([torch.bfloat16, torch.float32]),
    int8=st.booleans(),
    biased=st.booleans(),
    lead=st.booleans(),
)
def test_the_tiles_equal_a_float64_linear(
    kernels: object,
    seed: int,
    features: int,
    width: int,
    rows: int,
    dtype: torch.dtype,
    int8: bool,
    biased: bool,
    lead: bool,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=gen).to(dtype)
    if lead:  # [B, 1, K], as a decode step calls it
        x = x[:, None]
    scales = None
    if int8:
        weight = torch.randint(-127, 128, (features, width), generator=gen, dtype=torch.int8)
        scales = (torch.rand(features, generator=gen) / 64).to(dtype)
        exact = weight.double() * scales.double()[:, None]
    else:
        weight = torch.randn(features, width, generator=gen).to(dtype)
        exact = weight.double()
    bias = torch.randn(features, generator=gen).to(dtype) if biased else None
    got = kernels.tiled_linear(x, kernels.tile_weight(weight), features, scales, bias)
    want = x.double() @ exact.T + (0 if bias is None else bias.double())
    assert got.dtype == dtype and got.shape == (*x.shape[:-1], features)
    # One rounding of the result, plus float32 sums of |x w| terms.
    magnitude = x.double().abs() @ exact.abs().T + (0 if bias is None else bias.double().abs())
    bound = want.abs() * ROUNDING[dtype] + magnitude * width * 2**-23 + 1e-30
    assert bool(((got.double() - want).abs() <= bound).all())


@pytest.mark.parametrize("quantization", list(Quantization))
def test_frozen_linear_takes_the_tiles_for_decode_rows_only(
    kernels: object, quantization: Quantization
) -> None:
    """Up to TILED_MAX_ROWS rows go to the tiles (the same values as torch's kernels up to
    the sums' order); a prefill chunk goes to torch's (bit for bit what it gives with
    the kernels paused). int8 weights are tiled as int8."""
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(100, 64, generator=gen).to(torch.bfloat16)
    bias = torch.randn(100, generator=gen).to(torch.bfloat16)
    layer = FrozenLinear(weight, bias, quantization, tiled=True)
    assert layer.tiles is not None
    assert layer.tiles.dtype == (torch.int8 if quantization == Quantization.INT8 else weight.dtype)
    for rows in (1, 4, linear.TILED_MAX_ROWS, linear.TILED_MAX_ROWS + 1, 64):
        x = torch.randn(rows, 1, 64, generator=gen).to(torch.bfloat16)
        fast = layer(x)
        with native.paused():
            slow = layer(x)
        if rows > linear.TILED_MAX_ROWS:
            assert torch.equal(fast, slow)
        else:
            torch.testing.assert_close(fast.float(), slow.float(), atol=0.05, rtol=2**-7)
    assert FrozenLinear(weight, bias, quantization).tiles is None  # not asked for


def test_a_call_the_tiles_refuse_is_computed_by_torch(
    kernels: object, caplog: pytest.LogCaptureFixture
) -> None:
    """Tiles that do not match the layer (here: made for another input width) are
    refused by the kernel; the call still returns torch's result, logged once, and
    torch's kernels serve from then on."""
    weight = torch.randn(32, 64)
    layer = FrozenLinear(weight, None, Quantization.NONE, tiled=True)
    layer.tiles = kernels.tile_weight(torch.randn(32, 48))
    x = torch.randn(2, 64)
    with pytest.raises(RuntimeError, match="tiles must be"):
        kernels.tiled_linear(x, layer.tiles, 32, None, None)
    caplog.set_level(logging.WARNING, logger="hearth_engine.model.native")
    try:
        assert torch.equal(layer(x), torch.nn.functional.linear(x, weight))
        assert native.state() == "failed" and "tiles must be" in (native.error() or "")
        assert torch.equal(layer(x), torch.nn.functional.linear(x, weight))
        assert len([r for r in caplog.records if "disabled" in r.getMessage()]) == 1
    finally:
        native.reset()
        assert native.load() is not None


def test_more_rows_than_the_kernel_takes_are_refused(kernels: object) -> None:
    tiles = kernels.tile_weight(torch.randn(16, 8))
    with pytest.raises(RuntimeError, match="at most 16 rows"):
        kernels.tiled_linear(torch.randn(17, 8), tiles, 16, None, None)
    with pytest.raises(RuntimeError, match="int8 tiles take scales"):
        kernels.tiled_linear(torch.randn(1, 8), kernels.tile_weight(torch.ones(16, 8).char()), 16)


def test_tiles_are_skipped_where_the_copy_would_not_fit(
    kernels: object, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    weights = [torch.empty(64, 64, dtype=torch.bfloat16)]
    assert linear.tiles_fit(weights, torch.device("cpu"))
    assert not linear.tiles_fit([torch.empty(4, 4, dtype=torch.float16)], torch.device("cpu"))
    with native.paused():
        assert not linear.tiles_fit(weights, torch.device("cpu"))
    monkeypatch.setattr(linear, "TILES_RAM_SHARE", 1e-12)
    with caplog.at_level(logging.WARNING, logger="hearth_engine.model.linear"):
        assert not linear.tiles_fit(weights, torch.device("cpu"))
    assert "Decode tiles skipped" in caplog.text


def test_a_loaded_runner_decodes_with_tiles(kernels: object) -> None:
    """The kernels are loaded before the lean forward is built, so its linears get their
    tiles (built the other way round, a runner would decode without them)."""
    runner = ModelRunner.load("tiny", dtype="float32")
    assert runner.lean is not None
    assert all(linear.tiles is not None for linear in runner.lean.linears())
