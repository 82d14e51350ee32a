"""Resolve ``--model`` and load a Hugging Face causal LM folder, with clear errors."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ModelLoadError
from .layer_types import check_layer_types
from .mapped import copy_mapped_weights
from .prepare.default import ModelPrepareError, prepare_default_model
from .prepare.gguf import prepare_gguf_model, renders_tools
from .prepare.tiny import prepare_tiny_model, prepare_tiny_tools_model
from .quant.folder import has_packed, load_packed_model

_LOGGER = logging.getLogger(__name__)

BUILTIN_MODELS = ("default", "tiny", "tiny-tools")
_WEIGHT_SUFFIXES = (".safetensors", ".bin")


def resolve_model(spec: str, *, own_template: bool = False, packed: bool | None = None) -> Path:
    """Map ``default``/``tiny``/``tiny-tools`` to their prepared folders, convert a
    ``.gguf`` file once into the cache (``prepare.gguf``), or check a folder.

    ``own_template``: a ``--chat-template`` replaces the model's, so a GGUF file
    without one is accepted. ``packed``: keep a GGUF file's quantized matrices packed
    (``None``: when it has any; the default model is such a file)."""
    if spec == "default":
        try:
            return prepare_default_model(packed=packed is not False)
        except ModelPrepareError as err:
            raise ModelLoadError(str(err)) from None
    if spec == "tiny":
        return prepare_tiny_model()
    if spec == "tiny-tools":
        return prepare_tiny_tools_model()
    if spec.lower().endswith(".gguf"):
        return prepare_gguf_model(Path(spec).expanduser(), own_template=own_template, packed=packed)
    return check_model_folder(Path(spec).expanduser())


def check_model_folder(path: Path) -> Path:
    """A usable folder has a readable config.json, weights and a tokenizer."""
    if not path.exists():
        raise ModelLoadError(f"model path {path} does not exist")
    if not path.is_dir():
        raise ModelLoadError(
            f"model path {path} is not a folder (expected a Hugging Face model folder)"
        )
    if not os.access(path, os.R_OK | os.X_OK):
        raise ModelLoadError(f"model path {path} is not readable")
    config = path / "config.json"
    try:
        json.loads(config.read_text())
    except FileNotFoundError:
        raise ModelLoadError(f"model path {path} has no config.json") from None
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"model path {path}: cannot read config.json ({err})") from None
    weights = [p for p in path.iterdir() if p.name.endswith(_WEIGHT_SUFFIXES)]
    if not weights:
        raise ModelLoadError(f"model path {path} has no weights (*.safetensors or *.bin)")
    unreadable = [p.name for p in weights if not os.access(p, os.R_OK)]
    if unreadable:
        raise ModelLoadError(f"model path {path}: cannot read {', '.join(unreadable)}")
    if not any(
        (path / name).exists() for name in ("tokenizer.json", "tokenizer.model", "vocab.json")
    ):
        raise ModelLoadError(f"model path {path} has no tokenizer files")
    return path


def fingerprint(path: Path) -> str:
    """A stable identity for a model folder's weights and tokenizer.

    Hashes the config, the tokenizer files and, for each weight file, its size, its
    safetensors header (names, shapes, dtypes) and 64 evenly spaced 4 KiB samples of its
    content, so a fine-tune with the same shapes gets a different fingerprint without
    reading gigabytes at start-up.
    """
    digest = hashlib.sha256()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        file = path / name
        if file.exists():
            digest.update(name.encode())
            digest.update(file.read_bytes())
    for file in sorted(p for p in path.iterdir() if p.name.endswith(_WEIGHT_SUFFIXES)):
        size = file.stat().st_size
        digest.update(f"{file.name}:{size}".encode())
        with file.open("rb") as handle:
            digest.update(handle.read(1 << 16))
            for i in range(64):
                handle.seek(size * i // 64)
                digest.update(handle.read(4096))
    return digest.hexdigest()[:16]


@dataclass
class LoadedModel:
    path: Path
    name: str
    model: Any
    tokenizer: Any
    fingerprint: str
    context_length: int
    packed: bool = False  # a GGUF file's quantized matrices, kept packed (quant/)


def _context_length(config: Any, tokenizer: Any) -> int:
    text_config = config.get_text_config(decoder=True)
    length = getattr(text_config, "max_position_embeddings", None) or 4096
    tok_max = getattr(tokenizer, "model_max_length", None)
    if isinstance(tok_max, int) and 0 < tok_max < length:
        length = tok_max
    return int(length)


def _has_experts(config: Any) -> bool:
    text_config = config.get_text_config(decoder=True)
    return any(getattr(text_config, k, None) for k in ("num_local_experts", "num_experts"))


def apply_chat_template_override(tokenizer: Any, template: str, path: Path) -> None:
    """Install a ``--chat-template`` into the tokenizer, checked as a file's own template:
    it must render a plain conversation (else one line), and one that shows the model no
    tools gets the same one-line warning (``prepare.gguf.renders_tools``)."""
    from jinja2 import TemplateError

    tokenizer.chat_template = template
    try:
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "Turn on the kitchen light."}],
            tokenize=False,
            add_generation_prompt=True,
        )
    except (TemplateError, TypeError, ValueError, KeyError, AttributeError) as err:
        text = str(err).strip()
        reason = text.splitlines()[0] if text else type(err).__name__
        raise ModelLoadError(
            f"--chat-template cannot render a conversation for {path} ({reason})"
        ) from None
    if not renders_tools(tokenizer):
        _LOGGER.warning(
            "the --chat-template does not render tools, so the model never sees them "
            "(tool calls will not work with it)"
        )


def load_model(
    spec: str,
    device: Any,
    dtype: Any,
    chat_template: str | None = None,
    packed: bool | None = None,
) -> LoadedModel:
    """Load the model and tokenizer. Raises ``ModelLoadError`` with a one-line message.

    ``chat_template`` (Jinja source, from ``--chat-template``) replaces the model's own.
    ``packed``: a GGUF file's quantized matrices stay packed (``None``: when it has any;
    ``LoadedModel.packed`` says whether they did)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from . import attention  # imports transformers: only after HF_HUB_OFFLINE is set

    path = resolve_model(spec, own_template=chat_template is not None, packed=packed)
    try:
        config = AutoConfig.from_pretrained(path)
        check_layer_types(config, path)
        tokenizer = AutoTokenizer.from_pretrained(path)
        if has_packed(path):
            model = load_packed_model(path, config, dtype, attention.register())
        else:
            model = AutoModelForCausalLM.from_pretrained(
                path, dtype=dtype, attn_implementation=attention.register()
            )
    except ModelLoadError:
        raise
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ModelLoadError(f"model path {path}: cannot load ({first})") from None
    if chat_template is not None:
        apply_chat_template_override(tokenizer, chat_template, path)
    elif not getattr(tokenizer, "chat_template", None):
        raise ModelLoadError(
            f"model path {path}: the tokenizer has no chat template (give one with "
            "--chat-template FILE)"
        )
    model.to(device).eval()
    copied = copy_mapped_weights(model, path)  # so that the files' mapping can go
    if copied:
        _LOGGER.debug("Copied %d MiB of mapped weights into memory", copied >> 20)
    if str(dtype) == "torch.float64" and _has_experts(config):
        # transformers' default grouped-matmul experts take no float64 (the exactness
        # tests' dtype); its eager loop over experts does.
        model.set_experts_implementation("eager")
    name = spec if spec in BUILTIN_MODELS else path.name
    return LoadedModel(
        path=path,
        name=name,
        model=model,
        tokenizer=tokenizer,
        fingerprint=fingerprint(path),
        context_length=_context_length(config, tokenizer),
        packed=has_packed(path),
    )
