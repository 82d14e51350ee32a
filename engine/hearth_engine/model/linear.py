"""Frozen linear layers for inference: plain, oneDNN-packed bfloat16, and int8 weights.

A decode step multiplies one row per sequence by every weight matrix, so it is bound
by how fast the kernel streams the weights. Measured on a 2-thread Xeon with AMX
(90 SmolLM2 MLP matrices cycled, so none stays in cache):

* ``torch.nn.functional.linear`` in bfloat16: 14 GB/s (the generic GEMM path);
* the same weights reordered once for oneDNN (``mkldnn._reorder_linear_weight``) and
  multiplied with ``mkldnn._linear_pointwise``: 22 GB/s;
* float32: plain ``linear`` is already at 25 GB/s; packing gains nothing;
* int8 weights with a per-output-channel scale (``_weight_int8pack_mm``, bfloat16
  activations): half the bytes, 1.4x faster than packed bfloat16 per matrix.

**Decode tiles.** oneDNN's packed linear also spends about 17 us per call before it
reads a byte, and a decode step of a small model makes over a hundred calls. Where
Hearth's native kernels are loaded, each linear also keeps its weights as tiles of 16
output features (``kernels/decode_linear.cpp``), and calls of at most
``TILED_MAX_ROWS`` rows (decode steps) go to ``tiled_linear``: on a 2-core EPYC with
AVX512-BF16 it streamed SmolLM2's matrices at 28-30 GB/s for one row against packed
oneDNN's 16-19, 21 against 18 for four rows and 17 against 13 for eight, at 1-2 us per
call. Prefill chunks keep oneDNN (or AMX, where the CPU has it). The tiles are a second
copy of the weights: they are made only while that copy fits in ``TILES_RAM_SHARE`` of
the free memory (``tiles_fit``). A linear that only decode-sized calls reach (the output
layer: a prefill asks for its last token's logits only) keeps its weights as they are
beside its tiles (``pack=False``): no packed copy, and a tied head shares the embedding.
"""

from __future__ import annotations

import logging
from enum import StrEnum

import psutil
import torch

from . import native
from .hardware import cpu_has_native_bf16
from .quant.linear import QuantLinear, quantize_int4

_LOGGER = logging.getLogger(__name__)


# torch's int8 weight kernel (``_weight_int8pack_mm``, CPU) reads the input dimension in
# blocks of 64: measured in torch 2.13, K = 72 or 96 gives wrong sums (NaN, errors of
# 10^4) and can crash. Such layers keep their unquantized weights.
INT8_K_MULTIPLE = 64
# The int8 kernel is built for a few rows (decode): a 256-token prefill chunk through it
# ran at 89 tokens/s on a Qwen2.5-0.5B shape, against 511 in bfloat16. Above this many
# rows the weights are expanded to the activation dtype for one GEMM instead.
INT8_KERNEL_ROWS = 16
# Rows (tokens) up to which a call goes to the decode tiles: tiled_linear's limit.
TILED_MAX_ROWS = 16
# The decode tiles are made while their bytes are at most this share of free memory.
TILES_RAM_SHARE = 0.25
TILED_DTYPES = (torch.bfloat16, torch.float32)
QUANT_ATTR = "hearth_quant"  # a module's packed weights (quant.tiles.QuantWeight)


class Quantization(StrEnum):
    """How linear weights are stored (``--quantize``)."""

    NONE = "none"
    INT8 = "int8"
    INT4 = "int4"  # group-wise (quant.linear.INT4_GROUP), packed: quant/
    GGUF = "gguf"  # a GGUF file's own quantized blocks, kept packed: quant/


def can_pack_bf16(device: torch.device) -> bool:
    """Whether oneDNN can run packed bfloat16 linears here (needs native bf16)."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    supported = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return cpu_has_native_bf16() and (supported is None or bool(supported()))


class FrozenLinear:
    """``y = x @ W.T + b`` with weights prepared once for the fastest kernel here."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        quantization: Quantization = Quantization.NONE,
        tiled: bool = False,
        pack: bool = True,
    ) -> None:
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        self.kind = "plain"
        self.scales: torch.Tensor | None = None
        self.tiles: torch.Tensor | None = None
        self.weight: torch.Tensor | None
        if quantization == Quantization.INT8 and self.in_features % INT8_K_MULTIPLE == 0:
            self.weight, self.scales = quantize_int8(weight)
            self.kind = "int8"
        elif pack and weight.dtype == torch.bfloat16 and can_pack_bf16(weight.device):
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
            self.kind = "packed"
        else:
            self.weight = weight
        kernels = native.module()
        if tiled and kernels is not None:
            self.tiles = kernels.tile_weight(weight if self.kind == "packed" else self.weight)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.tiles is not None and x.numel() <= TILED_MAX_ROWS * self.in_features:
            out = self._tiled(x)
            if out is not None:
                return out
        if self.weight is None:  # tiles only (drop_weight): the rare wider call widens them
            return torch.nn.functional.linear(x, self.untiled(), self.bias)
        if self.kind == "packed":
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        if self.kind == "int8":
            flat = x.reshape(-1, self.in_features)
            if flat.shape[0] > INT8_KERNEL_ROWS:
                weight = self.weight.to(x.dtype) * self.scales[:, None]
                return torch.nn.functional.linear(x, weight, self.bias)
            out = torch._weight_int8pack_mm(flat, self.weight, self.scales)
            out = out.view(*x.shape[:-1], self.out_features)
            return out if self.bias is None else out + self.bias
        return torch.nn.functional.linear(x, self.weight, self.bias)

    def drop_weight(self) -> bool:
        """Keep the tiles only (a plain weight beside them, ``pack=False``, goes); whether
        it went. Calls of more than ``TILED_MAX_ROWS`` rows then widen the tiles first."""
        if self.tiles is None or self.kind != "plain":
            return False
        self.weight = None
        return True

    def untiled(self) -> torch.Tensor:
        """The weights ``[N, K]`` rebuilt from the tiles (``tile_weight``'s layouts)."""
        assert self.tiles is not None
        tiles, n, k = self.tiles, self.out_features, self.in_features
        if tiles.dim() == 4:  # bfloat16 [T, K/2, 16, 2]
            rows = tiles.permute(0, 2, 1, 3).reshape(tiles.shape[0] * 16, -1)
        else:  # [T, K, 16]
            rows = tiles.transpose(1, 2).reshape(tiles.shape[0] * 16, -1)
        return rows[:n, :k]

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` of the weights, read from the tiles: ``[*ids.shape, K]`` (an
        embedding lookup, for a model whose output layer shares its embedding)."""
        assert self.tiles is not None
        tiles, k = self.tiles, self.in_features
        tile, lane = ids // 16, ids % 16
        if tiles.dim() == 4:  # [T, K/2, 16, 2] -> [*ids, K/2, 2]
            return tiles[tile, :, lane, :].flatten(-2)[..., :k]
        return tiles[tile, :, lane]  # [T, K, 16] -> [*ids, K]

    def _tiled(self, x: torch.Tensor) -> torch.Tensor | None:
        """``x`` through the decode tiles; ``None`` when they cannot serve it (torch's
        kernels do). Not while torch.compile traces: an opaque call would break its graph."""
        kernels = native.module()
        if kernels is None or torch.compiler.is_compiling() or x.dtype not in TILED_DTYPES:
            return None
        try:
            return kernels.tiled_linear(x, self.tiles, self.out_features, self.scales, self.bias)
        except RuntimeError as err:  # a call the kernel refuses: torch's from now on
            native.disable(str(err).splitlines()[0])
            return None


def tiles_fit(weights: list[torch.Tensor], device: torch.device) -> bool:
    """Whether the linears of ``weights`` should keep decode tiles: the native kernels are
    loaded, the weights are on the CPU in a dtype the tiles take, and a second copy of
    them fits in ``TILES_RAM_SHARE`` of the free memory (said in one log line if not)."""
    if device.type != "cpu" or native.module() is None:
        return False
    if any(w.dtype not in (*TILED_DTYPES, torch.int8) for w in weights):
        return False
    need = sum(w.numel() * w.element_size() for w in weights)
    free = psutil.virtual_memory().available
    if need > TILES_RAM_SHARE * free:
        _LOGGER.warning(
            "Decode tiles skipped: %.0f MiB is more than %.0f%% of the free memory (%.0f MiB)",
            need / 2**20,
            TILES_RAM_SHARE * 100,
            free / 2**20,
        )
        return False
    return True


def int8_unsupported(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why int8 linears cannot run here (one line), or ``None``: tried on a tiny matrix."""
    if dtype not in (torch.bfloat16, torch.float16):
        name = str(dtype).removeprefix("torch.")
        return f"int8 weights compute in bfloat16 or float16, not {name}: use --dtype bfloat16"
    try:
        x = torch.zeros(1, 64, dtype=dtype, device=device)
        w = torch.zeros(8, 64, dtype=torch.int8, device=device)
        torch._weight_int8pack_mm(x, w, torch.ones(8, dtype=dtype, device=device))
    except (RuntimeError, NotImplementedError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return f"this torch has no int8 weight kernel for {device.type} ({first[:120]})"
    return None


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8: ``W ~= q * scale[:, None]``, ``|q| <= 127``."""
    w = weight.float()
    scales = w.abs().amax(dim=1).clamp(min=1e-8) / 127.0
    q = torch.round(w / scales[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.contiguous(), scales.to(weight.dtype)


def fuse(
    modules: list[torch.nn.Linear],
    quantization: Quantization = Quantization.NONE,
    tiled: bool = False,
    pack: bool = True,
) -> FrozenLinear | QuantLinear:
    """One linear for several that read the same input (q/k/v, gate/up): one kernel call.

    Each output is still its own dot product, so the result equals the separate calls'.
    Modules that carry packed weights (``QUANT_ATTR``, a quantized GGUF) and every module
    under ``--quantize int4`` become a ``QuantLinear`` (one copy, no decode tiles).
    """
    packed = [getattr(m, QUANT_ATTR, None) for m in modules]
    for module in modules:  # the fused linear holds them now: joined parts are new tiles,
        if hasattr(module, QUANT_ATTR):  # and their originals go as each layer is built
            delattr(module, QUANT_ATTR)  # (the allocator keeps freed memory: the peak)
    if any(p is not None for p in packed) or quantization == Quantization.INT4:
        return _quant_fuse(modules, packed)
    weight = torch.cat([m.weight.detach() for m in modules]) if len(modules) > 1 else None
    if weight is None:
        weight = modules[0].weight.detach()
    biases = [m.bias for m in modules]
    bias = None
    if any(b is not None for b in biases):
        bias = torch.cat(
            [
                b.detach() if b is not None else torch.zeros(m.out_features, dtype=weight.dtype)
                for m, b in zip(modules, biases, strict=True)
            ]
        )
    return FrozenLinear(weight, bias, quantization, tiled, pack)


def _quant_fuse(modules: list[torch.nn.Linear], packed: list[object]) -> QuantLinear:
    """A ``QuantLinear`` of the modules' packed weights; a module without them (a float
    layer in a quantized file, or ``--quantize int4``) is quantized to int4 here."""
    parts = [
        p if p is not None else quantize_int4(m.weight.detach())
        for m, p in zip(modules, packed, strict=True)
    ]
    biases = [m.bias for m in modules]
    bias = None
    if any(b is not None for b in biases):
        dtype = next(b.dtype for b in biases if b is not None)
        bias = torch.cat(
            [
                b.detach() if b is not None else torch.zeros(m.out_features, dtype=dtype)
                for m, b in zip(modules, biases, strict=True)
            ]
        )
    return QuantLinear(parts, bias)  # type: ignore[arg-type]
