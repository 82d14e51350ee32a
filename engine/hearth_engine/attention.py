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
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "hearth"
_UNUSUAL = ("softcap", "position_bias", "s_aux", "sinks", "sliding_window")


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
    parts = getattr(_ACTIVE, "parts", None)
    unusual = dropout or any(kwargs.get(name) is not None for name in _UNUSUAL)
    if parts:
        if unusual:
            raise RuntimeError("shared-prefix attention does not support this model's attention")
        layer = getattr(module, "layer_idx", None)
        if layer is None:
            raise RuntimeError("shared-prefix attention needs the module's layer_idx")
        return merged_attention(query, key, value, attention_mask, scaling, parts, layer), None
    if unusual:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs
        )
    q_len = query.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
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
    return out.transpose(1, 2).contiguous(), None  # [B, Q, Hq, D]


@dataclass(frozen=True)
class PrefixPart:
    """Cached KV that some rows of a batch read in place: it precedes their own KV.

    ``segment`` is ``[L, 2, H, T, D]`` (a view of a cache node's payload); ``rows`` are
    the batch rows that read it (``None``: all of them).
    """

    segment: torch.Tensor
    rows: torch.Tensor | None = None

    @property
    def tokens(self) -> int:
        return int(self.segment.shape[3])


_ACTIVE = threading.local()


@contextlib.contextmanager
def shared_prefix(parts: Sequence[PrefixPart]) -> Iterator[None]:
    """Make ``parts`` visible to attention for forward passes on this thread."""
    previous = getattr(_ACTIVE, "parts", None)
    _ACTIVE.parts = tuple(parts)
    try:
        yield
    finally:
        _ACTIVE.parts = previous


def _own_scores(
    q: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, scale: float, groups: int
) -> torch.Tensor:
    """Scores of ``q`` ``[B, Hkv, g*Q, D]`` against the working KV, masked: ``[B, Hkv, gQ, S]``."""
    b, hkv, gq, _ = q.shape
    s_len = key.shape[2]
    q_len = gq // groups
    scores = torch.matmul(q, key.transpose(-1, -2)).mul_(scale)
    view = scores.view(b, hkv, groups, q_len, s_len)
    if mask is None:
        if q_len > 1:  # causal, aligned bottom-right (the queries are the last Q keys)
            rows = torch.arange(q_len, device=q.device)[:, None]
            cols = torch.arange(s_len, device=q.device)[None, :]
            view.masked_fill_(cols > rows + (s_len - q_len), float("-inf"))
    elif mask.dtype == torch.bool:
        view.masked_fill_(~mask[:, :, None, :, -s_len:], float("-inf"))
    else:
        view.add_(mask[:, :, None, :, -s_len:].to(scores.dtype))
    return scores


def merged_attention(  # noqa: PLR0917 - the attention call's own arguments
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None,
    parts: Sequence[PrefixPart],
    layer: int,
) -> torch.Tensor:
    """Attention over shared prefix parts plus the working KV; returns ``[B, Q, Hq, D]``."""
    b, hq, q_len, d = query.shape
    hkv = key.shape[1]
    groups = hq // hkv
    scale = scaling if scaling is not None else d**-0.5
    exact = query.dtype in {torch.float32, torch.float64}
    work = query.dtype if exact else torch.float32
    q = query.to(work).reshape(b, hkv, groups * q_len, d)
    scores = _own_scores(q, key.to(work), attention_mask, scale, groups)
    top = scores.amax(-1, keepdim=True)  # [B, Hkv, gQ, 1]
    probs = torch.exp(scores - top)
    total = probs.sum(-1, keepdim=True)
    acc = torch.matmul(probs, value.to(work))  # [B, Hkv, gQ, D]
    for part in parts:
        k = part.segment[layer, 0].to(work)  # [Hkv, T, D]
        v = part.segment[layer, 1].to(work)
        idx = part.rows
        qs = q if idx is None else q.index_select(0, idx)
        n = qs.shape[0]
        qp = qs.permute(1, 0, 2, 3).reshape(hkv, n * groups * q_len, d)
        s = torch.bmm(qp, k.transpose(1, 2)).mul_(scale)  # [Hkv, n*gQ, T]
        m = s.amax(-1, keepdim=True)
        p = torch.exp(s - m)
        ps = p.sum(-1, keepdim=True)
        pa = torch.bmm(p, v)

        def back(t: torch.Tensor, n: int = n) -> torch.Tensor:
            return t.reshape(hkv, n, groups * q_len, -1).permute(1, 0, 2, 3)

        m, ps, pa = back(m), back(ps), back(pa)
        old_top = top if idx is None else top.index_select(0, idx)
        new_top = torch.maximum(old_top, m)
        keep, add = torch.exp(old_top - new_top), torch.exp(m - new_top)
        if idx is None:
            acc = acc * keep + pa * add
            total = total * keep + ps * add
            top = new_top
        else:
            acc.index_copy_(0, idx, acc.index_select(0, idx) * keep + pa * add)
            total.index_copy_(0, idx, total.index_select(0, idx) * keep + ps * add)
            top.index_copy_(0, idx, new_top)
    out = (acc / total).to(query.dtype).view(b, hq, q_len, d)
    return out.transpose(1, 2).contiguous()


def register() -> str:
    """Register the implementation with transformers (idempotent); returns its name."""
    AttentionInterface.register(NAME, hearth_attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME
