"""A quantized GGUF file as a cached folder whose matrices stay packed, and its loading.

Conversion (once per file version, ``prepare.gguf``): the config and tokenizer come from
transformers' GGUF reader, as for a dequantized conversion. Then each tensor of the file:

* a 2-D matrix of a kept block type (``ggml_blocks.BLOCK_TYPES``) becomes Hearth's tile
  form, written to ``QUANT_FILE`` (``<name>.tiles``/``.scales``/``.zeros``, its form in
  the file's metadata). No float copy of it is ever made;
* anything else (norms, biases, F16/F32 matrices, other block types) is dequantized to
  ``FLOAT_FILE``, as today's conversion does.

Llama-family files store q/k rows permuted for rotary (llama.cpp's converter); the rows
are put back in transformers' order on the codes and scales, which is exact.

Loading builds the model's skeleton without allocating its weights (``meta``), fills
in the float tensors, and hangs each packed matrix on its module (``QUANT_ATTR``): the
lean decoder multiplies them packed (``quant.linear.QuantLinear``). A quantized
embedding is looked up row by row (``QuantEmbedding``), and a tied head reads the same
packed matrix: one copy.
"""

from __future__ import annotations

import json
import logging
import struct
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import ModelLoadError
from .ggml_blocks import BlockError, supported, to_quant_weight
from .linear import QuantEmbedding
from .tiles import QuantWeight

_LOGGER = logging.getLogger(__name__)

QUANT_FILE = "hearth-quant.safetensors"
FLOAT_FILE = "model.safetensors"
QUANT_ATTR = "hearth_quant"  # as linear.QUANT_ATTR (linear imports this package)
_PERMUTED_ARCHS = ("llama", "mistral")


def has_packed(folder: Path) -> bool:
    return (folder / QUANT_FILE).is_file()


def _unpermute(rows: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order (its converter wrote [heads, 2, dim/2] as
    [heads, dim/2, 2]): [heads, dim/2, 2] -> [heads, 2, dim/2], rows only. Applying the
    converter's own reshape again is not its inverse (only where dim/2 is 2)."""
    n = rows.shape[0]
    return (
        rows.reshape(heads, n // heads // 2, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)
    )


def _row_order(arch: str, gguf_name: str, config: Any, n: int) -> np.ndarray | None:
    if arch not in _PERMUTED_ARCHS or not (".attn_q." in gguf_name or ".attn_k." in gguf_name):
        return None
    heads = int(config.num_attention_heads)
    if ".attn_k." in gguf_name:
        heads = int(getattr(config, "num_key_value_heads", None) or heads)
    return _unpermute(np.arange(n), heads)


def _reorder(w: QuantWeight, order: np.ndarray) -> QuantWeight:
    from .tiles import select_rows

    return select_rows(w, torch.from_numpy(order))


def convert_packed(source: Path, out: Path, config: Any, dtype: torch.dtype) -> dict[str, str]:
    """Write ``FLOAT_FILE`` and ``QUANT_FILE`` for ``source`` into ``out``; returns the
    form of each packed matrix (``{hf name: "Q4_K -> int4-g32"}``)."""
    from gguf import GGUFReader, dequantize
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    reader = GGUFReader(source)
    arch = str(reader.fields["general.architecture"].contents())
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    names = _name_map(skeleton, config)
    linear_names = {
        f"{n}.weight" for n, m in skeleton.named_modules() if isinstance(m, torch.nn.Linear)
    }
    embed_name = next(n for n in names.values() if n.endswith("embed_tokens.weight"))
    floats: dict[str, torch.Tensor] = {}
    packed: dict[str, torch.Tensor] = {}
    forms: dict[str, str] = {}
    for tensor in reader.tensors:
        hf = names.get(tensor.name)
        if hf is None:
            _LOGGER.info("GGUF tensor %s has no place in the model: skipped", tensor.name)
            continue
        kind = tensor.tensor_type.name
        shape = [int(v) for v in reversed(tensor.shape.tolist())]  # [rows, cols]
        keep = supported(kind) and len(shape) == 2 and (hf in linear_names or hf == embed_name)
        if keep:
            try:
                w = to_quant_weight(tensor.data, kind, shape[0], shape[1])
            except BlockError as err:
                raise ModelLoadError(f"model file {source}: tensor {tensor.name}: {err}") from None
            order = _row_order(arch, tensor.name, config, shape[0])
            if order is not None:
                w = _reorder(w, order)
            stem = hf.removesuffix(".weight")
            packed[f"{stem}.tiles"] = w.tiles
            packed[f"{stem}.scales"] = w.scales
            if w.zeros is not None:
                packed[f"{stem}.zeros"] = w.zeros
            if w.supers is not None:
                packed[f"{stem}.supers"] = w.supers
            form = [kind, w.bits, w.group, w.out_features, w.in_features, w.per_super]
            forms[stem] = json.dumps(form)
            continue
        values = dequantize(tensor.data, tensor.tensor_type).reshape(shape)
        order = _row_order(arch, tensor.name, config, shape[0])
        if order is not None:
            values = values[order]
        target = torch.float32 if len(shape) == 1 else dtype
        floats[hf] = torch.from_numpy(np.array(values)).to(target)
    save_file(floats, str(out / FLOAT_FILE))
    save_file(packed, str(out / QUANT_FILE), metadata=forms)
    return {
        k: f"{json.loads(v)[0]} -> int{json.loads(v)[1]}-g{json.loads(v)[2]}"
        for k, v in forms.items()
    }


def _name_map(skeleton: Any, config: Any) -> dict[str, str]:
    """GGUF tensor names -> the model's parameter names (transformers' own mapping)."""
    from transformers.modeling_gguf_pytorch_utils import TensorProcessor, get_gguf_hf_weights_map

    return get_gguf_hf_weights_map(skeleton, TensorProcessor(config=config.to_dict()))


_DTYPES = {"U8": torch.uint8, "I8": torch.int8, "F16": torch.float16, "F32": torch.float32}


def _read_safetensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """A safetensors file's tensors, each read into memory of its own (not mapped), and
    its metadata.

    A mapped file stays resident as long as any tensor views it: the joined q/k/v and
    gate/up tiles are copies, so their mapped originals stayed resident beside them (a
    1.5B Q4_K_M file: 2.35 GB resident, 1.26 GB of it the mapped file). Reading each
    tensor into its own buffer keeps one copy, and the peak no higher.
    """
    with path.open("rb") as handle:
        (size,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(size))
        metadata = header.pop("__metadata__", None) or {}
        tensors: dict[str, torch.Tensor] = {}
        for name, info in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):
            start, end = info["data_offsets"]
            dtype = _DTYPES.get(info["dtype"])
            if dtype is None:
                raise ModelLoadError(f"{path.name}: tensor {name} has dtype {info['dtype']}")
            tensor = torch.empty(info["shape"], dtype=dtype)
            view = tensor.view(-1).view(torch.uint8).numpy()
            if view.nbytes != end - start:
                raise ModelLoadError(f"{path.name}: tensor {name} does not fit its shape")
            handle.seek(8 + size + start)
            if handle.readinto(memoryview(view)) != view.nbytes:
                raise ModelLoadError(f"{path.name} is truncated (tensor {name})")
            tensors[name] = tensor
    return tensors, metadata


def read_packed(folder: Path) -> dict[str, QuantWeight]:
    """The packed matrices of a converted folder, by module name."""
    tensors, forms = _read_safetensors(folder / QUANT_FILE)
    out: dict[str, QuantWeight] = {}
    for stem, text in forms.items():
        _kind, bits, group, n, k, per_super = json.loads(text)
        out[stem] = QuantWeight(
            tensors.pop(f"{stem}.tiles"),
            tensors.pop(f"{stem}.scales"),
            tensors.pop(f"{stem}.zeros", None),
            int(n),
            int(k),
            int(group),
            int(bits),
            tensors.pop(f"{stem}.supers", None),
            int(per_super),
        )
    return out


def load_packed_model(folder: Path, config: Any, dtype: torch.dtype, attn: str) -> Any:
    """The model of a packed folder: float tensors loaded, packed matrices on their modules
    (``QUANT_ATTR``) with empty weights; raises ``ModelLoadError`` on a missing tensor."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn)
    # The model's dtype throughout, as transformers would load a float folder.
    floats = {k: v.to(dtype) for k, v in load_file(str(folder / FLOAT_FILE)).items()}
    model.load_state_dict(floats, strict=False, assign=True)
    if getattr(config.get_text_config(decoder=True), "tie_word_embeddings", False):
        model.tie_weights()
    packed = read_packed(folder)
    modules = dict(model.named_modules())
    inner = model.model
    embed_stem = next(n for n, m in modules.items() if m is inner.embed_tokens)
    for stem, w in packed.items():
        module = modules.get(stem)
        if module is None:
            raise ModelLoadError(f"model path {folder}: packed tensor {stem} has no module")
        if module is inner.embed_tokens:
            inner.embed_tokens = QuantEmbedding(w, dtype)
            continue
        setattr(module, QUANT_ATTR, w)
        module.weight = torch.nn.Parameter(torch.empty(0, dtype=dtype), requires_grad=False)
    head_stem = next(n for n, m in modules.items() if m is model.lm_head)
    if head_stem not in packed and embed_stem in packed and model.lm_head.weight.is_meta:
        setattr(model.lm_head, QUANT_ATTR, packed[embed_stem])  # tied: the same bytes
        model.lm_head.weight = torch.nn.Parameter(torch.empty(0, dtype=dtype), requires_grad=False)
    # Buffers computed at construction (rotary frequencies) were made on ``meta``.
    rotary = type(inner.rotary_emb)(config=config.get_text_config(decoder=True))
    inner.rotary_emb = rotary
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    missing += [n for n, b in model.named_buffers() if b.is_meta]
    if missing:
        raise ModelLoadError(f"model path {folder}: missing tensors ({', '.join(missing[:3])})")
    return model
