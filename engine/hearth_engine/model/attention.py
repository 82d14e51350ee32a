r"""The ``hearth`` attention implementation for transformers models.

It is SDPA with grouped-query attention done inside the kernel (``enable_gqa``), also
when a mask is present. transformers' own SDPA path expands the KV heads with
``repeat_kv`` whenever a mask is given on CPU, which copies the whole cache once per
layer: for a warm 25-token suffix on a 4k-token cached prefix that copy costs about as
much as the attention itself. Anything unusual (soft-capping, attention sinks, position
bias) falls back to transformers' SDPA unchanged.

**Shared prefixes.** A sequence whose prompt starts with cached tokens does not copy
their KV into its working buffer: the runner lists the cache's segments (views of the
radix-tree payloads) as ``PrefixPart``\ s for the forward pass, and attention reads
them in place. Queries attend to each part and to the working buffer separately; the
partial softmaxes are merged exactly (running max and sum, as in flash attention's
online softmax). A part read by several rows of a decode batch (the house prompt every
request shares) is read from memory once for all of them, and memory holds one copy of
it, however many requests run.

The parts reach this function as the ``hearth_prefix_parts`` keyword of the model's
forward: transformers passes a forward's extra keywords down through the decoder
layers to the attention function (checked for Llama and Qwen2 in transformers 5.24).

**Sliding-window layers** (Gemma 3; ``sliding_window`` reaches the attention function
as a keyword): a query at position ``p`` sees keys at positions ``> p - W``, the rule
of transformers' masks. The working KV is windowed by the mask transformers builds for
the layer; the prefix parts, which that mask does not cover, are windowed here from the
queries' absolute positions (``hearth_positions``) and each part's start: only the keys
some query can see are read, so a sliding layer reads the last ``W`` tokens of a long
prefix, and a part wholly behind the window is skipped.

**Precision.** The merge runs in float32 (float64 for float64 models). The CPU flash
kernel returns each partial output in the model's dtype, so in bfloat16 each partial
is rounded once before the merge; computing the partials in float32 would mean
converting the whole shared KV for every layer and step. Measured on SmolLM2-135M in
bfloat16 (logits against a float32 run, 6 prompts): the read-in-place path is no
further from float32 than a cold prefill (RMS 0.12 against 0.10-0.16; 0.09 with
float32 partials). In greedy text (``scripts/bench agreement``, 100 prompts) a cache
hit matched the cold run 74 times, a cold run chunked differently 76 times: the
rounding may cost a little; see the bench before changing this path.

**Decode steps** (one query token per row, no sliding window) go to Hearth's C++ kernel
(``kernels/decode_attention.cpp`` via ``native.py``) once it is built: one call per
layer reads each cached key once for all grouped heads and rows, split over threads, in
float32, and rounds once. Until it is ready, or where it cannot be built, the torch path
below serves, with the same results up to float32 rounding.

**Prefill over a part** (many queries, no mask: a warm request's own tokens over the
pinned house) goes, in bfloat16 on a CPU with AVX512-BF16, to
``kernels/prefix_attention.cpp``: on a CPU with AMX-BF16 its two products run on AMX
tiles (``kernels/prefix_amx.h``), elsewhere in bf16 dot products (VDPBF16PS); float32
scores and sums, the weights rounded to bf16 as the flash kernel does; its float32
partial is merged like the others. With the tiles switched off (``HEARTH_AMX=0``) on a
CPU that has them, and where the kernel is not built, torch's flash kernel serves (see
``native_prefix``). The same kernel takes such a chunk's own keys, under the causal mask
(``causal_tokens``), where torch's flash kernel needed a mask tensor built per layer. In
float32 (a CPU without native bf16) both go to its float32 kernel
(``kernels/prefix_f32.h``, AVX2 and FMA) where the build has no AVX-512.

Hearth's lean forward (decoder.py) calls ``merged_attention`` and ``plain_attention``
directly; the ``hearth`` attention implementation serves transformers' forward.
``self_test.check_shared_prefix`` bounds it on every model at start-up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from . import native
from .hardware import cpu_has_amx_bf16

NAME = "hearth"
PARTS_KWARG = "hearth_prefix_parts"
# The absolute positions ``[B, Q]`` of the queries, passed with the parts: a sliding
# layer needs them to place the parts' keys against its window.
POSITIONS_KWARG = "hearth_positions"
_UNUSUAL = ("softcap", "position_bias", "s_aux", "sinks")


def hearth_attention_forward(  # noqa: PLR0917 - signature fixed by transformers
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, Hq, Q, D]
    key: torch.Tensor,  # [B, Hkv, K, D]
    value: torch.Tensor,  # [B, Hkv, K, D]
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    parts: Sequence[PrefixPart] | None = kwargs.pop(PARTS_KWARG, None)
    positions: torch.Tensor | None = kwargs.pop(POSITIONS_KWARG, None)
    # A sliding layer's own KV is windowed by the mask transformers builds for it (a
    # window the buffer cannot exceed leaves no mask, as causal needs none); only the
    # prefix parts need the window applied here.
    window: int | None = kwargs.pop("sliding_window", None)
    unusual = dropout or any(kwargs.get(name) is not None for name in _UNUSUAL)
    if parts:
        if unusual:
            raise RuntimeError("shared-prefix attention does not support this model's attention")
        layer = getattr(module, "layer_idx", None)
        if layer is None:
            raise RuntimeError("shared-prefix attention needs the module's layer_idx")
        if window is None:
            out = merged_attention(query, key, value, attention_mask, scaling, parts, layer)
        else:
            if positions is None:
                raise RuntimeError("sliding-window attention over prefix parts needs positions")
            out = merged_attention(
                query,
                key,
                value,
                attention_mask,
                scaling,
                parts,
                layer,
                window=window,
                positions=positions,
            )
        return out, None
    if window is not None:
        kwargs["sliding_window"] = window
    if unusual:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs
        )
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    return plain_attention(query, key, value, attention_mask, scaling, causal=causal), None


def plain_attention(  # noqa: PLR0917
    query: torch.Tensor,  # [B, Hq, Q, D]
    key: torch.Tensor,  # [B, Hkv, K, D]
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None,
    causal: bool = True,
) -> torch.Tensor:
    """SDPA with grouped heads in the kernel; returns ``[B, Q, Hq, D]``."""
    fast = native_decode(query, key, value, attention_mask, scaling, ())
    if fast is not None:
        return fast
    q_len = query.shape[2]
    causal = bool(q_len > 1 and attention_mask is None and causal)
    if causal and key.shape[2] > q_len:
        # A causal mask in SDPA is aligned top-left; only valid when Q == K.
        raise RuntimeError("causal attention over a past without a mask")
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        scale=scaling,
        is_causal=causal,
        enable_gqa=query.shape[1] != key.shape[1],
    )
    return out.transpose(1, 2).contiguous()


@dataclass(frozen=True)
class PrefixPart:
    """Cached KV that some rows of a batch read in place: it precedes their own KV.

    ``segment`` is ``[L, 2, H, T, D]`` (a view of a cache node's payload); ``rows`` are
    the batch rows that read it (``None``: all of them). ``layers`` are the model's KV
    layers it holds, in order (``None``: all); the others do not read it. ``start`` is
    the absolute position of its first token (``None``: where the rows' earlier parts
    end). A model that trims its windows has both kinds: segments of its full layers,
    and one part of its sliding layers' last tokens (``KVManager``).
    """

    segment: torch.Tensor
    rows: torch.Tensor | None = None
    layers: tuple[int, ...] | None = None
    start: int | None = None

    def kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Keys and values ``[H, T, D]`` of model KV layer ``layer`` (None: not held)."""
        if self.layers is None:
            return self.segment[layer, 0], self.segment[layer, 1]
        if layer not in self.layers:
            return None
        i = self.layers.index(layer)
        return self.segment[i, 0], self.segment[i, 1]


def part_starts(parts: Sequence[PrefixPart], rows: int) -> list[int]:
    """The absolute position of each part's first token, for a batch of ``rows`` rows.

    A row's parts are the radix-tree path of its prompt, listed in path order (the
    runner lists one row's segments in order; ``DecodeBatch`` lists each distinct
    segment once, at its first reader, and a segment's ancestors come before it in
    every row that reads it). So a part starts where the earlier parts of its rows end,
    and that is the same for all of them (a node's depth): checked, never assumed.
    """
    ends = [0] * rows
    starts = []
    for part in parts:
        if part.start is not None:
            starts.append(part.start)
            continue
        members = range(rows) if part.rows is None else [int(r) for r in part.rows.tolist()]
        start = ends[members[0]]
        if any(ends[r] != start for r in members):
            raise RuntimeError("prefix parts are not listed in path order")
        end = start + int(part.segment.shape[3])
        for r in members:
            ends[r] = end
        starts.append(start)
    return starts


# A decode step's working-KV partial, up to this many scores per (row, KV head), is
# computed in float32 (3 grouped heads x ~20k own tokens). A prefill chunk's goes to the
# flash kernel: in float32, a warm 108-token request's own attention took 0.58 ms a
# layer against 0.20 (2-vCPU Xeon), a tenth of its prefill, for a partial that the
# merge weighs by the share of the keys it holds (108 of the house's 6,400).
EXACT_OWN_SCORES = 1 << 16
# Keys per slice, at least, when a long unmasked KV is split over threads (_kv_chunks).
SPLIT_MIN_TOKENS = 512
# The CPU flash kernel behind SDPA, which also returns the log-sum-exp that merging needs.
_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _partials(  # noqa: PLR0917
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    exact: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention with equal head counts, as unmerged partials over slices of the
    keys: ``q`` ``[B, H, N, D]``, ``k``/``v`` ``[B, H, T, D]``, ``mask`` additive
    ``[B|1, 1, N, T]`` or ``None``.

    Returns outputs ``[P, B, H, N, D]`` and log-sum-exps ``[P, B, H, N, 1]`` of ``P``
    slices (see ``merge``), in the merge dtype (float32, or float64 for float64 inputs).
    ``exact`` computes in that dtype throughout (the CPU kernel rounds its output to the
    input dtype).
    """
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    if not exact and mask is None and q.shape[0] == 1:
        fast = native_prefix(q, k, v, scale)
        if fast is not None:
            return fast
    if not exact and q.device.type == "cpu" and _FLASH_CPU is not None:
        if mask is None and q.shape[0] == 1:
            chunks = _kv_chunks(k.shape[2])
            if chunks > 1:
                return _split_partials(q, k, v, scale, chunks, work)
        out, lse = _FLASH_CPU(q, k, v, 0.0, False, attn_mask=mask, scale=scale)[:2]
        return out.to(work)[None], lse.unsqueeze(-1).to(work)[None]
    scores = torch.matmul(q.to(work), k.to(work).transpose(-1, -2)).mul_(scale)
    if mask is not None:
        scores = scores + mask.to(work)
    # Softmax by hand, to keep its sum: torch.logsumexp costs ~50 us a call on CPU for
    # these tiny tensors (a decode step makes one per layer).
    top = scores.amax(-1, keepdim=True)
    weights = torch.exp(scores - top)
    total = weights.sum(-1, keepdim=True)
    out = torch.matmul(weights, v.to(work)).div_(total)
    return out[None], (top + torch.log(total))[None]


def native_prefix(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal_tokens: int = 0
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``_partials`` of one unmasked part through the native kernel
    (``kernels/prefix_attention.cpp``, bf16 or float32): ``q`` ``[1, H, N, D]``,
    ``k``/``v`` ``[1, H, T, D]``.
    With ``causal_tokens`` Q: ``q`` is a chunk's own Q tokens (``N = g * Q``, grouped heads
    folded in) over their own keys ``k``/``v``, the last Q of them theirs, under the causal
    mask ``_own_mask`` builds (a warm 85-token suffix of the default model: 124 us a layer
    against 274 us through torch's flash kernel and that mask, on a 2-vCPU EPYC).
    ``None`` where it cannot serve: no kernel, a dtype it does not take first
    (``_prefix_kernel_serves``), another head size or layout; on a CPU with AMX whose tiles
    are switched off, torch's flash kernel (which multiplies on them) is faster than the
    vector path.
    On a 2-core EPYC (AVX512-BF16, no AMX), 288 queries (96 tokens, 3 grouped heads) over
    a 6,300-token part of 3 KV heads: 4.9 ms against 11.1 ms through torch's flash
    kernel; the result is float32, not rounded to bf16 as the flash kernel's is. On a
    2-vCPU Xeon with AMX, 100 tokens of the default model over the 6,300-token house: the
    tiles 2.7-3.0 ms against 3.3-4.1 ms through torch's (split over the threads) and 9-11
    ms on the vector path; 100 tokens of the 1.5B's heads 5.0-5.7 against 5.3-6.7 ms."""
    kernels = native.module()
    if (
        kernels is None
        or q.device.type != "cpu"
        or not q.dtype == k.dtype == v.dtype
        or q.shape[3] not in native.PREFIX_HEAD_SIZES
        or q.stride(-1) != 1
        or k.stride(-1) != 1
        or v.stride(-1) != 1
        or not _prefix_kernel_serves(kernels, q.dtype)
    ):
        return None
    try:
        out, lse = kernels.prefix_attention(q[0], k[0], v[0], scale, causal_tokens)
    except RuntimeError as err:  # a call the kernel refuses: torch serves from now on
        native.disable(str(err).splitlines()[0])
        return None
    return out[None, None], lse[None, None, ..., None]


def _prefix_kernel_serves(kernels: Any, dtype: torch.dtype) -> bool:
    """Whether the native prefix kernel takes ``dtype`` ahead of torch's flash kernel.

    bfloat16: where built (AVX512-BF16), except on a CPU with AMX whose tiles are off.
    float32 (``kernels/prefix_f32.h``, AVX2 and FMA): where the build has no AVX-512, as
    on an N100, where torch's flash kernel is no wider. The default model's 85 tokens over
    its 3,200-token house, a layer, on two Zen 4 cores as the ``avx2`` class: 3.8 against
    5.3 ms. (With AVX-512 on the same cores, 3.7 against torch's 4.2 ms; on Intel's
    server cores, whose AVX-512 is twice as wide as their AVX2, not measured.)"""
    if dtype == torch.bfloat16:
        amx_off = _FLASH_CPU is not None and cpu_has_amx_bf16() and not kernels.attention_amx()
        return bool(kernels.prefix_attention_ready()) and not amx_off
    return dtype == torch.float32 and bool(kernels.prefix_attention_f32_first())


def merge(outs: torch.Tensor, lses: torch.Tensor) -> torch.Tensor:
    """Exact softmax merge of partials over disjoint keys (flash attention's rescaling):
    outputs ``[P, ...]`` weighted by the softmax of their log-sum-exps over ``P``."""
    if outs.shape[0] == 1:
        return outs[0]
    return (outs * torch.softmax(lses, 0)).sum(0)


def _kv_chunks(tokens: int) -> int:
    """How many slices of a long KV to attend to in one kernel call (split-K).

    The CPU flash kernel spreads its work over batch x heads only: a decode step of a
    3-KV-head model keeps one of two threads idle for a third of the time, and each
    thread reads its heads' whole KV. Slicing the keys into a batch of chunks lets every
    thread read a share of the cache; the chunks' partials are merged exactly like
    prefix parts. Measured on 2 threads, 30 layers of a 5,400-token SmolLM2 prefix in
    bfloat16: 29 ms in one piece, 12 ms in 2 or 4 chunks.
    """
    threads = torch.get_num_threads()
    if tokens < 2 * SPLIT_MIN_TOKENS or threads == 1:  # one thread gains nothing from it
        return 1
    most = max(2, min(2 * threads, tokens // SPLIT_MIN_TOKENS))
    # An even split needs no extra kernel call for the remainder.
    even = [n for n in range(most, max(1, most // 2), -1) if tokens % n == 0]
    return even[0] if even else most


def _split_partials(  # noqa: PLR0917
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    chunks: int,
    work: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``_partials`` of ``chunks`` equal slices of the keys, in one kernel call (``q``
    ``[1, H, N, D]``); the remainder of an uneven split is one more slice."""
    _, h, n, d = q.shape
    total = k.shape[2]
    size = total // chunks
    even = size * chunks

    def sliced(x: torch.Tensor) -> torch.Tensor:  # [1, H, even, D] -> [chunks, H, size, D]
        return x[0, :, :even].unflatten(1, (chunks, size)).transpose(0, 1)

    outs, lses = _FLASH_CPU(
        q.expand(chunks, h, n, d), sliced(k), sliced(v), 0.0, False, scale=scale
    )[:2]
    outs, lses = outs.to(work), lses.unsqueeze(-1).to(work)  # [chunks, H, N, D|1]
    if even < total:
        rest, rest_lse = _FLASH_CPU(q, k[:, :, even:], v[:, :, even:], 0.0, False, scale=scale)[:2]
        outs = torch.cat([outs, rest.to(work)])
        lses = torch.cat([lses, rest_lse.unsqueeze(-1).to(work)])
    return outs[:, None], lses[:, None]  # [P, 1, H, N, D|1]


def _own_mask(
    mask: torch.Tensor | None, q_len: int, s_len: int, groups: int, dtype: torch.dtype
) -> torch.Tensor | None:
    """The working-KV mask as an additive ``[B|1, 1, g*Q, S]`` tensor (GQA folded)."""
    if mask is None:
        if q_len == 1:
            return None
        # Causal, aligned bottom-right: the queries are the last Q of the S keys.
        rows = torch.arange(q_len)[:, None]
        cols = torch.arange(s_len)[None, :]
        mask = (cols <= rows + (s_len - q_len))[None, None]
    mask = mask[..., -s_len:]
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
            ~mask, float("-inf")
        )
    b = mask.shape[0]
    folded = mask.to(dtype)[:, :, None].expand(b, 1, groups, q_len, s_len)
    return folded.reshape(b, 1, groups * q_len, s_len)


def merged_attention(  # noqa: PLR0917 - the attention call's own arguments
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None,
    parts: Sequence[PrefixPart],
    layer: int,
    *,
    window: int | None = None,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention over shared prefix parts plus the working KV; returns ``[B, Q, Hq, D]``.

    Grouped-query heads are folded into the query axis (``[B, Hkv, g*Q, D]``), and a
    part read by ``n`` rows folds those rows in too, so its KV is read once for all.

    ``window`` (a sliding layer): a query at position ``p`` sees the keys at positions
    ``> p - window`` only (transformers' ``sliding_window_overlay``: the window holds
    ``window`` tokens, the query's own included). ``positions`` ``[B, Q]`` are the
    queries' absolute positions; the own KV is windowed by ``attention_mask`` already.
    """
    if window is None:
        fast = native_decode(query, key, value, attention_mask, scaling, parts, layer)
        if fast is not None:
            return fast
    b, hq, q_len, d = query.shape
    hkv = key.shape[1]
    groups = hq // hkv
    n_q = groups * q_len
    scale = scaling if scaling is not None else d**-0.5
    q = query.reshape(b, hkv, n_q, d)
    # A warm chunk's own keys, causal, through the native kernel where it serves.
    causal = attention_mask is None and b == 1 and q_len > 1  # the plain causal mask
    own = native_prefix(q, key, value, scale, q_len) if causal else None
    if own is None:
        mask = _own_mask(attention_mask, q_len, key.shape[2], groups, query.dtype)
        if mask is not None:
            mask = mask.to(query.device)
        # A decode step's working KV is short: its partial is computed in float32 there,
        # so a bf16 result is rounded once less than the kernel would.
        exact = q_len == 1 and key.shape[2] * n_q <= EXACT_OWN_SCORES
        own = _partials(q, key, value, mask, scale, exact)  # float32 from here on
    outs, lses = [], []
    outs.append(own[0])
    lses.append(own[1])
    starts = part_starts(parts, b) if window is not None else [0] * len(parts)
    for part, start in zip(parts, starts, strict=True):
        held = part.kv(layer)
        idx = part.rows
        if held is None or (idx is not None and idx.numel() == 0):  # no row reads it
            continue
        qs = q if idx is None else q.index_select(0, idx)
        n = qs.shape[0]
        folded = qs.permute(1, 0, 2, 3).reshape(1, hkv, n * n_q, d)
        k, v = held[0][None], held[1][None]  # [1, Hkv, T, D]
        if window is None or positions is None:
            out, part_lse = _partials(folded, k, v, None, scale)  # [P, 1, Hkv, n*g*Q, D|1]
        else:
            rows_pos = positions if idx is None else positions.index_select(0, idx)
            windowed = _window_partials(folded, k, v, scale, rows_pos, start, window, groups)
            if windowed is None:  # the whole part is behind every query's window
                continue
            out, part_lse = windowed
        slices = out.shape[0]
        out = out.reshape(slices, hkv, n, n_q, d).transpose(1, 2)  # [P, n, Hkv, g*Q, D]
        part_lse = part_lse.reshape(slices, hkv, n, n_q, 1).transpose(1, 2)
        if idx is not None:  # the other rows get an empty partial: weight exp(-inf) = 0
            full = out.new_zeros(slices, b, hkv, n_q, d)
            full_lse = part_lse.new_full((slices, b, hkv, n_q, 1), float("-inf"))
            full[:, idx], full_lse[:, idx] = out, part_lse
            out, part_lse = full, full_lse
        outs.append(out)
        lses.append(part_lse)
    acc = merge(torch.cat(outs), torch.cat(lses))
    out = acc.to(query.dtype).view(b, hq, q_len, d)
    return out.transpose(1, 2).contiguous()


def own_keep(mask: torch.Tensor, rows: int, keys: int) -> torch.Tensor:
    """The decode kernel's padding mask ``[rows, keys]``: the last ``keys`` columns of a
    step's ``[B, K]`` mask (the own KV's), one row per query row."""
    keep = mask[:, -keys:]
    return keep if keep.shape[0] == rows else keep.expand(rows, -1)


def native_decode(  # noqa: PLR0917 - the attention call's own arguments
    query: torch.Tensor,  # [B, Hq, 1, D]
    key: torch.Tensor,  # [B, Hkv, S, D]
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,  # [B, 1, 1, >=S] bool, or None
    scaling: float | None,
    parts: Sequence[PrefixPart],
    layer: int = 0,
) -> torch.Tensor | None:
    """A one-token step through the native kernel, ``[B, 1, Hq, D]``; ``None`` when the
    kernel is not loaded or cannot take this call (the caller runs the torch path)."""
    kernels = native.module()
    if (
        kernels is None
        or query.shape[2] != 1
        or query.device.type != "cpu"
        or query.dtype not in native.DTYPES
        or query.shape[3] not in native.HEAD_SIZES
        or (attention_mask is not None and attention_mask.dtype != torch.bool)
        or key.stride(-1) != 1
        or value.stride(-1) != 1
    ):
        return None
    keep = None
    if attention_mask is not None:
        keep = own_keep(attention_mask[:, 0, 0], query.shape[0], key.shape[2])
    d = query.shape[3]
    held = [(part, kv) for part in parts if (kv := part.kv(layer)) is not None]
    try:
        out = kernels.decode_attention(
            query[:, :, 0],
            key,
            value,
            keep,
            [kv[0] for _, kv in held],
            [kv[1] for _, kv in held],
            [part.rows for part, _ in held],  # None: all rows
            scaling if scaling is not None else d**-0.5,
        )
    except RuntimeError as err:  # a call the kernel refuses: torch serves from now on
        native.disable(str(err).splitlines()[0])
        return None
    return out[:, None]


def _window_partials(  # noqa: PLR0917
    q: torch.Tensor,  # [1, Hkv, n*g*Q, D], folded as (row, group, query)
    k: torch.Tensor,  # [1, Hkv, T, D]
    v: torch.Tensor,
    scale: float,
    positions: torch.Tensor,  # [n, Q] absolute query positions of the part's rows
    start: int,
    window: int,
    groups: int,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``_partials`` of one prefix part under a sliding window; None if no query sees it.

    Only the keys inside some query's window are read (a sliding layer of a long prefix
    reads its last ``window`` tokens, not the whole part). A query whose window holds
    none of the part's keys gets an empty partial (weight 0 in the merge).
    """
    total = k.shape[2]
    # Part key j is seen by a query at p iff start + j > p - window.
    first_seen = positions.to(torch.long) - (start + window - 1)  # [n, Q]
    lo = max(0, int(first_seen.min()))
    if lo >= total:
        return None
    k, v = k[:, :, lo:], v[:, :, lo:]
    if int(first_seen.max()) <= lo:  # every query sees every key read
        return _partials(q, k, v, None, scale)
    cols = torch.arange(lo, total, device=positions.device)
    keep = cols[None, None, :] >= first_seen.to(positions.device)[:, :, None]  # [n, Q, T']
    n, q_len, t = keep.shape
    keep = keep[:, None].expand(n, groups, q_len, t).reshape(1, 1, n * groups * q_len, t)
    return _masked_partials(q, k, v, keep.to(q.device), scale)


def _masked_partials(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact partials under a boolean ``keep`` mask where a query may see no key at all:
    its output is 0 and its log-sum-exp -inf (the flash kernel would give NaN)."""
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    scores = torch.matmul(q.to(work), k.to(work).transpose(-1, -2)).mul_(scale)
    scores = scores.masked_fill(~keep, float("-inf"))
    top = scores.amax(-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    weights = torch.exp(scores - top)
    total = weights.sum(-1, keepdim=True)
    out = torch.matmul(weights, v.to(work)).div_(total.clamp_min(torch.finfo(work).tiny))
    return out[None], (top + torch.log(total))[None]


def register() -> str:
    """Register the implementation with transformers (idempotent); returns its name."""
    AttentionInterface.register(NAME, hearth_attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME
