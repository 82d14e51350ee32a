"""Layers the prefix cache cannot serve exactly are refused at load, in one line naming them;
full-attention, sliding-window and hybrid (state-layer) families load.

Tiny random models of each family (transformers' own config classes, 2 layers, one of
each kind) are saved into a tmp folder and loaded as a user's folder would be.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hearth_engine.model.errors import ModelLoadError
from hearth_engine.model.layer_types import sliding_layers, state_layers
from hearth_engine.model.loader import load_model

from .random_models import save_random_model

SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
HEADS = {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32}


REFUSED = {
    "gemma2": (
        "gemma2",
        {**SMALL, **HEADS, "sliding_window": 16},
        "gemma2 uses attention logit soft-capping,",
    ),
    # Falcon-H1 runs attention and a Mamba mixer inside one layer.
    "falcon_h1": (
        "falcon_h1",
        {**SMALL, **HEADS, "mamba_d_ssm": 64, "mamba_n_heads": 4, "mamba_d_head": 16,
         "mamba_d_state": 16, "mamba_chunk_size": 16},
        "falcon_h1 has layer types Hearth cannot cache yet: hybrid (2 of 2)",
    ),
    "mamba2": (
        "mamba2",
        {"num_hidden_layers": 2, "hidden_size": 64, "num_heads": 4, "head_dim": 32,
         "state_size": 16, "n_groups": 1, "chunk_size": 16},
        "mamba2 has no attention layer",
    ),
}  # fmt: skip


@pytest.mark.parametrize("family", list(REFUSED))
def test_a_layer_kind_the_cache_cannot_serve_is_refused_by_name(
    tmp_path: Path, family: str
) -> None:
    model_type, values, expected = REFUSED[family]
    folder = save_random_model(tmp_path / family, model_type, **values)
    with pytest.raises(ModelLoadError) as caught:
        load_model(str(folder), torch.device("cpu"), torch.float32)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"model path {folder}: {expected} ")


@pytest.mark.parametrize(
    ("model_type", "values"),
    [
        # Phi-4-mini's window (262,144) is longer than its context: it never slides.
        ("phi3", {"sliding_window": 262144, "max_position_embeddings": 131072}),
        ("qwen3", {"head_dim": 32, "use_sliding_window": False, "sliding_window": 16}),
        ("smollm3", {"no_rope_layer_interval": 2}),
    ],
)
def test_full_attention_families_load(
    tmp_path: Path, model_type: str, values: dict[str, Any]
) -> None:
    extra = {"num_attention_heads": 2, "num_key_value_heads": 1}
    folder = save_random_model(tmp_path / model_type, model_type, **SMALL, **extra, **values)
    loaded = load_model(str(folder), torch.device("cpu"), torch.float32)
    assert loaded.model.config.model_type == model_type
    assert sliding_layers(loaded.model.config) == ((), None)


HYBRID = {
    "qwen3_5_text": (
        {**SMALL, **HEADS, "linear_num_key_heads": 2, "linear_num_value_heads": 2,
         "linear_key_head_dim": 16, "linear_value_head_dim": 16,
         "layer_types": ["linear_attention", "full_attention"]},
        (0,),
    ),
    "lfm2": (
        {**SMALL, "num_attention_heads": 2, "num_key_value_heads": 1, "full_attn_idxs": [1]},
        (0,),
    ),
    "granitemoehybrid": (
        {**SMALL, "num_attention_heads": 2, "num_key_value_heads": 1, "num_local_experts": 2,
         "num_experts_per_tok": 1, "shared_intermediate_size": 64, "mamba_n_heads": 8,
         "mamba_d_head": 16, "mamba_d_state": 16, "mamba_expand": 2,
         "layer_types": ["attention", "mamba"]},
        (1,),
    ),
}  # fmt: skip


@pytest.mark.parametrize("model_type", list(HYBRID))
def test_hybrid_families_load_with_their_state_layers(tmp_path: Path, model_type: str) -> None:
    """Linear attention, convolutions and Mamba-2 keep a state at prefix boundaries
    (test_hybrid.py): they load, and the engine knows which layers keep one."""
    values, expected = HYBRID[model_type]
    folder = save_random_model(tmp_path / model_type, model_type, **values)
    loaded = load_model(str(folder), torch.device("cpu"), torch.float32)
    assert state_layers(loaded.model.config) == expected


@pytest.mark.parametrize(
    ("model_type", "values", "sliding"),
    [
        ("gemma3_text", {**HEADS, "sliding_window": 16,
                         "layer_types": ["sliding_attention", "full_attention"]}, (0,)),
        # A window shorter than the context slides in every layer (Phi-3 small, Mistral).
        ("phi3", {"num_attention_heads": 2, "num_key_value_heads": 1, "sliding_window": 16,
                  "max_position_embeddings": 4096}, (0, 1)),
    ],
)  # fmt: skip
def test_sliding_window_families_load_with_their_window(
    tmp_path: Path, model_type: str, values: dict[str, Any], sliding: tuple[int, ...]
) -> None:
    """Sliding-window layers are served exactly (test_sliding_window.py): they load."""
    folder = save_random_model(tmp_path / model_type, model_type, **SMALL, **values)
    loaded = load_model(str(folder), torch.device("cpu"), torch.float32)
    assert sliding_layers(loaded.model.config) == (sliding, 16)
