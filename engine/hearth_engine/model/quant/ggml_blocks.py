"""GGUF's quantized blocks as Hearth's integer codes and per-group scales, never floats.

Each supported ggml block type maps onto ``tiles.QuantWeight``'s form
``W = scale[g] * q + zero[g]`` without re-quantizing a single weight:

=====  =====================================  ======================================
type   ggml block                             Hearth form
=====  =====================================  ======================================
Q4_0   32 weights: ``d * (q - 8)``, q 0..15   int4, group 32, scale d, zero -8d
Q4_1   32 weights: ``d * q + m``, q 0..15      int4, group 32, scale d, zero m
Q4_K   256: 8 groups of 32, ``d*sc*q - dm*m``  int4, group 32, scale sc of d, zero -m of dm
Q5_0   32 weights: ``d * (q - 16)``, q 0..31   int6 (q - 16), group 32, scale d
Q5_1   32 weights: ``d * q + m``, q 0..31      int6 (q - 16), group 32, zero m + 16d
Q5_K   256: as Q4_K with 5-bit q (0..31)       int6 (q - 16), group 32, zero +16 scale
Q6_K   256: 16 groups of 16, ``d*sc*(q-32)``   int6 (q - 32), group 16, scale sc of d
Q8_0   32: ``d * q``, q int8                   int8, group 32, no zero
=====  =====================================  ======================================

The codes are exact. Q4_K and Q6_K keep the file's two levels ("sc of d": an int8 factor
per group of a float16 super-scale per 256 weights, ``tiles``' two-level form), so their
scales and zeros are the file's own, exact float32 products. Q5_K's zero (``16 d sc -
dm m``) is no such product: its scales and zeros are the file's products rounded once to
float16, a relative error of at most 2^-11 (``tests/engine/test_quant_kernels.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .tiles import QuantWeight, pack

SUPER = 256  # QK_K: the weights of one K-quant super-block


class BlockError(ValueError):
    """A tensor's bytes do not fit its declared type and shape (corrupt or truncated)."""


@dataclass(frozen=True)
class BlockType:
    """One ggml block type: weights and bytes per block, and the form it maps to."""

    name: str
    weights: int
    nbytes: int
    bits: int
    group: int


BLOCK_TYPES: dict[str, BlockType] = {
    "Q4_0": BlockType("Q4_0", 32, 18, 4, 32),
    "Q4_1": BlockType("Q4_1", 32, 20, 4, 32),
    "Q4_K": BlockType("Q4_K", SUPER, 144, 4, 32),
    # llama-quantize's fallback where rows are not whole super-blocks (a 576-wide model's
    # Q4_K_M file is mostly Q5_0).
    "Q5_0": BlockType("Q5_0", 32, 22, 6, 32),
    "Q5_1": BlockType("Q5_1", 32, 24, 6, 32),
    "Q5_K": BlockType("Q5_K", SUPER, 176, 6, 32),
    "Q6_K": BlockType("Q6_K", SUPER, 210, 6, 16),
    "Q8_0": BlockType("Q8_0", 32, 34, 8, 32),
}


# A block's codes, per-group scales and zeros (or None), and for a two-level type the
# float16 super-scale and super-zero (or None) per block, of which scales and zeros are
# then the int8 factors.
Decoded = tuple[
    np.ndarray, np.ndarray, np.ndarray | None, tuple[np.ndarray, np.ndarray | None] | None
]


def _f16(raw: np.ndarray) -> np.ndarray:
    return raw.copy().view(np.float16).astype(np.float32)


def _k_scales(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 six-bit scales and mins of a Q4_K/Q5_K super-block (12 packed bytes)."""
    b = raw.astype(np.int32).reshape(-1, 3, 4)
    lo, mid, hi = b[:, 0], b[:, 1], b[:, 2]
    sc = np.concatenate([lo & 63, (hi & 15) | ((lo >> 6) << 4)], axis=1)
    mins = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=1)
    return sc.astype(np.float32), mins.astype(np.float32)


def _q4_0(b: np.ndarray) -> Decoded:
    d = _f16(b[:, :2])  # [B, 1]
    qs = b[:, 2:]
    q = np.concatenate([qs & 15, qs >> 4], axis=1)  # elements 0..15 low, 16..31 high
    return q.astype(np.int16), d, -8.0 * d, None


def _q4_1(b: np.ndarray) -> Decoded:
    d, m = _f16(b[:, :2]), _f16(b[:, 2:4])
    qs = b[:, 4:]
    q = np.concatenate([qs & 15, qs >> 4], axis=1)
    return q.astype(np.int16), d, m, None


def _q5_codes(qh: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """A Q5_0/Q5_1 block's 32 codes (0..31): low nibbles then high ones of ``qs`` [B, 16],
    with bit j of the little-endian word ``qh`` [B, 4] as weight j's fifth bit."""
    high_bits = qh.copy().view("<u4").astype(np.uint32)  # [B, 1]
    fifth = (high_bits >> np.arange(32, dtype=np.uint32)[None, :]) & 1  # [B, 32]
    low = np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.int16)
    return low | (fifth.astype(np.int16) << 4)


def _q5_0(b: np.ndarray) -> Decoded:
    d = _f16(b[:, :2])
    return _q5_codes(b[:, 2:6], b[:, 6:]) - 16, d, None, None


def _q5_1(b: np.ndarray) -> Decoded:
    d, m = _f16(b[:, :2]), _f16(b[:, 2:4])
    return _q5_codes(b[:, 4:8], b[:, 8:]) - 16, d, m + 16.0 * d, None


def _q4_k(b: np.ndarray) -> Decoded:
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mins = _k_scales(b[:, 4:16])
    qs = b[:, 16:].reshape(-1, 4, 32)  # 4 chunks of 64 weights: low nibbles, then high
    q = np.stack([qs & 15, qs >> 4], axis=2).reshape(-1, SUPER)
    return q.astype(np.int16), sc, -mins, (d, dmin)


def _q5_k(b: np.ndarray) -> Decoded:
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mins = _k_scales(b[:, 4:16])
    qh = b[:, 16:48]  # [B, 32]: bit j of byte l is the fifth bit of group j's weight l
    qs = b[:, 48:].reshape(-1, 4, 32)
    low = np.stack([qs & 15, qs >> 4], axis=2).reshape(-1, 8, 32).astype(np.int16)
    high = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
    q = (low | (high.astype(np.int16) << 4)).reshape(-1, SUPER) - 16
    scale = d * sc
    return q, scale, 16.0 * scale - dmin * mins, None


def _q6_k(b: np.ndarray) -> Decoded:
    ql = b[:, :128].reshape(-1, 2, 64)  # two halves of 128 weights
    qh = b[:, 128:192].reshape(-1, 2, 32)
    scales = b[:, 192:208].copy().view(np.int8).astype(np.float32)
    d = _f16(b[:, 208:210])
    low = np.concatenate([ql & 15, ql >> 4], axis=2).reshape(-1, 2, 4, 32)  # [B, half, 4, 32]
    high = (qh[:, :, None, :] >> np.array([0, 2, 4, 6], dtype=np.uint8)[None, None, :, None]) & 3
    q = (low.astype(np.int16) | (high.astype(np.int16) << 4)) - 32
    return q.reshape(-1, SUPER), scales, None, (d, None)


def _q8_0(b: np.ndarray) -> Decoded:
    d = _f16(b[:, :2])
    q = b[:, 2:].copy().view(np.int8).astype(np.int16)
    return q, d, None, None


_DECODERS = {
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q4_K": _q4_k,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
    "Q8_0": _q8_0,
}


def supported(type_name: str) -> bool:
    return type_name in BLOCK_TYPES


def to_quant_weight(raw: np.ndarray, type_name: str, rows: int, cols: int) -> QuantWeight:
    """The tensor's raw bytes (``rows`` x ``cols`` weights in ``type_name`` blocks) as a
    ``QuantWeight``; bytes that do not fit the type and shape raise ``BlockError``."""
    kind = BLOCK_TYPES.get(type_name)
    if kind is None:
        raise BlockError(f"block type {type_name} is not kept quantized")
    if cols % kind.weights:
        raise BlockError(
            f"{type_name} rows of {cols} weights are not whole blocks of {kind.weights}"
        )
    per_row = cols // kind.weights * kind.nbytes
    data = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    if data.size != rows * per_row:
        raise BlockError(
            f"{type_name} tensor of {rows}x{cols} needs {rows * per_row} bytes, has {data.size}"
        )
    q, scale, zero, tops = _DECODERS[type_name](data.reshape(-1, kind.nbytes))
    groups = cols // kind.group
    scale = scale.reshape(rows, groups)
    zero = None if zero is None else zero.reshape(rows, groups)
    checked = [scale, zero] if tops is None else list(tops)
    if not all(np.isfinite(v.astype(np.float16)).all() for v in checked if v is not None):
        raise BlockError(f"{type_name} tensor has scales that are not finite numbers")

    def tensor(v: np.ndarray | None, shape: tuple[int, int]) -> torch.Tensor | None:
        return None if v is None else torch.from_numpy(np.ascontiguousarray(v.reshape(shape)))

    supers, per_super = None, 0
    if tops is not None:
        per_super = kind.weights // kind.group
        blocks = (rows, cols // kind.weights)
        supers = (tensor(tops[0], blocks), tensor(tops[1], blocks))
    return pack(
        torch.from_numpy(q.reshape(rows, cols)),
        tensor(scale, (rows, groups)),
        tensor(zero, (rows, groups)),
        kind.group,
        kind.bits,
        supers=supers,  # type: ignore[arg-type]
        per_super=per_super,
    )
