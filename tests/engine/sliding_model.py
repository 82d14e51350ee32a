"""A tiny random Gemma 3 text model with a short sliding window, saved as a user's folder.

Gemma 3's own config class (``gemma3_text``), layers alternating sliding and full
attention, a window of ``WINDOW`` tokens: prompts of a few dozen tokens make the window
slide inside a cached prefix and inside the suffix. The tokenizer (and its chat
template) is the tiny model's.
"""

from __future__ import annotations

from pathlib import Path

import torch

from hearth_engine.models.tiny import prepare_tiny_model

WINDOW = 8
LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"]


def save_sliding_model(folder: Path) -> Path:
    """Build (seeded) and save the model and tokenizer into ``folder``; returns it."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(prepare_tiny_model())
    config = AutoConfig.for_model(
        "gemma3_text",
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|im_start|>"),
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
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # larger weights: sharper logits, so greedy choices differ
        for param in model.parameters():
            if param.dim() == 2:
                param.mul_(4.0)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
