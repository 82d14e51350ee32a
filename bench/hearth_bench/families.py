"""The model families ``scripts/bench models`` runs: their real small shapes, random weights.

Compute cost does not depend on the weights being trained, so a random model of a real
shape prefills and decodes as fast as the real one. No hub is reachable here: the shapes
are written down from the models' published ``config.json`` files and built with the
config classes of the pinned transformers.

* Per-layer kinds (sliding, linear attention, convolution, state space) are part of the
  shape. Scaled to fewer layers, a model keeps its first layers, or, when those miss a
  kind, one layer of each kind first: a 2-layer Gemma 3 still has a sliding and a full
  layer.
* Left out, because they change no cost the table measures: Llama 3.2's and Phi-4-mini's
  long-context rope scaling (the rope is computed either way), Gemma 3's vision tower.
* Granite 4 tiny is a 7B mixture of experts (64 experts per layer): the full run builds 10
  of its 40 layers, which is what fits next to the rest in 24 GiB, and says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hearth_engine.model.prepare.cache_dir import build_once, models_dir

BUILD_VERSION = "family/1"
EXACT_VOCAB = 0  # a ``vocab`` of 0 means: the test tokenizer's own size


def _repeat(pattern: list[str], n: int) -> list[str]:
    return [pattern[i % len(pattern)] for i in range(n)]


@dataclass(frozen=True)
class Family:
    """A model family at one real size: its transformers ``model_type`` and config values.

    ``kinds`` is the real per-layer list (in the config's own words) when layers differ;
    ``set_kinds`` writes a scaled list back into the config values.
    """

    name: str
    model_type: str
    config: dict[str, Any]
    kinds: list[str] = field(default_factory=list)
    memory_layers: int | None = None  # the full run's layer count where memory forces fewer

    @property
    def layers(self) -> int:
        return int(self.config["num_hidden_layers"])

    def set_kinds(self, values: dict[str, Any], kinds: list[str]) -> None:
        if self.model_type == "lfm2":
            values["full_attn_idxs"] = [i for i, k in enumerate(kinds) if k == "full_attention"]
        elif kinds:
            values["layer_types"] = kinds


_LFM2_FULL = (2, 5, 8, 10, 12, 14)

FAMILIES: tuple[Family, ...] = (
    Family(
        "qwen3-0.6b",
        "qwen3",
        {
            "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
            "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
            "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1e6,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
        },
    ),
    Family(
        "llama-3.2-1b",
        "llama",
        {
            "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
            "vocab_size": 128256, "max_position_embeddings": 131072, "rope_theta": 500000.0,
            "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
        },
    ),
    Family(
        "smollm3-3b",
        "smollm3",
        {
            "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
            "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 128256,
            "max_position_embeddings": 65536, "rope_theta": 5e6, "no_rope_layer_interval": 4,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
        },
    ),
    Family(
        "phi-4-mini",
        "phi3",
        {
            "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
            "num_attention_heads": 24, "num_key_value_heads": 8, "vocab_size": 200064,
            "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
            "partial_rotary_factor": 0.75, "rope_theta": 10000.0, "sliding_window": 262144,
            "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
        },
    ),
    Family(
        "gemma-3-1b",
        "gemma3_text",
        {
            "hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 26,
            "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
            "vocab_size": 262144, "max_position_embeddings": 32768, "sliding_window": 512,
            "rope_theta": 1e6, "rope_local_base_freq": 10000.0, "query_pre_attn_scalar": 256,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
        },
        _repeat(["sliding_attention"] * 5 + ["full_attention"], 26),
    ),
    Family(
        "gemma-3-270m",
        "gemma3_text",
        {
            "hidden_size": 640, "intermediate_size": 2048, "num_hidden_layers": 18,
            "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
            "vocab_size": 262144, "max_position_embeddings": 32768, "sliding_window": 512,
            "rope_theta": 1e6, "rope_local_base_freq": 10000.0, "query_pre_attn_scalar": 256,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
        },
        _repeat(["sliding_attention"] * 5 + ["full_attention"], 18),
    ),
    Family(
        "qwen3.5-0.8b",
        "qwen3_5_text",
        {
            "hidden_size": 1024, "intermediate_size": 3584, "num_hidden_layers": 24,
            "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256,
            "linear_num_key_heads": 16, "linear_num_value_heads": 16,
            "linear_key_head_dim": 128, "linear_value_head_dim": 128,
            "linear_conv_kernel_dim": 4, "vocab_size": 248320,
            "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
            "tie_word_embeddings": True,
        },
        _repeat(["linear_attention"] * 3 + ["full_attention"], 24),
    ),
    Family(
        "lfm2-350m",
        "lfm2",
        {
            "hidden_size": 1024, "intermediate_size": 6656, "num_hidden_layers": 16,
            "num_attention_heads": 16, "num_key_value_heads": 8, "vocab_size": 65536,
            "max_position_embeddings": 128000, "conv_L_cache": 3, "norm_eps": 1e-5,
            "block_auto_adjust_ff_dim": True, "block_ffn_dim_multiplier": 1.0,
            "block_multiple_of": 256, "tie_word_embeddings": True,
        },
        ["full_attention" if i in _LFM2_FULL else "conv" for i in range(16)],
    ),
    Family(
        "granite-4-tiny",
        "granitemoehybrid",
        {
            "hidden_size": 1536, "intermediate_size": 512, "shared_intermediate_size": 1024,
            "num_local_experts": 64, "num_experts_per_tok": 6, "num_hidden_layers": 40,
            "num_attention_heads": 12, "num_key_value_heads": 4, "vocab_size": 100352,
            "max_position_embeddings": 131072, "mamba_n_heads": 48, "mamba_d_head": 64,
            "mamba_d_state": 128, "mamba_n_groups": 1, "mamba_d_conv": 4, "mamba_expand": 2,
            "position_embedding_type": "nope", "embedding_multiplier": 12.0,
            "logits_scaling": 6.0, "residual_multiplier": 0.22,
            "attention_multiplier": 0.0078125, "rms_norm_eps": 1e-5,
            "tie_word_embeddings": True,
        },
        ["attention" if i % 10 == 5 else "mamba" for i in range(40)],
        memory_layers=10,
    ),
)  # fmt: skip

BY_NAME = {f.name: f for f in FAMILIES}


def tokenizer() -> Any:
    """The test tokenizer (``model.prepare.tiny``): benchmarks feed token ids (any vocabulary)."""
    from transformers import AutoTokenizer

    from hearth_engine.model.prepare.tiny import prepare_tiny_model

    return AutoTokenizer.from_pretrained(prepare_tiny_model())


def scale_kinds(kinds: list[str], n: int) -> list[str]:
    """``n`` layer kinds: the real first ``n`` when they hold every kind, else one of each
    kind first (in order of appearance), then the real order."""
    if n >= len(kinds):
        return list(kinds)
    if set(kinds[:n]) == set(kinds):
        return kinds[:n]
    return (list(dict.fromkeys(kinds)) + kinds)[:n]


def family_config(family: Family, layers: int, tok: Any, vocab: int | None = None) -> Any:
    """The transformers config of ``family`` at ``layers`` layers (``vocab``: 0 = tokenizer's)."""
    from transformers import AutoConfig

    values = dict(family.config, num_hidden_layers=layers)
    if family.kinds:
        family.set_kinds(values, scale_kinds(family.kinds, layers))
    if vocab is not None:
        values["vocab_size"] = vocab or len(tok)
    ids = {
        "bos_token_id": tok.convert_tokens_to_ids("<|im_start|>"),
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
    }
    return AutoConfig.for_model(family.model_type, **values, **ids)


def describe(family: Family, layers: int) -> str:
    """The shape in one cell: hidden, layers (and the real count when scaled), heads, vocab."""
    c = family.config
    kv = c.get("num_key_value_heads", c["num_attention_heads"])
    scaled = f"{layers}/{family.layers}" if layers != family.layers else str(layers)
    if layers == family.memory_layers:
        scaled += " (memory)"
    kinds = ""
    if family.kinds:
        counts: dict[str, int] = {}
        for kind in scale_kinds(family.kinds, layers):
            counts[kind] = counts.get(kind, 0) + 1
        kinds = " " + "+".join(f"{n}{k}" for k, n in counts.items())
    return (
        f"h{c['hidden_size']} L{scaled}{kinds} heads {c['num_attention_heads']}/{kv} "
        f"V{c['vocab_size']}"
    )


def prepare_family_model(
    family: Family, layers: int, *, vocab: int | None = None, dtype: str = "bfloat16"
) -> Path:
    """Random weights of ``family`` at ``layers`` layers, saved once into the Hearth cache."""
    key = f"{family.name}-L{layers}" + ("" if vocab is None else f"-V{vocab or 'tok'}")
    key += f"-{dtype}"

    def build(out: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        tok = tokenizer()
        config = family_config(family, layers, tok, vocab)
        torch.manual_seed(0)
        previous = torch.get_default_dtype()
        torch.set_default_dtype(getattr(torch, dtype))
        try:
            model = AutoModelForCausalLM.from_config(config)
        finally:
            torch.set_default_dtype(previous)
        model.save_pretrained(out)
        tok.save_pretrained(out)

    return build_once(models_dir() / f"family-{key}", f"{BUILD_VERSION}:{key}", build)
