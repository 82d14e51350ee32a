"""A one-token decode step's layers in one native call (``kernels/decode_step.cpp``).

The lean forward's layer loop (``decoder.py``) is about fifteen operations a layer; on a
small model most of a decode step is their Python and dispatch time, while the second
core waits at the next parallel region. ``DecodeLayers`` runs the same loop in C++ with
the same kernels (``QuantPlan`` or decode tiles, RMSNorm, RoPE, decode attention) and
torch's own operations for the rest, in the same order: the same bits as the Python loop.

It serves the steps it can take: one token a row, at most 16 rows, bfloat16 or float32,
native linears in every layer (packed 4/6/8-bit weights, or decode tiles), q/k norms
(Qwen3) or none, prefix parts that hold every layer. Anything else, and any call the
kernels refuse (then for good, logged once), runs the Python loop. Measured in
``docs/benchmarks.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from . import native
from .attention import PrefixPart, own_keep
from .kv import KVBuffer
from .linear import TILED_DTYPES, TILED_MAX_ROWS, FrozenLinear
from .quant.linear import DECODE_ROWS, QuantLinear, exact_rows

_LOGGER = logging.getLogger(__name__)

MAX_ROWS = min(DECODE_ROWS, TILED_MAX_ROWS)
DTYPES = TILED_DTYPES  # bfloat16 and float32: what every kernel of the step takes


class Decoder(Protocol):
    """What ``build`` reads of ``decoder.LeanDecoder`` (not imported: it imports this)."""

    heads: int
    kv_heads: int
    head_dim: int
    scale: float
    layers: list[Any]  # decoder._Layer


def _linear(kernels: Any, linear: Any) -> Any | None:
    """The layer's linear as the native step takes it, or ``None`` when it cannot."""
    if isinstance(linear, QuantLinear):
        return None if linear.exact else kernels.StepLinear.quant(linear.plan)
    if isinstance(linear, FrozenLinear) and linear.tiles is not None:
        return kernels.StepLinear.tiled(
            linear.tiles, linear.out_features, linear.scales, linear.bias
        )
    return None


def build(decoder: Decoder) -> Any | None:
    """The decoder's layers as one ``DecodeLayers``, or ``None`` when one of them cannot
    run natively (a linear without native weights) or the kernels are not loaded."""
    kernels = native.module()
    if kernels is None or decoder.head_dim not in native.HEAD_SIZES:
        return None
    layers = kernels.DecodeLayers(decoder.heads, decoder.kv_heads, decoder.head_dim, decoder.scale)
    for layer in decoder.layers:
        if (layer.q_norm is None) != (layer.k_norm is None):
            return None
        linears = [_linear(kernels, x) for x in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        if any(x is None for x in linears):
            return None
        qkv, o, gate_up, down = linears
        q_norm, q_eps = layer.q_norm or (None, 0.0)
        k_norm, k_eps = layer.k_norm or (None, 0.0)
        layers.add_layer(
            layer.in_norm,
            layer.in_eps,
            qkv,
            o,
            layer.post_norm,
            layer.post_eps,
            gate_up,
            down,
            q_norm=q_norm,
            q_eps=q_eps,
            k_norm=k_norm,
            k_eps=k_eps,
        )
    return layers


def takes(
    dtype: torch.dtype,
    ids: torch.Tensor,  # [B, 1]
    cache: KVBuffer,
    mask: torch.Tensor | None,
    parts: Sequence[PrefixPart],
) -> bool:
    """Whether the native step can run this step (see the module docstring)."""
    return (
        dtype in DTYPES
        and ids.device.type == "cpu"
        and ids.shape[0] <= MAX_ROWS
        and not exact_rows()
        and not torch.compiler.is_compiling()
        and not cache.state_layers
        and cache.length < cache.capacity
        and (mask is None or mask.dtype == torch.bool)
        and all(p.layers is None for p in parts)
    )


def run(  # noqa: PLR0917 - one step's inputs
    layers: Any,
    hidden: torch.Tensor,  # [B, 1, width]
    cos: torch.Tensor,  # [B, 1, 1, D]
    sin: torch.Tensor,
    cache: KVBuffer,
    mask: torch.Tensor | None,  # [B, K] bool
    parts: Sequence[PrefixPart],
) -> torch.Tensor:
    """The last layer's hidden ``[B, 1, width]``; the step's KV is written and counted."""
    length = cache.length
    keep = None if mask is None else own_keep(mask, hidden.shape[0], length + 1)
    out = layers(
        hidden,
        cos,
        sin,
        cache.data,
        length,
        keep,
        [p.segment for p in parts],
        [p.rows for p in parts],
    )
    cache.set_length(length + 1)
    return out
