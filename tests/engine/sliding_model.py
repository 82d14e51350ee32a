"""A tiny random Gemma 3 text model with a short sliding window, saved as a user's folder.

Gemma 3's own config class (``gemma3_text``), layers alternating sliding and full
attention, a window of ``WINDOW`` tokens: prompts of a few dozen tokens make the window
slide inside a cached prefix and inside the suffix. The tokenizer (and its chat
template) is the tiny model's.
"""

from __future__ import annotations

from pathlib import Path

from .random_models import save_random_model

WINDOW = 8
LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"]


def save_sliding_model(folder: Path) -> Path:
    """Build (seeded) and save the model and tokenizer into ``folder``; returns it."""
    return save_random_model(
        folder,
        "gemma3_text",
        scale=4.0,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=len(LAYER_TYPES),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=WINDOW,
        layer_types=LAYER_TYPES,
        max_position_embeddings=2048,
    )
