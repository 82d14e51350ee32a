"""One configuration object that flows from the CLI down to every component."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path

from .kv_budget import Budget, cpu_budget, cuda_budget, read_host

MIB = 1 << 20


class CacheMode(enum.Enum):
    """How prompts are reused.

    * ``radix``: Hearth's prefix cache (pins + LRU over a radix tree).
    * ``none``: no reuse at all; every request prefills its whole prompt.
    * ``last_prompt``: one slot that keeps only the previous request, as Ollama and
      llama.cpp do by default. Pins are accepted but not kept. For comparisons.
    """

    RADIX = "radix"
    NONE = "none"
    LAST_PROMPT = "last_prompt"


@dataclass
class EngineConfig:
    model: str = "default"
    chat_template: str | None = None  # Jinja source replacing the model's (--chat-template)
    device: str = "auto"
    dtype: str = "auto"
    kv_cache_bytes: int | None = None  # None: see default_kv_budget()
    max_context: int | None = None  # a cap on the model's context (--max-context)
    chunk_tokens: int = 256
    max_running: int = 8
    max_queue: int = 32
    prefix_store: Path | None = None
    cache_mode: CacheMode = CacheMode.RADIX
    cache_salt: str = ""
    # Read cached prefixes in place (False: copy them into each request's buffer).
    share_prefix: bool = True
    threads: int | None = None
    quantize: str = "auto"  # auto | none | int8 | int4 (model.linear.Quantization)
    forward: str = "auto"  # auto | lean | transformers (runner.Forward)
    compile: str = "off"  # auto | on | off (step_compiler.CompileMode)
    default_max_tokens: int = 512
    # Tokens a grammar forces are appended without a decode step each (jump-forward).
    jump_forward: bool = True
    extra_stop_tokens: tuple[str, ...] = field(
        default=("<|im_end|>", "<|endoftext|>", "<|eot_id|>")
    )


def default_kv_budget(device_type: str) -> Budget:
    """The KV budget when ``--kv-cache-mb`` is not given (``kv_budget``: a quarter of the
    room left on a CPU, 256 MiB to 1 GiB; a fifth of free VRAM on CUDA)."""
    if device_type == "cuda":
        import torch

        free, _total = torch.cuda.mem_get_info()
        return cuda_budget(int(free))
    return cpu_budget(read_host())
