"""Quantized linears (kernels/quant_linear.cpp, model/quant/): weights that stay 4-, 6-
or 8-bit, held to a dequantized reference.

For every GGUF block type Hearth keeps packed (``ggml_blocks.BLOCK_TYPES``): the file's
bytes become codes and scales whose dequantized matrix equals gguf-py's own dequantizer
(exactly where the scale is a float16 of the file; within float16 rounding where it is
a product); then the kernel over that form, at odd widths with a partial last group,
batch 1 and 16:

* float32 rows, ``exact``: the float path, to float32 rounding of the reference;
* bfloat16 and float32 rows: the integer path (AVX-512 VNNI, AVX2 or generic, whichever
  this host built) equals ``tiles.emulate`` (its activation rounding written in torch)
  to one bfloat16 rounding (float32: float32 sums), and stays within the measured bound
  of the float reference;
* prefill-sized calls take the integer path where no AMX tiles are (each row's result
  the one it gets alone, bit for bit), or dequantize and run one GEMM (``dense``), equal
  to the reference; the embedding's row lookup equals the reference.

A corrupt or truncated tensor is refused in one line.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, dequantize

from hearth_engine.model import native
from hearth_engine.model.quant import linear as quant_linear
from hearth_engine.model.quant import tiles
from hearth_engine.model.quant.ggml_blocks import BLOCK_TYPES, BlockError, to_quant_weight
from hearth_engine.model.quant.linear import (
    QuantEmbedding,
    QuantLinear,
    dense_padded,
    exact_float_rows,
    quantize_int4,
    quantize_int8_groups,
    reference,
)

# Byte offsets of each block type's float16 scale fields (random bytes elsewhere).
SCALE_FIELDS = {
    "Q4_0": [0],
    "Q4_1": [0, 2],
    "Q4_K": [0, 2],
    "Q5_0": [0],
    "Q5_1": [0, 2],
    "Q5_K": [0, 2],
    "Q6_K": [208],
    "Q8_0": [0],
}
# The integer path's error against the float reference, relative to the largest output,
# for rows of 64 inputs and more: int8 activations per group (llama.cpp's q8 scheme) and
# one bfloat16 rounding. Measured at most 0.9%; a wrong code or scale costs tens of
# percent. (Each output is also held to its own analytic bound.)
INT_PATH_BOUND = 0.02


@pytest.fixture(scope="module")
def kernels() -> object:
    module = native.load()
    assert module is not None, f"the native kernels did not build: {native.error()}"
    return module


def random_blocks(type_name: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """A tensor of random blocks whose scales are small positive float16 numbers."""
    rng = np.random.default_rng(seed)
    block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    raw = rng.integers(0, 256, (rows * cols // block, nbytes), dtype=np.uint8)
    for offset in SCALE_FIELDS[type_name]:
        scale = (rng.random((len(raw), 1)) * 0.01 + 0.001).astype(np.float16)
        raw[:, offset : offset + 2] = scale.view(np.uint8)
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("type_name", sorted(BLOCK_TYPES))
def test_blocks_map_onto_the_files_own_values(type_name: str) -> None:
    raw = random_blocks(type_name, 6, 512, seed=1)
    expected = dequantize(raw, GGMLQuantizationType[type_name]).reshape(6, 512)
    ours = tiles.dequantize(to_quant_weight(raw, type_name, 6, 512)).numpy()
    error = np.abs(ours - expected).max() / np.abs(expected).max()
    # Exact where the file's scale is a float16, or a product kept in two levels (Q4_K,
    # Q6_K); else the product rounds once.
    exact = ("Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K")
    assert error <= (0.0 if type_name in exact else 2**-10)


def _forms(seed: int, n: int, k: int) -> list[tiles.QuantWeight]:
    """Each form at ``n x k``: int4 with zeros, int8 with and without, int6 with and
    without, group 16 and 32; two-level int4 with zeros and int6 without (int8 factors of
    float16 super-scales, a partial last super-block where the groups are not whole)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    int8 = quantize_int8_groups(w)
    zeros = torch.randn(n, -(-k // 16), generator=g) * 0.01
    codes = torch.randint(-128, 128, (n, k), generator=g)
    scales = torch.rand(n, -(-k // 16), generator=g) * 0.002
    six = torch.randint(-32, 32, (n, k), generator=g)
    return [
        quantize_int4(w),
        int8,
        tiles.pack(codes, scales, zeros, 16, 8),
        tiles.pack(six, scales * 4, zeros, 16, 6),
        tiles.pack(six, torch.rand(n, -(-k // 32), generator=g) * 0.008, None, 32, 6),
        _two_level(g, n, k, 4, 32, zeros=True),
        _two_level(g, n, k, 6, 16, zeros=False),
    ]


def _two_level(
    g: torch.Generator, n: int, k: int, bits: int, group: int, zeros: bool
) -> tiles.QuantWeight:
    """Random codes, int8 factors (Q4_K's 0..63 and -63..0; Q6_K's signed ones) and
    float16 super-scales over 4 groups each."""
    groups, per = -(-k // group), 4
    tops = -(-groups // per)
    low, high = (0, 16) if bits == 4 else (-32, 32)
    q = torch.randint(low, high, (n, k), generator=g)
    factors = torch.randint(0 if zeros else -128, 64 if zeros else 128, (n, groups), generator=g)
    d = torch.rand(n, tops, generator=g) * 1e-4
    if not zeros:
        return tiles.pack(q, factors, None, group, bits, supers=(d, None), per_super=per)
    mins = -torch.randint(0, 64, (n, groups), generator=g)
    dmin = torch.rand(n, tops, generator=g) * 1e-4
    return tiles.pack(q, factors, mins, group, bits, supers=(d, dmin), per_super=per)


@pytest.fixture
def integer_prefill(monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefill rows on the integer path, on any host (an AMX host's bf16 goes dense)."""
    monkeypatch.setenv(quant_linear.PREFILL_SWITCH, "integer")


@pytest.mark.parametrize(("n", "k"), [(33, 100), (16, 64), (70, 1000), (5, 8)])
@pytest.mark.parametrize("rows", [1, 16, 37])  # 37: a prefill chunk's rows, not decode's
@pytest.mark.usefixtures("integer_prefill")
def test_integer_rows_equal_the_dequantized_reference(
    kernels: object, n: int, k: int, rows: int
) -> None:
    torch.manual_seed(n * k + rows)
    for w in _forms(n * k + rows, n, k):
        assert tiles.codes(w).shape == (n, k)
        ref = tiles.dequantize(w)
        x = torch.randn(rows, k)
        exact = QuantLinear([w], None, exact=True)(x)
        assert (exact - x @ ref.T).abs().max() <= 1e-5 * max(1.0, float((x @ ref.T).abs().max()))
        integer = QuantLinear([w], None)(x)
        emulated32 = tiles.emulate(w, x)
        tolerance = 1e-5 * max(1.0, float(emulated32.abs().max()))
        _, scales32, _ = tiles.quantize_activations(x, w.group)
        tie = 2 * float(scales32.max()) * float(ref.abs().max())  # a tie rounded the other way
        assert ((integer - emulated32).abs() <= tolerance + tie).all()
        assert (integer - emulated32).abs().mean() <= tolerance + tie / 100
        xb = x.bfloat16()
        out = QuantLinear([w], None)(xb).float()
        emulated = tiles.emulate(w, xb)
        # One bfloat16 rounding of the output, float32 sums over the groups, and an input
        # rounded to the neighbouring step now and then (ties; 0.2% of outputs).
        _, x_scales, _ = tiles.quantize_activations(xb, w.group)
        step = 2 * float(x_scales.max()) * float(ref.abs().max())
        slack = 2**-8 * emulated.abs() + 1e-4 * float(emulated.abs().max()) + step
        assert ((out - emulated).abs() <= slack).all()
        assert (out - emulated).abs().mean() <= 2**-7 * emulated.abs().mean()
        float_ref = xb.float() @ ref.T
        # Each input moves by at most half its group's step: the error is bounded by
        # |W| times those half steps, plus the output's bfloat16 rounding.
        half_steps = x_scales.repeat_interleave(w.group, dim=1)[:, :k] / 2
        bound = half_steps @ ref.abs().T + 2**-8 * (float_ref.abs() + out.abs()) + 1e-5
        assert ((out - float_ref).abs() <= bound).all()
        assert (out - float_ref).abs().max() <= INT_PATH_BOUND * float_ref.abs().max() or k < 64


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.usefixtures("integer_prefill")
def test_a_prefill_chunk_gets_what_each_row_gets_alone(kernels: object, dtype: torch.dtype) -> None:
    """A prefill chunk's rows through the integer path: each row's output is the one a
    decode step of that row alone gets (rows share a tile's read, never its sums: the
    same int8 rows and exact integer dots, up to where the compiler fused a multiply and
    an add for one block size and not another, a float32 rounding), for every form,
    with a bias, over two parts; and the rows are quantized on the threads when there
    are many, with the same result."""
    g = torch.Generator().manual_seed(5)
    for w in _forms(7, 40, 200):
        other = quantize_int4(torch.randn(24, 200, generator=g))
        bias = torch.randn(64, generator=g).to(dtype)
        linear = QuantLinear([w, other], bias)
        for rows in (37, 700):  # 700 x 200 inputs: quantized over the threads
            x = torch.randn(rows, 200, generator=g).to(dtype)
            chunk = linear(x)
            alone = torch.cat([linear(x[i : i + 1]) for i in range(0, rows, 97)])
            rounding = (2**-7 if dtype == torch.bfloat16 else 2**-16) * alone.abs().float()
            assert ((chunk[::97] - alone).abs().float() <= rounding + 1e-6).all()


def test_the_prefill_path_follows_the_cpu_and_the_switch(
    kernels: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Integer with VNNI's or AVX2's dot products, but dense for bfloat16 rows on AMX
    tiles; dense with any other dots; the switch wins. The build says which dots it
    has; a model with no packed linear has no path."""
    assert kernels.quant_dots() in {"avx512_vnni", "avx2", "arm_dotprod", "generic"}  # type: ignore[attr-defined]
    monkeypatch.delenv(quant_linear.PREFILL_SWITCH, raising=False)
    for dots in ("avx512_vnni", "avx2", "arm_dotprod", "generic", "none"):
        monkeypatch.setattr(quant_linear, "_dots", lambda dots=dots: dots)
        for amx in (False, True):
            monkeypatch.setattr(quant_linear, "cpu_has_amx_bf16", lambda amx=amx: amx)
            path = "integer" if dots in {"avx512_vnni", "avx2"} else "dense"
            assert quant_linear.prefill_path(torch.float32) == path
            assert quant_linear.prefill_path(torch.bfloat16) == ("dense" if amx else path)
    packed = QuantLinear([quantize_int4(torch.randn(16, 64))], None)
    assert quant_linear.model_prefill_path([packed, torch.nn.Linear(2, 2)], torch.float32)
    assert quant_linear.model_prefill_path([torch.nn.Linear(2, 2)], torch.float32) == ""
    for chosen in ("dense", "integer"):
        monkeypatch.setenv(quant_linear.PREFILL_SWITCH, chosen)
        assert quant_linear.prefill_path(torch.float32) == chosen


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_rows_and_embedding_rows_equal_the_reference(
    kernels: object, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(quant_linear.PREFILL_SWITCH, "dense")
    w = tiles.pack(
        torch.randint(0, 16, (40, 72)), torch.rand(40, 3) * 0.01, torch.randn(40, 3) * 0.01, 32, 4
    )
    ref = tiles.dequantize(w)
    x = torch.randn(3, 20, 72).to(dtype)  # 60 rows: one dequantized GEMM
    bias = torch.randn(40).to(dtype)
    out = QuantLinear([w], bias)(x)
    expected = torch.nn.functional.linear(x, ref.to(dtype), bias)
    assert torch.allclose(out.float(), expected.float(), rtol=1e-2, atol=1e-2)
    ids = torch.tensor([[0, 39, 7], [16, 15, 3]])
    assert torch.equal(QuantEmbedding(w, dtype)(ids), ref.to(dtype)[ids])


@pytest.mark.parametrize(
    ("bits", "group", "zeros"),
    [(4, 32, True), (4, 32, False), (8, 32, False), (8, 16, True), (6, 16, False), (6, 32, True)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_prefill_matrix_is_the_reference_exactly(
    kernels: object, bits: int, group: int, zeros: bool, dtype: torch.dtype
) -> None:
    """``dense_padded`` (the native tile dequantizer): odd widths, a partial last tile and
    group, with and without zeros; equal to the reference bit for bit, padding included
    (padded rows have zero scales; padded inputs meet zero-padded activations)."""
    n, k = 40, 72
    groups = -(-k // group)
    low, high = {4: (0, 16), 6: (-32, 32), 8: (-127, 128)}[bits]
    w = tiles.pack(
        torch.randint(low, high, (n, k)),
        torch.rand(n, groups) * 0.01,
        torch.randn(n, groups) * 0.01 if zeros else None,
        group,
        bits,
    )
    out = dense_padded(w, dtype)
    assert out.shape == (48, groups * group) and out.dtype == dtype
    assert torch.equal(out[:n, :k], tiles.dequantize(w).to(dtype))
    assert not out[n:].any()


@pytest.mark.parametrize(("bits", "group", "zeros"), [(4, 32, True), (6, 16, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_two_level_forms_dequantize_join_and_reorder_exactly(
    kernels: object, bits: int, group: int, zeros: bool, dtype: torch.dtype
) -> None:
    """The two-level form (Q4_K's, Q6_K's) through the prefill dequantizer and the row
    lookup: the reference bit for bit; two parts join into one kernel call with the
    same result; a row permutation (the q/k unpermute of a GGUF file) keeps the form."""
    g = torch.Generator().manual_seed(bits)
    n, k = 48, 200  # a partial last group and super-block
    w = _two_level(g, n, k, bits, group, zeros)
    assert w.kind == f"int{bits}-g{group}/{group * 4}" and w.scales.dtype == torch.int8
    ref = tiles.dequantize(w)
    assert torch.equal(dense_padded(w, dtype)[:n, :k], ref.to(dtype))
    ids = torch.tensor([0, 47, 16, 5])
    assert torch.equal(QuantEmbedding(w, dtype)(ids), ref.to(dtype)[ids])
    other = _two_level(g, 32, k, bits, group, zeros)
    joined = QuantLinear([w, other], None)
    assert len(joined.parts) == 1
    x = torch.randn(2, k)
    apart = torch.cat([QuantLinear([w], None)(x), QuantLinear([other], None)(x)], dim=-1)
    assert torch.equal(joined(x), apart)
    order = torch.randperm(n, generator=g)
    moved = tiles.select_rows(w, order)
    assert moved.kind == w.kind and torch.equal(tiles.dequantize(moved), ref[order])


def test_prefill_runs_in_and_out_of_inference_mode(
    kernels: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine runs the model under ``torch.inference_mode``, benches and tests may
    not: the dense prefill's reused scratch must serve both, in either order, on one
    thread."""
    monkeypatch.setenv(quant_linear.PREFILL_SWITCH, "dense")
    w = quantize_int4(torch.randn(32, 64))
    x = torch.randn(40, 64)
    ref = x @ tiles.dequantize(w).T
    with torch.inference_mode():
        inside = QuantLinear([w], None)(x)
    outside = QuantLinear([w], None)(x)
    with torch.inference_mode():
        again = QuantLinear([w], None)(x)
    for out in (inside, outside, again):
        assert torch.allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_parts_of_one_form_join_and_others_stay_apart(kernels: object) -> None:
    q, k, v = (quantize_int4(torch.randn(n, 64)) for n in (32, 16, 16))
    odd = quantize_int8_groups(torch.randn(16, 64))
    joined = QuantLinear([q, k, v], None)
    assert len(joined.parts) == 1 and joined.out_features == 64
    mixed = QuantLinear([q, odd], None, exact=True)
    assert len(mixed.parts) == 2 and mixed.kind == "int4-g32+int8-g32"
    x = torch.randn(1, 64)
    ref = torch.cat([tiles.dequantize(q), tiles.dequantize(odd)])
    assert torch.allclose(mixed(x), x @ ref.T, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 5, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_call_for_parts_of_every_form_equals_each_part_alone(
    kernels: object, rows: int, dtype: torch.dtype
) -> None:
    """A linear of parts of every form side by side and a bias is one native call
    (``QuantPlan``): the rows are quantized once per group size (4-, 6- and 8-bit parts of
    one group share them; an 8-bit part after a 4-bit one once read rows it never got) and
    the bias is added in float32 before the one rounding. Each part's outputs are exactly
    what that part alone gives for the same rows."""
    forms = _forms(rows, 40, 200)
    bias = torch.randn(sum(w.out_features for w in forms)).to(dtype)
    x = torch.randn(rows, 200).to(dtype)
    together = QuantLinear(forms, bias)(x)
    # bfloat16 rows hold values float32 holds exactly: the same int8 rows, the same sums.
    alone = torch.cat([QuantLinear([w], None)(x.float()) for w in forms], dim=-1)
    assert together.dtype == dtype
    assert torch.equal(together, (alone + bias.float()).to(dtype))


@pytest.mark.parametrize("type_name", ["Q4_K", "Q8_0", "Q6_K"])
def test_a_truncated_or_corrupt_tensor_is_refused_in_one_line(type_name: str) -> None:
    raw = random_blocks(type_name, 4, 256, seed=3)
    with pytest.raises(BlockError) as truncated:
        to_quant_weight(raw.reshape(-1)[:-5], type_name, 4, 256)
    assert "\n" not in str(truncated.value) and "needs" in str(truncated.value)
    corrupt = raw.copy()
    offset = SCALE_FIELDS[type_name][0]
    corrupt[0, offset : offset + 2] = np.array([np.inf], dtype=np.float16).view(np.uint8)
    with pytest.raises(BlockError) as bad:
        to_quant_weight(corrupt, type_name, 4, 256)
    assert "\n" not in str(bad.value) and "not finite" in str(bad.value)


def test_the_kernel_refuses_tiles_of_another_shape(kernels: object) -> None:
    w = quantize_int4(torch.randn(32, 64))
    with pytest.raises(RuntimeError, match="tiles must be"):
        kernels.QuantPlan(96).add(w.tiles, w.scales, w.zeros, 32, 32, 4)  # type: ignore[attr-defined]


def test_the_self_test_keeps_bfloat16_decode_rows_unquantized(kernels: object) -> None:
    """Within ``exact_float_rows`` (the start-up self-test) bfloat16 decode rows are the
    exact product, rounded once: quantizing them to int8 turned rounding noise into
    whole steps, and a 3B-shaped Q4_K_M file in bfloat16 failed the test and copied
    every prefix. Outside it they take the integer kernel. Nor do they dequantize the
    matrix: a vocabulary-sized head is 467 MB in bf16, and that scratch was the peak
    memory of a 1.5B file's engine (2.8 GB at start-up, 2.0 GB without)."""
    w = quantize_int4(torch.randn(48, 96))
    xb = torch.randn(4, 96).bfloat16()
    exact = xb.double() @ reference(w).double().T

    def error(out: torch.Tensor) -> float:
        return float((out.double() - exact).abs().max())

    def inside() -> tuple[torch.Tensor, bool]:  # a thread of its own: its own scratch
        with exact_float_rows():
            out = QuantLinear([w], None)(xb)
        return out, any(key.startswith("weights") for key in vars(quant_linear._SCRATCH))

    with ThreadPoolExecutor(1) as pool:
        out, dequantized = pool.submit(inside).result()
    assert out.dtype == torch.bfloat16 and not dequantized
    assert error(out) <= float((2**-8 * exact.abs()).max()) + 1e-6  # one bf16 rounding
    assert error(QuantLinear([w], None)(xb)) > error(out)
