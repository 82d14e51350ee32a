"""The GGUF files users have, made here with llama.cpp's own tools, cached.

``scripts/setup`` builds ``llama-quantize`` with ``llama-server`` from the same llama.cpp
sdist and copies its ``convert_hf_to_gguf.py`` (with ``conversion/`` and ``gguf-py/``)
beside it: ``$HEARTH_CACHE/llama.cpp/<version>-<key>`` (an older cache had them apart, in
``tools_dir``, which ``scripts/setup --for bench`` still builds where neither is there).
This module turns a Hugging Face folder into an F16 GGUF with the converter, then into
``Q4_K_M`` / ``Q8_0`` with ``llama-quantize``, once per (shape, format):
``$HEARTH_CACHE/gguf/<shape>-<format>.gguf``.

Shapes (``SHAPES``): ``default`` is SmolLM2-135M-Instruct with its real weights (quality
figures); ``qwen2.5-1.5b`` and ``llama-3.2-3b`` are random weights in the real shapes
(honest timings, never quality), with the default model's tokenizer (a pre-tokenizer
llama.cpp's converter knows) and the real vocabulary sizes (the rest padded).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..llama_server import build_dir, build_key, hearth_cache, pinned_version

FORMATS = ("Q4_K_M", "Q8_0")
SHAPES: dict[str, dict[str, Any]] = {
    "default": {},
    # Qwen2 is Llama with q/k/v biases: written as a Llama with attention biases (which
    # in transformers' Llama also gives o_proj one: a vector more a layer than Qwen2), so
    # that the tokenizer loads as the default model's (as a qwen2 folder, transformers
    # gives it Qwen2's pre-tokenizer, which llama.cpp's converter does not recognise).
    # Both engines serve the same file, so they compute the same.
    "qwen2.5-1.5b": {
        "model_type": "llama", "attention_bias": True, "head_dim": 128,
        "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
        "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936,
        "max_position_embeddings": 32768, "rope_theta": 1e6, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
    },
    "llama-3.2-3b": {
        "model_type": "llama",
        "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28,
        "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": 128256, "max_position_embeddings": 131072, "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
    },
}  # fmt: skip


class ToolsMissingError(RuntimeError):
    """llama.cpp's converter or quantizer is not built (run ``scripts/setup --for bench``)."""


def tools_dir(version: str | None = None) -> Path:
    version = version or pinned_version()
    return hearth_cache() / "llama.cpp" / f"{version}-{build_key(version)}-tools"


def tools() -> tuple[Path, Path]:
    """``(convert_hf_to_gguf.py, llama-quantize)``; a clear error when not built."""
    for base in (build_dir(), tools_dir()):  # beside llama-server, or an older separate build
        convert = base / "convert" / "convert_hf_to_gguf.py"
        quantize = base / "bin" / "llama-quantize"
        if convert.is_file() and os.access(quantize, os.X_OK):
            return convert, quantize
    raise ToolsMissingError(
        f"llama.cpp's converter and quantizer are not built ({build_dir()}): "
        "run scripts/setup --for bench"
    )


def gguf_path(shape: str, fmt: str) -> Path:
    return hearth_cache() / "gguf" / f"{shape}-{fmt}.gguf"


def _source_folder(shape: str, work: Path) -> Path:
    """The Hugging Face folder of ``shape``: the default model's, or random weights."""
    from hearth_engine.model.prepare.default import prepare_default_model

    default = prepare_default_model()
    if shape == "default":
        return default
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default)
    values = dict(SHAPES[shape])
    model_type = values.pop("model_type")
    config = AutoConfig.for_model(
        model_type, **values, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id
    )
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = AutoModelForCausalLM.from_config(config)
    finally:
        torch.set_default_dtype(previous)
    out = work / shape
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def converter_env(work: Path) -> dict[str, str]:
    """The converter's environment. Its Llama path imports ``sentencepiece`` before it
    looks for a ``tokenizer.model`` (these folders have a ``tokenizer.json`` only, and
    fall through to it); a stand-in module that is never called saves installing it."""
    stub = work / "stubs"
    stub.mkdir(exist_ok=True)
    (stub / "sentencepiece.py").write_text("class SentencePieceProcessor:\n    pass\n")
    path = os.pathsep.join(filter(None, [str(stub), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}


def make_gguf(shape: str, fmt: str, log: Any = print) -> Path:
    """The cached ``shape`` GGUF in ``fmt``, made once with llama.cpp's tools."""
    if shape not in SHAPES or fmt not in FORMATS:
        raise ValueError(f"unknown shape {shape!r} or format {fmt!r}")
    target = gguf_path(shape, fmt)
    if target.is_file():
        return target
    convert, quantize = tools()
    target.parent.mkdir(parents=True, exist_ok=True)
    f16 = target.parent / f"{shape}-F16.gguf"
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        work = Path(tmp)
        if not f16.is_file():
            log(f"making {f16.name} with convert_hf_to_gguf.py (once)")
            source = _source_folder(shape, work)
            partial = work / f16.name
            subprocess.run(
                [sys.executable, str(convert), str(source), "--outtype", "f16",
                 "--outfile", str(partial)],
                check=True, capture_output=True, env=converter_env(work),
            )  # fmt: skip
            shutil.rmtree(work / shape, ignore_errors=True)
            partial.replace(f16)
        log(f"making {target.name} with llama-quantize (once)")
        partial = work / target.name
        subprocess.run(
            [str(quantize), str(f16), str(partial), fmt, str(os.cpu_count() or 1)],
            check=True, capture_output=True,
        )  # fmt: skip
        partial.replace(target)
    return target


def main(argv: list[str]) -> int:
    """``python -m hearth_bench.quant.files SHAPE FORMAT``: make one file, print its path."""
    print(make_gguf(argv[0], argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
