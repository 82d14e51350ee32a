"""The ``hearth`` attention implementation for transformers models.

It is SDPA with grouped-query attention done inside the kernel (``enable_gqa``), also
when a mask is present. transformers' own SDPA path expands the KV heads with
``repeat_kv`` whenever a mask is given on CPU, which copies the whole cache once per
layer: for a warm 25-token suffix on a 4k-token cached prefix that copy costs about as
much as the attention itself. Anything unusual (soft-capping, attention sinks, position
bias) falls back to transformers' SDPA unchanged.
"""

from __future__ import annotations

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
    if dropout or any(kwargs.get(name) is not None for name in _UNUSUAL):
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


def register() -> str:
    """Register the implementation with transformers (idempotent); returns its name."""
    AttentionInterface.register(NAME, hearth_attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME
