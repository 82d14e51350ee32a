"""Any GGUF file as a Hearth model: checked, dequantized and converted once into the cache.

People who run Ollama or LM Studio have ``.gguf`` files, not Hugging Face folders.
``--model PATH.gguf`` goes through transformers' GGUF support, as the default model
does: the file is read offline, every weight is dequantized, and the result is saved as
a plain safetensors folder in the Hearth cache. Later starts load that folder directly.

* **Key.** The folder is ``models/gguf-<sha256 of the file>/<file stem>`` (the stem is
  the name ``/v1/models`` shows), and its build marker holds ``BUILD_VERSION``: a moved
  copy reuses its conversion, an edited file never does, and a new converter rebuilds.
  Hashing a few GB costs seconds, so the digest is remembered per (path, size, mtime,
  inode): an unchanged file is hashed once.
* **Checks first.** The header is read before anything slow: a file that is not GGUF, an
  architecture transformers cannot read, a quantization type nobody can dequantize, a
  missing chat template, or layers the engine cannot cache (``check_layer_types``)
  each give one line naming the file and the cause, instead of a minute of conversion
  followed by a stack trace.
* **Template.** The chat template is the one in the file's metadata
  (``tokenizer.chat_template``). Whether it renders tools is checked once, at
  conversion, and a one-line warning repeats at every start when it does not.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError
from ..layer_types import check_layer_types
from .cache_dir import build_once, cache_root, is_built, models_dir

_LOGGER = logging.getLogger(__name__)

BUILD_VERSION = "gguf/1"
PACKED_VERSION = "gguf-packed/5"  # 2: Q5_0/Q5_1; 3: q/k rows; 4: int6; 5: two levels
INFO_FILE = "hearth-gguf.json"
"""Written into a converted folder: the source file, its digest, whether tools render."""
HASHES_FILE = "gguf-hashes.json"
_CHUNK = 1 << 22
_PROBE_TOOL = "hearth_probe_tool"


@dataclass(frozen=True)
class GGUFHeader:
    """What the file's header says, read without touching the tensor data."""

    architecture: str
    tensor_types: tuple[str, ...]
    chat_template: str | None


# ------------------------------------------------------------------ identity


def _stat_key(path: Path) -> str:
    stat = path.stat()
    return f"{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ino}"


def file_sha256(path: Path) -> str:
    """The sha256 of the file's bytes, read in 4 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def content_hash(path: Path) -> str:
    """``file_sha256``, remembered per (path, size, mtime, inode) in the Hearth cache.

    Any write to the file changes its mtime (and usually its size), so a remembered digest
    is only reused for the very bytes it was computed from.
    """
    memo_file = cache_root() / HASHES_FILE
    key, stat = str(path.resolve()), _stat_key(path)
    try:
        memo = json.loads(memo_file.read_text())
    except (OSError, ValueError):
        memo = {}
    entry = memo.get(key) if isinstance(memo, dict) else None
    if isinstance(entry, dict) and entry.get("stat") == stat:
        return str(entry["sha256"])
    _LOGGER.info("Hashing %s (once per version of the file)", path)
    digest = file_sha256(path)
    memo = memo if isinstance(memo, dict) else {}
    memo[key] = {"stat": stat, "sha256": digest}
    memo_file.parent.mkdir(parents=True, exist_ok=True)
    # Written whole and renamed: a concurrent reader sees the old or the new memo.
    fd, tmp = tempfile.mkstemp(prefix=f".{HASHES_FILE}.", dir=memo_file.parent)
    with os.fdopen(fd, "w") as handle:
        json.dump(memo, handle)
    os.replace(tmp, memo_file)
    return digest


def gguf_model_dir(path: Path, digest: str, packed: bool = False) -> Path:
    """``models/gguf-<digest>[-packed]/<file stem>``: the stem is the name ``/v1/models``
    shows; a packed conversion (quantized matrices kept) has a folder of its own."""
    return models_dir() / f"gguf-{digest[:16]}{'-packed' if packed else ''}" / path.stem


# ------------------------------------------------------------------ checks


def _field_text(reader: Any, key: str) -> str | None:
    field = reader.fields.get(key)
    if field is None:
        return None
    value = field.contents()
    return value if isinstance(value, str) else None


def read_header(path: Path) -> GGUFHeader:
    """Parse the header (memory-mapped); a file that is not a readable GGUF is one line."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
        architecture = _field_text(reader, "general.architecture")
        types = tuple(sorted({t.tensor_type.name for t in reader.tensors}))
    except (ValueError, OSError, IndexError, KeyError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ModelLoadError(f"model file {path} is not a readable GGUF file ({reason})") from None
    if not architecture:
        raise ModelLoadError(f"model file {path} has no general.architecture in its metadata")
    return GGUFHeader(architecture, types, _field_text(reader, "tokenizer.chat_template"))


def _dequantizable(type_name: str) -> bool:
    """Whether gguf-py can turn this tensor type into floats (what transformers calls)."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, dequantize

    qtype = GGMLQuantizationType[type_name]
    _block, type_size = GGML_QUANT_SIZES[qtype]
    try:
        dequantize(np.zeros((1, type_size), dtype=np.uint8), qtype)
    except NotImplementedError:
        return False
    return True


def check_header(path: Path, header: GGUFHeader, own_template: bool = False) -> None:
    """Refuse quantization types that cannot be dequantized and files without a template
    (unless ``own_template``: a ``--chat-template`` replaces the file's)."""
    from importlib.metadata import version

    missing = [t for t in header.tensor_types if not _dequantizable(t)]
    if missing:
        raise ModelLoadError(
            f"model file {path}: quantization type {', '.join(missing)} cannot be dequantized "
            f"(gguf {version('gguf')}, used by transformers)"
        )
    if not header.chat_template and not own_template:
        raise ModelLoadError(no_template_message(path))


def no_template_message(path: Path) -> str:
    return (
        f"model file {path} has no chat template in its metadata (tokenizer.chat_template); "
        "give one with --chat-template FILE"
    )


def load_config(path: Path, header: GGUFHeader) -> Any:
    """The transformers config the file maps to; an architecture it cannot read is one line."""
    import transformers
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    except (ValueError, KeyError, NotImplementedError) as err:
        text = str(err).strip()
        if "architecture" in text or "model_type" in text or isinstance(err, KeyError):
            raise ModelLoadError(
                f"model file {path}: GGUF architecture {header.architecture!r} is not supported "
                f"by transformers {transformers.__version__}"
            ) from None
        reason = text.splitlines()[0] if text else type(err).__name__
        raise ModelLoadError(f"model file {path}: cannot read its metadata ({reason})") from None


def renders_tools(tokenizer: Any) -> bool:
    """Whether the chat template shows the model a tool: render one and look for its name."""
    from jinja2 import TemplateError

    tool = {
        "type": "function",
        "function": {
            "name": _PROBE_TOOL,
            "description": "Turn on a light.",
            "parameters": {"type": "object", "properties": {"name": {"type": "string"}}},
        },
    }
    messages = [{"role": "system", "content": "You are a home assistant."}]
    messages.append({"role": "user", "content": "Turn on the kitchen light."})
    try:
        text = tokenizer.apply_chat_template(
            messages, tools=[tool], tokenize=False, add_generation_prompt=True
        )
    except (TemplateError, TypeError, ValueError):
        return False
    return _PROBE_TOOL in str(text)


# ------------------------------------------------------------------ conversion


def weights_dtype(header: GGUFHeader) -> Any:
    """float32 for an all-F32 file, float16 for all-F16 weights, else bfloat16.

    Norms are F32 in nearly every file, so the matrices decide: a quantized file's values
    carry less precision than bfloat16, which halves the folder and its load time.
    """
    import torch

    kinds = set(header.tensor_types)
    if kinds == {"F32"}:
        return torch.float32
    if kinds <= {"F32", "F16"}:
        return torch.float16
    return torch.bfloat16


def convert(source: Path, out: Path, name: str, dtype: Any, chat_template: str | None) -> Any:
    """Dequantize ``source`` into a safetensors folder ``out``; returns the tokenizer.

    ``chat_template`` replaces the file's own when given (the default model's).
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(
        source.parent,
        gguf_file=source.name,
        dtype=dtype,
        # Every weight unpacked into a dense tensor, never left in GGUF blocks.
        quantization_config=GgufConfig(dequantize=True),
    )
    # These two would make transformers treat the saved folder as GGUF again.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.name_or_path = name
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return tokenizer


def _build(source: Path, digest: str, header: GGUFHeader, out: Path, packed: bool) -> None:
    _LOGGER.info("Converting %s into the Hearth cache (once)", source)
    forms: dict[str, str] = {}
    if packed:
        tokenizer, forms = convert_packed_folder(source, out, header)
    else:
        tokenizer = convert(source, out, source.stem, weights_dtype(header), None)
    info = {
        "source": str(source),
        "sha256": digest,
        "architecture": header.architecture,
        "tools": renders_tools(tokenizer),
        "chat_template": bool(header.chat_template),
        "quantized": is_quantized(header),
        "packed": forms,
    }
    (out / INFO_FILE).write_text(json.dumps(info))


def is_quantized(header: GGUFHeader) -> bool:
    """Whether the file holds matrices of a block type Hearth keeps packed."""
    from ..quant.ggml_blocks import supported

    return any(supported(t) for t in header.tensor_types)


def convert_packed_folder(
    source: Path, out: Path, header: GGUFHeader, chat_template: str | None = None
) -> tuple[Any, dict[str, str]]:
    """Config, tokenizer and the packed weights (``quant.folder``) of ``source`` into ``out``.

    ``chat_template`` replaces the file's own when given (the default model's)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoTokenizer

    from ..quant.folder import convert_packed

    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    config = load_config(source, header)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = source.stem
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return tokenizer, convert_packed(source, out, config, torch.bfloat16)


def prepare_gguf_model(
    path: Path, *, own_template: bool = False, packed: bool | None = None
) -> Path:
    """The converted folder for the GGUF file ``path``, converting it on first use.

    ``packed``: keep the file's quantized matrices packed (``quant.folder``; a folder of
    its own) or dequantize every weight (``False``); ``None`` packs a file that has
    quantized matrices (the default). ``own_template``: a ``--chat-template`` replaces
    the file's template, so a file without one is converted (with none) and the file's
    tool warning does not apply."""
    if not path.exists():
        raise ModelLoadError(f"model path {path} does not exist")
    if not path.is_file():
        raise ModelLoadError(f"model path {path} is not a file (expected a .gguf file)")
    if not os.access(path, os.R_OK):
        raise ModelLoadError(f"model path {path} is not readable")
    digest = content_hash(path)
    if packed is None:
        packed = _packed_by_default(path, digest)
    folder = gguf_model_dir(path, digest, packed)
    version = f"{PACKED_VERSION if packed else BUILD_VERSION}:{digest}"
    if not is_built(folder, version):
        # Parsing the header takes seconds for a large vocabulary: only before a conversion.
        header = read_header(path)
        check_header(path, header, own_template)
        config = load_config(path, header)
        check_layer_types(config, path)
        try:
            build_once(folder, version, lambda out: _build(path, digest, header, out, packed))
        except (ValueError, KeyError, NotImplementedError, RuntimeError, OSError) as err:
            # What the checks above cannot see (a tokenizer kind, a tensor transformers
            # does not map): still one line, and no half-built folder is left behind.
            text = str(err).strip()
            reason = text.splitlines()[0] if text else type(err).__name__
            raise ModelLoadError(f"model file {path}: cannot convert it ({reason})") from None
    if not own_template:
        _check_own_template(folder, path)
    return folder


def _packed_by_default(path: Path, digest: str) -> bool:
    """A converted folder says whether the file is quantized; else the header does."""
    for packed in (True, False):
        folder = gguf_model_dir(path, digest, packed)
        version = f"{PACKED_VERSION if packed else BUILD_VERSION}:{digest}"
        if is_built(folder, version):
            try:
                info = json.loads((folder / INFO_FILE).read_text())
            except (OSError, ValueError):
                break
            if packed or "quantized" in info:
                return packed or bool(info["quantized"])
    return is_quantized(read_header(path))


def _check_own_template(folder: Path, source: Path) -> None:
    """A converted file without a template is refused; one whose template shows no tools
    gets a one-line warning (at every start)."""
    try:
        info = json.loads((folder / INFO_FILE).read_text())
    except (OSError, ValueError):
        info = {}
    if not info.get("chat_template", True):
        raise ModelLoadError(no_template_message(source))
    if not info.get("tools", False):
        _LOGGER.warning(
            "%s: the file's chat template does not render tools, so the model never sees them "
            "(tool calls will not work with this model)",
            source,
        )
