"""Tiny random models of any transformers family, saved as users' folders.

The tokenizer (and its chat template) is the tiny model's, so every such model renders
chats and takes the same token ids.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from hearth_engine.model.prepare.tiny import prepare_tiny_model


def tiny_tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(prepare_tiny_model())


def save_random_model(folder: Path, model_type: str, scale: float = 1.0, **values: Any) -> Path:
    """Build (seeded) a ``model_type`` model from ``values`` and save it with the tiny
    tokenizer into ``folder``; returns it.

    ``scale`` multiplies the 2-D weights: larger weights give sharper logits, so greedy
    choices differ between nearby logits (what exactness tests need).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    tokenizer = tiny_tokenizer()
    config = AutoConfig.for_model(
        model_type,
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|im_start|>"),
        **values,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    if scale != 1.0:
        with torch.no_grad():
            for param in model.parameters():
                if param.dim() == 2:
                    param.mul_(scale)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
