"""Linears and embeddings whose weights stay 4-, 6- or 8-bit (``tiles.QuantWeight``).

One copy of the weights serves both phases (``kernels/quant_linear.cpp``):

* **decode** (at most ``DECODE_ROWS`` rows): a ``QuantPlan`` (built once per linear)
  reads the packed tiles of every part in one native call, bias included;
  the rows (bfloat16 or float32) are quantized per group to int8 and multiplied with
  integer dots (AVX-512 VNNI, or AVX2's vpmaddubsw: llama.cpp's scheme); ``exact``
  keeps float32 rows unrounded (a float path several times slower, for tests);
* **prefill** (more rows), one of two ways (``prefill_path``):

  - ``integer`` (AVX-512 VNNI or AVX2; not where AMX-BF16 takes bfloat16 rows): the
    same ``QuantPlan`` as decode, every tile read once for all the chunk's rows. On a
    2-vCPU AVX-512 VNNI Xeon without BF16, the default model's linears at 85 rows: 1.6
    ms a layer against 2.9 ms dense (about 200 against 100-130 GMAC/s), and a warm
    85-token prefill over a 3,200-token house 226-234 to 187-200 ms (as the ``avx2``
    class, 356-361 to 305-307 ms). It is the arithmetic decode steps already use, so a
    prefix and the steps that follow it see the same linears
    (llama.cpp's prefill does the same with q8 rows);
  - ``dense`` (elsewhere, and for the self-test's exact rows): the matrix is dequantized
    a tile at a time (``quant_dequant_tiles``) into a scratch buffer (per thread,
    reused, the size of the largest matrix) and multiplied by one GEMM (oneDNN, on AMX
    tiles where the CPU has them). On the Qwen2.5-1.5B layer, int4, 256 rows (2-vCPU
    Xeon with AMX, loaded, one run): 310 ms per layer against 264 ms for the bfloat16
    GEMM alone (1.17x; the dequantization is 46 ms of it), where torch's vectorised ops
    dequantized it in 1,286 ms (4.9x), and torch's ``_weight_int4pack_mm_for_cpu`` took
    1,482 ms earlier.

  ``HEARTH_QUANT_PREFILL=integer|dense`` chooses one for a process (benches compare the
  two side by side: ``scripts/bench household --configs hearth hearth_dense_prefill``).

Several matrices that read the same input (q/k/v, gate/up) are one ``QuantLinear`` of
several parts: one decode call for all, their outputs side by side. Parts of the same
form whose features fill whole tiles are joined into one part.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Iterable, Iterator, Sequence

import torch

from .. import native
from ..hardware import cpu_has_amx_bf16
from .tiles import LANES, QuantWeight, dequantize, pack

DECODE_ROWS = 16  # decode steps: at most 16 rows (native_step.py's bound too)
PREFILL_SWITCH = "HEARTH_QUANT_PREFILL"  # "integer" or "dense": overrides prefill_path
INT4_GROUP = 32  # --quantize int4: the group size (as Q4_K's sub-blocks)

_SCRATCH = threading.local()
_EXACT = threading.local()  # exact_float_rows() on this thread


@contextlib.contextmanager
def exact_float_rows() -> Iterator[None]:
    """Within it (this thread), decode rows are not quantized: float32 rows take the
    kernels' exact float path, bfloat16 rows (which the kernel always quantizes) the
    prefill's dequantize-and-multiply.

    For the engine's start-up self-test (``self_test.check_shared_prefix``), which
    bounds reading a prefix in place by how much a forward moves when only its float
    rounding changes: quantizing activations turns a rounding-sized difference into a
    whole quantization step now and then (0.25 on a logit, measured), which would fail
    the test for a reason that is not attention's (a Llama-3.2-3B-shaped Q4_K_M file in
    bfloat16 failed it, 0.49 against 0.20, and copied every prefix: a request on a
    6,300-token house then needed 2 GB of working KV and was refused)."""
    before = getattr(_EXACT, "on", False)
    _EXACT.on = True
    try:
        yield
    finally:
        _EXACT.on = before


def exact_rows() -> bool:
    """Whether ``exact_float_rows`` is on for this thread."""
    return bool(getattr(_EXACT, "on", False))


def prefill_path(dtype: torch.dtype) -> str:
    """How prefill rows (more than ``DECODE_ROWS``) of ``dtype`` meet a packed matrix:
    ``integer`` (int8 rows, ``QuantPlan``) or ``dense`` (dequantized, one GEMM).

    Integer where the kernels multiply with AVX-512 VNNI or AVX2 (``quant_dots``), except
    for bfloat16 rows on a CPU with AMX-BF16 (within its ``HEARTH_CPU`` class), whose
    GEMM multiplies on the tiles at several times the integer rate. Measured on a 2-vCPU
    Xeon, a warm 85-token prefill of the default model over a 3,200-token house: AVX-512
    VNNI 187-200 ms integer against 226-234 dense; as the ``avx2`` class 305-307 against
    356-361 (a Q4_K-like two-level int4 linear, 576 -> 3,072 at 85 rows: 1.7-1.8 against
    2.3-2.4 ms). Dense for Arm's and the generic dots, unmeasured at prefill.
    ``HEARTH_QUANT_PREFILL`` overrides it."""
    chosen = os.environ.get(PREFILL_SWITCH, "").strip().lower()
    if chosen in {"integer", "dense"}:
        return chosen
    if dtype == torch.bfloat16 and cpu_has_amx_bf16():
        return "dense"
    return "integer" if _dots() in {"avx512_vnni", "avx2"} else "dense"


def model_prefill_path(linears: Iterable[object], dtype: torch.dtype) -> str:
    """``prefill_path`` for a model whose ``linears`` include packed ones; "" where none is."""
    return prefill_path(dtype) if any(isinstance(x, QuantLinear) for x in linears) else ""


@functools.cache
def _dots() -> str:
    """The loaded kernels' integer dot products (``quant_dots``), or ``none``."""
    module = native.load() if native.enabled() else None
    return (
        str(module.quant_dots()) if module is not None and hasattr(module, "quant_dots") else "none"
    )


class QuantKernelsMissingError(RuntimeError):
    """Quantized weights need Hearth's native kernels, and they are not loaded."""


def kernels() -> object:
    module = native.load() if native.enabled() else None
    if module is None or not hasattr(module, "QuantPlan"):
        reason = native.error() or "turned off (HEARTH_NATIVE=0)"
        raise QuantKernelsMissingError(f"quantized weights need Hearth's native kernels ({reason})")
    return module


def _scratch(numel: int, dtype: torch.dtype, name: str = "codes") -> torch.Tensor:
    """A reused buffer of at least ``numel`` elements of ``dtype`` for this thread.

    A buffer made under ``torch.inference_mode`` cannot be written outside it (and the
    engine runs its model under it, tests and benches may not), so the mode is part of
    the key."""
    mode = "inference" if torch.is_inference_mode_enabled() else "normal"
    key = f"{name}_{str(dtype).removeprefix('torch.')}_{mode}"
    buf = getattr(_SCRATCH, key, None)
    if buf is None or buf.numel() < numel:
        buf = torch.empty(numel, dtype=dtype)
        setattr(_SCRATCH, key, buf)
    return buf[:numel]


def dense_padded(w: QuantWeight, dtype: torch.dtype) -> torch.Tensor:
    """``W`` as ``[T * 16, K_pad]`` in ``dtype`` (the prefill path), a tile at a time by
    the native ``quant_dequant_tiles``: the reference's arithmetic (``q * s``, ``+ z`` in
    float32, one rounding into ``dtype``) into a per-thread scratch matrix."""
    t = w.scales.shape[0]
    k_pad = w.groups * w.group
    rows = t * LANES
    out = _scratch(rows * k_pad, dtype, "weights").view(rows, k_pad)
    kernels().quant_dequant_tiles(  # type: ignore[attr-defined]
        w.tiles, w.scales, w.zeros, w.group, w.bits, out, **w.kernel_params
    )
    return out


def join(parts: Sequence[QuantWeight]) -> list[QuantWeight]:
    """Adjacent parts of one form whose features fill whole tiles, joined into one."""
    out: list[QuantWeight] = []
    for part in parts:
        last = out[-1] if out else None
        same = (
            last is not None
            and last.out_features % LANES == 0
            and (last.bits, last.group, last.in_features, last.per_super)
            == (part.bits, part.group, part.in_features, part.per_super)
            and (last.zeros is None) == (part.zeros is None)
        )
        if not same:
            out.append(part)
            continue
        assert last is not None
        out[-1] = QuantWeight(
            torch.cat([last.tiles, part.tiles]),
            torch.cat([last.scales, part.scales]),
            None if last.zeros is None else torch.cat([last.zeros, part.zeros]),  # type: ignore[list-item]
            last.out_features + part.out_features,
            last.in_features,
            last.group,
            last.bits,
            None if last.supers is None else torch.cat([last.supers, part.supers]),  # type: ignore[list-item]
            last.per_super,
        )
    return out


class QuantLinear:
    """``y = x @ W.T + b`` for a ``W`` kept as one or more ``QuantWeight`` parts."""

    def __init__(
        self, parts: Sequence[QuantWeight], bias: torch.Tensor | None, exact: bool = False
    ) -> None:
        self.parts = join(parts)
        self.exact = exact
        self.in_features = self.parts[0].in_features
        if any(p.in_features != self.in_features for p in self.parts):
            raise ValueError("the parts of a quantized linear must read the same input")
        self.out_features = sum(p.out_features for p in self.parts)
        self.bias = bias
        self.kind = "+".join(dict.fromkeys(p.kind for p in self.parts))
        self.tiles = None  # no bfloat16 decode tiles: the packed weights are the tiles
        self.nbytes = sum(p.nbytes for p in self.parts)
        # Decode rows: one native call for every part and the bias (``QuantPlan``): the
        # per-part calls, the ``torch.cat`` and the bias add were ~4 % of a small model's step.
        self.plan = kernels().QuantPlan(self.in_features, bias)  # type: ignore[attr-defined]
        for p in self.parts:
            self.plan.add(
                p.tiles, p.scales, p.zeros, p.out_features, p.group, p.bits, **p.kernel_params
            )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        exact = self.exact or exact_rows()
        if x.numel() <= DECODE_ROWS * self.in_features:
            if x.dtype == torch.float32 or (x.dtype == torch.bfloat16 and not exact):
                return self.plan(x, exact)
            if exact and x.dtype == torch.bfloat16:
                # A few exact bf16 rows (the self-test's decode steps) widen to float32,
                # where the kernel's exact path reads the packed weights: the dense path
                # would dequantize the whole matrix into scratch that stays (a
                # vocabulary-sized head: 467 MB in bf16, and the GEMM's copy of it).
                return self.plan(x.float(), True).to(x.dtype)
        elif (
            not exact
            and x.dtype in {torch.float32, torch.bfloat16}
            and prefill_path(x.dtype) == "integer"
        ):
            return self.plan(x, False)
        outs = [self._dense(p, x) for p in self.parts]
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
        return out if self.bias is None else out + self.bias.to(out.dtype)

    @staticmethod
    def _dense(w: QuantWeight, x: torch.Tensor) -> torch.Tensor:
        """Prefill rows: the matrix dequantized (scratch), then one GEMM."""
        weight = dense_padded(w, x.dtype)  # [T * 16, K_pad]: padding rows and columns
        if weight.shape[1] != w.in_features:
            x = torch.nn.functional.pad(x, (0, weight.shape[1] - w.in_features))
        return torch.nn.functional.linear(x, weight)[..., : w.out_features]


class QuantEmbedding(torch.nn.Module):
    """An embedding lookup from a quantized matrix (rows dequantized on demand)."""

    def __init__(self, weight: QuantWeight, dtype: torch.dtype) -> None:
        super().__init__()
        self.qweight = weight
        self.dtype = dtype
        self.num_embeddings = weight.out_features
        self.embedding_dim = weight.in_features
        # No float matrix: an empty one says the dtype and device to code that asks.
        self.register_buffer("weight", torch.empty(0, dtype=dtype), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        w = self.qweight
        return kernels().quant_rows(  # type: ignore[attr-defined]
            w.tiles,
            w.scales,
            w.zeros,
            ids,
            w.out_features,
            w.in_features,
            w.group,
            w.bits,
            self.dtype,
            **w.kernel_params,
        )


def quantize_int4(weight: torch.Tensor, group: int = INT4_GROUP) -> QuantWeight:
    """Asymmetric group-wise int4 of a float ``weight [N, K]``: per group of ``group``
    inputs, ``scale = (max - min) / 15`` and ``zero = min`` (a partial last group too)."""
    n, k = weight.shape
    groups = -(-k // group)
    w = torch.zeros(n, groups * group)
    w[:, :k] = weight.float()
    blocks = w.view(n, groups, group)
    if k % group:  # the padding must not widen the last group's range
        last = weight.float()[:, (groups - 1) * group :]
        blocks[:, -1, k % group :] = last[:, :1]
    low, high = blocks.amin(dim=2), blocks.amax(dim=2)
    scale = ((high - low) / 15).clamp(min=1e-8)
    scale16 = scale.to(torch.float16).float()  # the stored scale decides the codes
    q = torch.round((blocks - low[..., None]) / scale16[..., None]).clamp_(0, 15)
    codes = q.view(n, -1)[:, :k].to(torch.int16)
    return pack(codes, scale16, low, group, 4)


def quantize_int8_groups(weight: torch.Tensor, group: int = INT4_GROUP) -> QuantWeight:
    """Symmetric group-wise int8 of a float ``weight [N, K]`` (``scale = max|w| / 127``)."""
    n, k = weight.shape
    groups = -(-k // group)
    w = torch.zeros(n, groups * group)
    w[:, :k] = weight.float()
    blocks = w.view(n, groups, group)
    scale = (blocks.abs().amax(dim=2) / 127).clamp(min=1e-8).to(torch.float16).float()
    q = torch.round(blocks / scale[..., None]).clamp_(-127, 127)
    return pack(q.view(n, -1)[:, :k].to(torch.int16), scale, None, group, 8)


def reference(w: QuantWeight) -> torch.Tensor:
    """The float32 matrix the kernels stand for (tests, benchmarks)."""
    return dequantize(w)
