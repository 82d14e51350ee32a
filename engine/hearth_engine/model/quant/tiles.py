"""Group-quantized weights in Hearth's tile layout (``kernels/quant_linear.cpp``).

A ``QuantWeight`` is one matrix ``W [N, K]`` stored once, as the kernels read it:

* ``W[f, k] = scales[f, g] * q[f, k] + zeros[f, g]`` with ``g = k // group``;
* 4-bit: ``q`` in 0..15 (unsigned, asymmetric: the zero term carries the offset);
  6-bit: ``q`` in -32..31 and 8-bit: ``q`` in -128..127 (signed; ``zeros`` optional);
* tiles of 16 output features, K padded with zero weights to a multiple of ``group``
  (a partial last group stays exact), scales and zeros float16 ``[T, G, 16]``.

6-bit codes (a GGUF file's Q6_K and 5-bit blocks, kept at their own width) are stored as
``q + 32`` (0..63) in two planes per 16 inputs: the low nibbles as 4-bit tiles store
them (128 bytes), then the top two bits of the same 64 codes (64 bytes: step ``s`` of
the four in bits ``2s, 2s+1``). Their groups are whole multiples of 16 inputs.

Two-level parameters (GGUF's K-quant super-blocks, kept as the file has them): with
``supers``, ``scales`` and ``zeros`` are int8 factors ``[T, G, 16]`` of float16
super-scales ``supers [T, GS, Z, 16]`` (``Z`` = 1, or 2 with zeros) shared by
``per_super`` groups: ``scale = super * factor``, an exact float32 product. A Q4_K group
of 32 then costs 2 bytes of parameters, not 4.

``pack`` builds one from integer codes; ``dequantize`` and ``emulate`` are the pure torch
references the tests hold the kernels to.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LANES = 16
BITS = (4, 6, 8)
OFFSET6 = 32  # a 6-bit code is stored as q + 32


@dataclass(frozen=True)
class QuantWeight:
    """One quantized matrix in tile layout (see the module docstring)."""

    tiles: torch.Tensor  # uint8, [T * tile_bytes]
    scales: torch.Tensor  # float16, [T, G, 16] (int8 factors with ``supers``)
    zeros: torch.Tensor | None  # like ``scales``, or None
    out_features: int
    in_features: int
    group: int
    bits: int
    supers: torch.Tensor | None = None  # float16 [T, GS, Z, 16]
    per_super: int = 0  # groups per super-block (0: one level)

    @property
    def groups(self) -> int:
        return -(-self.in_features // self.group)

    @property
    def nbytes(self) -> int:
        params = (self.scales, self.zeros, self.supers)
        return self.tiles.numel() + sum(
            p.numel() * p.element_size() for p in params if p is not None
        )

    @property
    def kind(self) -> str:
        """``int4-g32``, ``int6-g16``, ``int4-g32/256`` (super-blocks of 256 inputs)...:
        what ``/v1/stats`` says about a linear."""
        tail = f"/{self.group * self.per_super}" if self.per_super else ""
        return f"int{self.bits}-g{self.group}{tail}"

    @property
    def kernel_params(self) -> dict[str, object]:
        """The kernels' keyword arguments for the two-level form (none for one level)."""
        return {"supers": self.supers, "per_super": self.per_super} if self.per_super else {}


def check_codes(q: torch.Tensor, bits: int) -> None:
    if bits not in BITS:
        raise ValueError(f"quantized weights are 4-, 6- or 8-bit, not {bits}")
    low, high = {4: (0, 15), 6: (-32, 31), 8: (-128, 127)}[bits]
    if q.numel() and (int(q.min()) < low or int(q.max()) > high):
        raise ValueError(f"{bits}-bit codes must lie in {low}..{high}")


def pack(
    q: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    group: int,
    bits: int,
    *,
    supers: tuple[torch.Tensor, torch.Tensor | None] | None = None,
    per_super: int = 0,
) -> QuantWeight:
    """Tiles from codes ``q [N, K]`` and per-group ``scales``/``zeros`` ``[N, ceil(K/group)]``;
    with ``supers`` (super-scales and super-zeros ``[N, ceil(G/per_super)]``), ``scales``
    and ``zeros`` are their int8 factors."""
    if group <= 0 or group % 8:
        raise ValueError(f"the group must be a positive multiple of 8, not {group}")
    if bits == 6 and group % 16:
        raise ValueError(f"6-bit groups are multiples of 16 inputs, not {group}")
    check_codes(q, bits)
    n, k = q.shape
    groups = -(-k // group)
    if scales.shape != (n, groups) or (zeros is not None and zeros.shape != (n, groups)):
        raise ValueError(f"scales and zeros must be [{n}, {groups}] for this weight")
    t = -(-n // LANES)
    k_pad = groups * group
    codes = torch.zeros(t * LANES, k_pad, dtype=torch.int16)
    codes[:n, :k] = q.to(torch.int16)
    if bits == 8:
        # [T, 16, K/4, 4] -> [T, K/4, 16, 4]: one step is 16 features x 4 inputs.
        steps = codes.view(t, LANES, k_pad // 4, 4).permute(0, 2, 1, 3)
        tiles = steps.to(torch.int8).contiguous().view(torch.uint8).reshape(-1)
    elif bits == 4:
        tiles = _nibbles(codes, t, k_pad).reshape(-1)
    else:
        stored = codes + OFFSET6
        low = _nibbles(stored & 0x0F, t, k_pad).view(t, k_pad // 16, 128)
        # [T, 16, K/16, 4 steps, 4] -> [T, K/16, 16, 4 inputs, 4 steps]: step s at bits 2s.
        top = (stored >> 4).view(t, LANES, k_pad // 16, 4, 4).permute(0, 2, 1, 4, 3)
        crumbs = (top << torch.tensor([0, 2, 4, 6], dtype=torch.int16)).sum(dim=-1)
        high = crumbs.to(torch.uint8).reshape(t, k_pad // 16, 64)
        tiles = torch.cat([low, high], dim=2).reshape(-1)

    def layout(v: torch.Tensor, dtype: torch.dtype = torch.float16) -> torch.Tensor:
        out = torch.zeros(t * LANES, v.shape[1], dtype=dtype)
        out[:n] = v.to(dtype)
        return out.view(t, LANES, v.shape[1]).transpose(1, 2).contiguous()

    if supers is None:
        if per_super:
            raise ValueError("per_super needs supers")
        params = (layout(scales), None if zeros is None else layout(zeros), None)
        return QuantWeight(tiles, *params[:2], n, k, group, bits)
    super_scales, super_zeros = supers
    tops = -(-groups // per_super) if per_super > 0 else 0
    if tops == 0 or super_scales.shape != (n, tops) or (zeros is None) != (super_zeros is None):
        raise ValueError(f"super-scales (and super-zeros with zeros) must be [{n}, {tops}]")
    for factors in (scales, zeros):
        if (
            factors is not None
            and factors.numel()
            and not -128 <= factors.min() <= factors.max() <= 127
        ):
            raise ValueError("two-level factors must be int8")
    levels = [layout(super_scales)]
    if super_zeros is not None:
        levels.append(layout(super_zeros))
    return QuantWeight(
        tiles,
        layout(scales, torch.int8),
        None if zeros is None else layout(zeros, torch.int8),
        n,
        k,
        group,
        bits,
        torch.stack(levels, dim=2).contiguous(),  # [T, GS, Z, 16]
        per_super,
    )


def _nibbles(codes: torch.Tensor, t: int, k_pad: int) -> torch.Tensor:
    """4-bit tiles of codes 0..15 ``[T * 16, K_pad]``: two steps per 64 bytes,
    ``[T, 16, K/8, 2, 4] -> [T, K/8, 16, 2, 4]``, the even step in the low nibbles."""
    pairs = codes.view(t, LANES, k_pad // 8, 2, 4).permute(0, 2, 1, 3, 4)
    return (pairs[..., 0, :] | (pairs[..., 1, :] << 4)).to(torch.uint8).contiguous()


def _unnibble(raw: torch.Tensor, t: int, k_pad: int) -> torch.Tensor:
    """``_nibbles``' inverse: ``[T * 16, K_pad]`` int16 codes 0..15."""
    raw = raw.reshape(t, k_pad // 8, LANES, 4).to(torch.int16)
    pairs = torch.stack([raw & 0x0F, raw >> 4], dim=3)  # [T, K/8, 16, 2, 4]
    return pairs.permute(0, 2, 1, 3, 4).reshape(t * LANES, k_pad)


def codes(w: QuantWeight) -> torch.Tensor:
    """The integer codes ``q [N, K]`` back out of the tiles (int16)."""
    t = -(-w.out_features // LANES)
    k_pad = w.groups * w.group
    if w.bits == 8:
        steps = w.tiles.view(torch.int8).view(t, k_pad // 4, LANES, 4).permute(0, 2, 1, 3)
        full = steps.reshape(t * LANES, k_pad).to(torch.int16)
    elif w.bits == 4:
        full = _unnibble(w.tiles, t, k_pad)
    else:
        planes = w.tiles.view(t, k_pad // 16, 192)
        low = _unnibble(planes[..., :128], t, k_pad)
        crumbs = planes[..., 128:].reshape(t, k_pad // 16, LANES, 4, 1).to(torch.int16)
        top = (crumbs >> torch.tensor([0, 2, 4, 6], dtype=torch.int16)) & 3  # [.., inputs, steps]
        high = top.permute(0, 2, 1, 4, 3).reshape(t * LANES, k_pad)
        full = (low | (high << 4)) - OFFSET6
    return full[: w.out_features, : w.in_features]


def _rows(v: torch.Tensor, n: int) -> torch.Tensor:
    """A ``[T, X, 16]`` layout back as ``[N, X]``."""
    return v.transpose(1, 2).reshape(-1, v.shape[1])[:n]


def pack_params(
    w: QuantWeight,
) -> tuple[torch.Tensor, torch.Tensor | None, tuple[torch.Tensor, torch.Tensor | None] | None]:
    """``pack``'s ``scales``, ``zeros`` and ``supers`` of ``w``, per row."""
    n = w.out_features
    scales, zeros = _rows(w.scales, n), None if w.zeros is None else _rows(w.zeros, n)
    if w.supers is None:
        return scales, zeros, None
    top = [_rows(w.supers[:, :, z], n) for z in range(w.supers.shape[2])]
    return scales, zeros, (top[0], top[1] if len(top) > 1 else None)


def select_rows(w: QuantWeight, index: torch.Tensor) -> QuantWeight:
    """``w``'s rows ``index`` (a permutation, say), in the same form."""
    scales, zeros, supers = pack_params(w)
    return pack(
        codes(w)[index],
        scales[index],
        None if zeros is None else zeros[index],
        w.group,
        w.bits,
        supers=None
        if supers is None
        else (supers[0][index], None if supers[1] is None else supers[1][index]),
        per_super=w.per_super,
    )


def group_params(w: QuantWeight) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scales and zeros as ``[N, G]`` float32 (two-level: the float32 products)."""
    scales, zeros, supers = pack_params(w)
    if supers is None:
        return scales.float(), None if zeros is None else zeros.float()

    def product(factors: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
        return factors.float() * top.float().repeat_interleave(w.per_super, dim=1)[:, : w.groups]

    return product(scales, supers[0]), None if zeros is None else product(zeros, supers[1])


def dequantize(w: QuantWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``W [N, K]`` in float32 arithmetic, then ``dtype``: the reference for every kernel."""
    s, z = group_params(w)
    expand = lambda v: v.repeat_interleave(w.group, dim=1)[:, : w.in_features]  # noqa: E731
    full = codes(w).float() * expand(s)
    if z is not None:
        full = full + expand(z)
    return full.to(dtype)


def quantize_activations(
    x: torch.Tensor, group: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the integer kernels do to bfloat16 rows: per group, ``scale = max|x| / 127`` and
    ``q = round(x * (127 / max|x|))``; returns ``(q [M, K_pad], scale [M, G], sum [M, G])``."""
    m, k = x.shape
    groups = -(-k // group)
    xf = torch.zeros(m, groups * group)
    xf[:, :k] = x.float()
    blocks = xf.view(m, groups, group)
    amax = blocks.abs().amax(dim=2)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    q = torch.round(blocks * inv[..., None]).clamp_(-127, 127)
    return q.view(m, -1), amax / 127.0, blocks.sum(dim=2)


def emulate(w: QuantWeight, x: torch.Tensor) -> torch.Tensor:
    """The integer path's result for bfloat16 rows ``x [M, K]`` in float32: activations
    quantized as the kernel does, exact integer dots, float32 scales."""
    xq, xs, xsum = quantize_activations(x, w.group)
    k_pad = w.groups * w.group
    q = torch.zeros(w.out_features, k_pad)
    q[:, : w.in_features] = codes(w).float()
    dots = torch.einsum(
        "mgk,ngk->mng",
        xq.view(len(x), w.groups, w.group).double(),
        q.view(-1, w.groups, w.group).double(),
    )
    s, z = group_params(w)
    out = (dots * (s[None] * xs[:, None, :]).double()).sum(dim=2)
    if z is not None:
        out = out + (z[None].double() * xsum[:, None, :].double()).sum(dim=2)
    return out.float()
