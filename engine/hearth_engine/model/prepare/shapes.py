"""Random-weight models with the shapes of real ones, for honest timings.

Compute cost does not depend on the weights being trained, so a random Qwen2.5-0.5B of the
real shape prefills exactly as fast as the real one. The tokenizer is the tiny test
tokenizer (benchmarks feed token ids directly; ids beyond it are still valid model input).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .cache_dir import build_once, models_dir

SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    },
    "qwen2.5-1.5b": {
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    },
}
BUILD_VERSION = "shape/1"


def shape_model_dir(shape: str) -> Path:
    return models_dir() / f"shape-{shape}"


def prepare_shape_model(shape: str) -> Path:
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose from {', '.join(SHAPES)}")

    def build(out: Path) -> None:
        import torch
        from transformers import Qwen2Config, Qwen2ForCausalLM

        from .tiny import build_tokenizer

        tokenizer = build_tokenizer()
        config = Qwen2Config(
            **SHAPES[shape],
            max_position_embeddings=32768,
            rope_theta=1_000_000.0,
            bos_token_id=tokenizer.convert_tokens_to_ids("<|im_start|>"),
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        torch.manual_seed(0)
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)
        try:
            model = Qwen2ForCausalLM(config)
        finally:
            torch.set_default_dtype(previous)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)

    return build_once(shape_model_dir(shape), f"{BUILD_VERSION}:{shape}", build)
