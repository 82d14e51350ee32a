"""Tiny GGUF files written here with ``gguf.GGUFWriter``, as llama.cpp's converter writes them.

A random 2-layer Llama (hidden 64) with the tiny test tokenizer (byte-level BPE, ChatML
specials) in the metadata. The q/k rows are permuted the way ``convert_hf_to_gguf.py``
does for Llama, so transformers' reader, which undoes it, gives back the source weights.
``write_lfm2_gguf`` writes a hybrid model (LFM2: convolution and attention layers), with
the tensor names of gguf's own name map for that architecture.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hearth_engine.model.prepare.templates import HERMES_CHATML_TEMPLATE
from hearth_engine.model.prepare.tiny import prepare_tiny_model

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 64, 2, 4, 2, 128
EPS = float(np.float32(1e-6))  # GGUF stores it as float32: the source model uses the same
# ChatML without tools: what many GGUF files carry (SmolLM2's does the same).
PLAIN_CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CONTROL, USER_DEFINED, NORMAL = 3, 4, 1


def _permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's rotary row order for q/k (``LlamaModel.permute``)."""
    rows = weights.shape[0]
    return (
        weights.reshape(heads, 2, rows // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def _tokenizer_fields() -> tuple[Any, list[str], list[int], list[str]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(prepare_tiny_model())
    model = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    special = set(tokenizer.all_special_tokens)
    added = {t.content for t in tokenizer.added_tokens_decoder.values()}
    kinds = [CONTROL if t in special else USER_DEFINED if t in added else NORMAL for t in tokens]
    return tokenizer, tokens, kinds, merges


def source_model(vocab: int, tokenizer: Any, seed: int = 0) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=4096,
        rms_norm_eps=EPS,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|im_start|>"),
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # visible norms (they start at 1.0)
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    return model


def _tensors(model: Any) -> dict[str, np.ndarray]:
    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    out = {
        "token_embd.weight": state["model.embed_tokens.weight"],
        "output_norm.weight": state["model.norm.weight"],
        "output.weight": state["lm_head.weight"],
    }
    names = {
        "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    }  # fmt: skip
    for i in range(LAYERS):
        for hf, gg in names.items():
            weights = state[f"model.layers.{i}.{hf}.weight"]
            if gg == "attn_q":
                weights = _permute(weights, HEADS)
            elif gg == "attn_k":
                weights = _permute(weights, KV_HEADS)
            out[f"blk.{i}.{gg}.weight"] = weights
    return out


def _add_tokenizer(writer: Any, tokenizer_model: str, chat_template: str | None) -> None:
    tokenizer, tokens, kinds, merges = _tokenizer_fields()
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model(tokenizer_model)
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(kinds)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokenizer.convert_tokens_to_ids("<|im_start|>"))
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_add_bos_token(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)


def _finish(writer: Any) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_lfm2_gguf(path: Path, seed: int = 0) -> Any:
    """A tiny random LFM2 (``hybrid_models.KINDS["lfm2"]``: conv, attention, conv, conv)
    as a float32 GGUF file; returns the source model."""
    from gguf import MODEL_ARCH, GGUFWriter, get_tensor_name_map
    from transformers import AutoConfig, AutoModelForCausalLM

    from .hybrid_models import KINDS, LAYERS

    tokenizer, tokens, _, _ = _tokenizer_fields()
    _, values = KINDS["lfm2"]
    config = AutoConfig.for_model(
        "lfm2",
        vocab_size=len(tokens),
        num_hidden_layers=LAYERS,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|im_start|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **values,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    writer = GGUFWriter(str(path), "lfm2")
    writer.add_name("hearth-tiny-lfm2")
    writer.add_context_length(4096)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_block_count(LAYERS)
    writer.add_head_count(config.num_attention_heads)
    # llama.cpp marks LFM2's attention layers by their KV head count (0: a conv layer).
    kv_heads = [
        config.num_key_value_heads if i in values["full_attn_idxs"] else 0 for i in range(LAYERS)
    ]
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(config.norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_shortconv_l_cache(config.conv_L_cache)
    _add_tokenizer(writer, "gpt2", HERMES_CHATML_TEMPLATE)
    names = get_tensor_name_map(MODEL_ARCH.LFM2, LAYERS)
    for hf_name, tensor in model.state_dict().items():
        weights = tensor.detach().float().numpy()
        if "conv.conv" in hf_name:  # GGUF keeps the depthwise kernel as [hidden, L]
            weights = weights[:, 0]
        writer.add_tensor(names.get_name(hf_name, try_suffixes=(".weight",)), weights)
    _finish(writer)
    return model


def write_gguf(
    path: Path,
    *,
    architecture: str = "llama",
    chat_template: str | None = HERMES_CHATML_TEMPLATE,
    float16: bool = False,
    raw_type: str | None = None,
    tokenizer_model: str = "gpt2",
    seed: int = 0,
    quant: dict[str, str] | None = None,
) -> Any:
    """Write the tiny GGUF file; returns the source model (float32) it holds.

    ``float16`` stores the matrices as F16 (the source model is rounded to match);
    ``raw_type`` stores ``blk.0.ffn_down.weight`` as zero bytes of that GGML type;
    ``quant`` quantizes each matrix whose name holds a key into that type with gguf-py
    (``{"attn": "Q8_0", "ffn": "Q4_0"}``; the source model keeps its float weights).
    """
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter, quantize

    tokenizer, tokens, _, _ = _tokenizer_fields()
    model = source_model(len(tokens), tokenizer, seed)
    if float16:  # the weights only: ``model.half()`` would round the rotary buffer too
        with torch.no_grad():
            for param in model.parameters():
                param.copy_(param.half().float())
    writer = GGUFWriter(str(path), architecture)
    writer.add_name("hearth-tiny-llama")
    writer.add_context_length(4096)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_block_count(LAYERS)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    _add_tokenizer(writer, tokenizer_model, chat_template)
    for name, weights in _tensors(model).items():
        if raw_type is not None and name == "blk.0.ffn_down.weight":
            qtype = GGMLQuantizationType[raw_type]
            block, size = GGML_QUANT_SIZES[qtype]
            raw = np.zeros((weights.shape[0], weights.shape[1] // block * size), np.uint8)
            writer.add_tensor(name, raw, raw_dtype=qtype)
        elif quant and weights.ndim == 2 and any(key in name for key in quant):
            qtype = GGMLQuantizationType[next(v for k, v in quant.items() if k in name)]
            writer.add_tensor(name, quantize(weights.astype(np.float32), qtype), raw_dtype=qtype)
        elif float16 and weights.ndim == 2:
            writer.add_tensor(name, weights.astype(np.float16))
        else:
            writer.add_tensor(name, weights.astype(np.float32))
    _finish(writer)
    return model
