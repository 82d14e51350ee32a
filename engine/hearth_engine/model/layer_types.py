"""What a model's layers are (read from its config), and whether Hearth can cache them.

Shared by the loader, the lean decoder, the runner and the GGUF converter. transformers
is imported inside each function, not at the top: resolving a model (``hearth_engine
prepare``, the loader's checks) should not pay the seconds of importing it, and
``loader.load_model`` sets ``HF_HUB_OFFLINE`` before transformers is first imported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import ModelLoadError

# Layer kinds (transformers' ``layer_types`` words) that keep a state instead of KV.
STATE_KINDS = ("linear_attention", "conv")


def sliding_layers(config: Any) -> tuple[tuple[int, ...], int | None]:
    """The sliding-window layers of a model (indices) and their window, in tokens.

    A window at least as long as the context (Phi-4-mini's 262,144 over 131,072) never
    slides: such a layer is full attention and is not listed.
    """
    from transformers.cache_utils import get_layer_types_and_kwargs  # see module docstring

    text_config = config.get_text_config(decoder=True)
    layer_types, layer_kwargs = get_layer_types_and_kwargs(text_config)
    context = getattr(text_config, "max_position_embeddings", None)
    layers, windows = [], set()
    for i, (kind, kwargs) in enumerate(zip(layer_types, layer_kwargs, strict=True)):
        window = kwargs.get("sliding_window")
        if kind == "sliding_attention" and window and not (context and window >= context):
            layers.append(i)
            windows.add(int(window))
    if len(windows) > 1:  # one model-wide window is what transformers' masks assume
        raise ValueError(f"several sliding windows {sorted(windows)}")
    return tuple(layers), (windows.pop() if windows else None)


def state_layers(config: Any) -> tuple[int, ...]:
    """The layers (indices) that keep a recurrent or convolution state instead of KV:
    linear attention (Qwen3.5), Mamba-2 (Granite 4, which transformers files under
    linear attention) and short convolutions (LFM2)."""
    from transformers.cache_utils import get_layer_types_and_kwargs  # see module docstring

    layer_types, _ = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
    return tuple(i for i, kind in enumerate(layer_types) if kind in STATE_KINDS)


def check_layer_types(config: Any, path: Path) -> None:
    """Refuse, in one line naming the layer type, what the prefix cache cannot serve exactly.

    Served exactly: full-attention layers; sliding-window layers (Gemma 3, Mistral-style
    windows), whose window is applied to cached prefixes as to the model's own KV
    (attention.py); and the state layers of hybrid models (linear attention, Mamba-2,
    convolutions: Qwen3.5, Granite 4, LFM2), whose state is kept at prefix boundaries
    (state.py). Chunked attention, shared or missing KV, layers that mix a state with
    attention, and a hybrid model with sliding windows would be served wrong, so they
    are refused at load, and so is attention-logit soft-capping (Gemma 2), which
    Hearth's attention does not compute.
    """
    from transformers.cache_utils import get_layer_types_and_kwargs  # see module docstring

    text_config = config.get_text_config(decoder=True)
    model_type = getattr(text_config, "model_type", None) or "this model"
    layer_types, _ = get_layer_types_and_kwargs(text_config)
    known = ("full_attention", "sliding_attention", *STATE_KINDS)
    odd: dict[str, int] = {}
    for kind in layer_types:
        if kind not in known:
            odd[kind] = odd.get(kind, 0) + 1
    if odd:
        found = ", ".join(f"{kind} ({n} of {len(layer_types)})" for kind, n in sorted(odd.items()))
        raise ModelLoadError(
            f"model path {path}: {model_type} has layer types Hearth cannot cache yet: "
            f"{found} (Hearth serves full-attention, sliding-window, linear-attention, "
            "state-space and convolution layers)"
        )
    has_state = any(kind in STATE_KINDS for kind in layer_types)
    if all(kind in STATE_KINDS for kind in layer_types):
        raise ModelLoadError(
            f"model path {path}: {model_type} has no attention layer "
            "(Hearth needs at least one layer with KV)"
        )
    if has_state and "sliding_attention" in layer_types:
        raise ModelLoadError(
            f"model path {path}: {model_type} mixes state layers with sliding-window "
            "layers, which Hearth cannot cache yet"
        )
    if has_state and getattr(text_config, "number_of_conv_states", 1) != 1:
        raise ModelLoadError(
            f"model path {path}: {model_type} keeps several states per layer, "
            "which Hearth cannot cache yet"
        )
    if getattr(text_config, "attn_logit_softcapping", None) is not None:
        raise ModelLoadError(
            f"model path {path}: {model_type} uses attention logit soft-capping, "
            "which Hearth's attention does not compute"
        )
    if getattr(text_config, "use_bidirectional_attention", False):
        raise ModelLoadError(
            f"model path {path}: {model_type} uses bidirectional attention, "
            "which a prefix cache cannot serve"
        )
    try:
        sliding_layers(config)
    except ValueError as err:
        raise ModelLoadError(
            f"model path {path}: {model_type} has {err}; Hearth needs one window"
        ) from None
