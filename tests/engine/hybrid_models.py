"""Tiny random hybrid models (state layers beside attention), saved as users' folders.

One per kind of state layer transformers 5.24 ships, each with its own config class:

* ``qwen3_5``: Qwen3.5's gated delta-rule linear attention (a conv window and a
  recurrent matrix per layer), three linear layers per full-attention one;
* ``lfm2``: LFM2's short convolutions (a conv window, no recurrent matrix);
* ``granite``: Granite 4's Mamba-2 layers (conv window and SSM state) with a small
  mixture of experts.

The tokenizer (and chat template) is the tiny model's. Weights are scaled up, as in
``sliding_model.py``, so greedy choices differ between nearby logits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .random_models import save_random_model

KINDS: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3_5": (
        "qwen3_5_text",
        {
            "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "linear_num_key_heads": 2,
            "linear_num_value_heads": 4, "linear_key_head_dim": 16,
            "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4,
            "layer_types": ["linear_attention", "full_attention"] + ["linear_attention"] * 2,
        },
    ),
    "lfm2": (
        "lfm2",
        {
            "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
            "num_key_value_heads": 2, "conv_L_cache": 3, "full_attn_idxs": [1],
            "block_auto_adjust_ff_dim": False,
        },
    ),
    "granite": (
        "granitemoehybrid",
        {
            "hidden_size": 64, "intermediate_size": 32, "shared_intermediate_size": 64,
            "num_local_experts": 4, "num_experts_per_tok": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "mamba_n_heads": 4, "mamba_d_head": 32,
            "mamba_d_state": 16, "mamba_n_groups": 1, "mamba_d_conv": 4, "mamba_expand": 2,
            "mamba_chunk_size": 16, "position_embedding_type": "nope",
            "layer_types": ["mamba", "attention", "mamba", "mamba"],
        },
    ),
}  # fmt: skip
LAYERS = 4


def save_hybrid_model(kind: str, folder: Path) -> Path:
    """Build (seeded) and save one hybrid model and the tokenizer into ``folder``."""
    model_type, values = KINDS[kind]
    return save_random_model(
        folder,
        model_type,
        scale=4.0,
        num_hidden_layers=LAYERS,
        max_position_embeddings=2048,
        **values,
    )
