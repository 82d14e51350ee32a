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
"""

from __future__ import annotations

import logging
from enum import StrEnum

import torch

_LOGGER = logging.getLogger(__name__)


# torch's int8 weight kernel (``_weight_int8pack_mm``, CPU) reads the input dimension in
# blocks of 64: measured in torch 2.13, K = 72 or 96 gives wrong sums (NaN, errors of
# 10^4) and can crash. Such layers keep their unquantized weights.
INT8_K_MULTIPLE = 64
# The int8 kernel is built for a few rows (decode): a 256-token prefill chunk through it
# ran at 89 tokens/s on a Qwen2.5-0.5B shape, against 511 in bfloat16. Above this many
# rows the weights are expanded to the activation dtype for one GEMM instead.
INT8_KERNEL_ROWS = 16


class Quantization(StrEnum):
    """How linear weights are stored (``--quantize``)."""

    NONE = "none"
    INT8 = "int8"


def can_pack_bf16(device: torch.device) -> bool:
    """Whether oneDNN can run packed bfloat16 linears here (needs native bf16)."""
    from .hardware import cpu_has_native_bf16

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
    ) -> None:
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        self.kind = "plain"
        self.scales: torch.Tensor | None = None
        if quantization == Quantization.INT8 and self.in_features % INT8_K_MULTIPLE == 0:
            self.weight, self.scales = quantize_int8(weight)
            self.kind = "int8"
        elif weight.dtype == torch.bfloat16 and can_pack_bf16(weight.device):
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
            self.kind = "packed"
        else:
            self.weight = weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
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
    modules: list[torch.nn.Linear], quantization: Quantization = Quantization.NONE
) -> FrozenLinear:
    """One linear for several that read the same input (q/k/v, gate/up): one kernel call.

    Each output is still its own dot product, so the result equals the separate calls'.
    """
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
    return FrozenLinear(weight, bias, quantization)
