"""Command-line options shared by ``serve`` and ``generate``, and the config they build."""

from __future__ import annotations

import argparse
from pathlib import Path

from .config import MIB, CacheMode, EngineConfig
from .model.prepare.templates import read_chat_template


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {value}")
    return number


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model and cache")
    group.add_argument(
        "--model",
        default="default",
        help=(
            "default (SmolLM2-135M-Instruct), tiny, tiny-tools, a Hugging Face model folder, "
            "or a .gguf file (converted once into the Hearth cache)"
        ),
    )
    group.add_argument(
        "--chat-template",
        type=Path,
        default=None,
        metavar="FILE",
        help=(
            "a Jinja chat template (as llama.cpp and vLLM take it) that replaces the model's"
            " own; needed for a model without one, such as a base model's .gguf file"
        ),
    )
    group.add_argument("--device", default="auto", help="auto (CUDA if present), cpu, cuda, cuda:1")
    group.add_argument(
        "--dtype",
        default="auto",
        help="auto (bf16 where the hardware has it, else fp32), bfloat16, float16, float32",
    )
    group.add_argument(
        "--max-context",
        type=_positive,
        default=None,
        metavar="TOKENS",
        help="serve at most this many tokens per request, prompt and reply (default: the"
        " model's own context); /v1/models reports it, and longer requests get 400"
        " context_length_exceeded",
    )
    group.add_argument(
        "--kv-cache-mb",
        type=_positive,
        default=None,
        help="KV cache budget in MiB (default on a CPU: a quarter of the memory left once the"
        " model is loaded, cgroup limits included, 256 to 1024 MiB; on CUDA a fifth of free"
        " VRAM, at most 16 GiB)",
    )
    group.add_argument(
        "--chunk-tokens",
        type=_positive,
        default=256,
        help="prefill chunk: a long prompt never delays another request by more than this",
    )
    group.add_argument("--max-running", type=_positive, default=8, help="sequences run at once")
    group.add_argument(
        "--max-queue", type=_positive, default=32, help="waiting requests before 503 responses"
    )
    group.add_argument(
        "--prefix-store",
        type=Path,
        default=None,
        help="folder where pinned prefixes are saved, to restore them after a restart",
    )
    group.add_argument(
        "--cache-mode",
        choices=[m.value for m in CacheMode],
        default=CacheMode.RADIX.value,
        help="radix (Hearth), none, or last_prompt (one slot, like llama.cpp; for comparisons)",
    )
    group.add_argument("--cache-salt", default="", help="isolates this engine's cache namespace")
    group.add_argument("--threads", type=_positive, default=None, help="CPU threads for torch")
    group.add_argument(
        "--quantize",
        choices=["auto", "none", "int8", "int4"],
        default="auto",
        help="auto: a quantized GGUF file's matrices stay packed (4/8-bit), anything else "
        "is served as loaded; none: dequantize; int8: per-channel int8 linears; int4: "
        "group-wise int4 (groups of 32, the head int8)",
    )
    group.add_argument(
        "--forward",
        choices=["auto", "lean", "transformers"],
        default="auto",
        help="auto: Hearth's lean forward where the model is supported, else transformers'",
    )
    group.add_argument(
        "--compile",
        choices=["auto", "on", "off"],
        default="off",
        help="compile the decode step in the background (inductor; eager until it is ready;"
        " cached under ~/.cache/hearth/inductor); auto: bfloat16 on a CPU",
    )
    group.add_argument(
        "--no-jump-forward",
        dest="jump_forward",
        action="store_false",
        help="decode the tokens a grammar forces one step each (by default they are appended"
        " in one forward: a tool call's '{\"name\": \"' and a lone allowed tool's name)",
    )


def add_serve_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("server")
    group.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    group.add_argument("--port", type=int, default=8765)
    keys = group.add_mutually_exclusive_group()
    keys.add_argument("--api-key", default=None, help="require this bearer key")
    keys.add_argument("--api-key-file", type=Path, default=None, help="read the key from a file")
    group.add_argument(
        "--insecure",
        action="store_true",
        help="allow a non-loopback bind without an API key (not recommended)",
    )
    group.add_argument(
        "--allowed-hosts",
        action="append",
        default=[],
        metavar="HOSTS",
        help="Host names (comma-separated, repeatable; .suffix for a domain, * for any) served"
        " besides loopback ones when there is no API key: what a reverse proxy or the LAN uses",
    )
    group.add_argument(
        "--allowed-origins",
        action="append",
        default=[],
        metavar="ORIGINS",
        help="web page origins (comma-separated, repeatable), such as http://localhost:3000,"
        " that may call the engine from a browser (CORS); none by default",
    )
    group.add_argument("--max-body-kb", type=_positive, default=1024, help="request body limit")
    group.add_argument(
        "--shutdown-grace-s",
        type=float,
        default=10.0,
        help="on SIGTERM/SIGINT, how long running requests may finish (then they get 503)",
    )
    group.add_argument(
        "--log-prompts", action="store_true", help="log prompt text (off by default: privacy)"
    )


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The engine's config; a bad ``--chat-template`` file is a one-line ``ValueError``."""
    template = args.chat_template
    return EngineConfig(
        model=args.model,
        chat_template=read_chat_template(template) if template is not None else None,
        device=args.device,
        dtype=args.dtype,
        kv_cache_bytes=args.kv_cache_mb * MIB if args.kv_cache_mb else None,
        max_context=args.max_context,
        chunk_tokens=args.chunk_tokens,
        max_running=args.max_running,
        max_queue=args.max_queue,
        prefix_store=args.prefix_store,
        cache_mode=CacheMode(args.cache_mode),
        cache_salt=args.cache_salt,
        threads=args.threads,
        quantize=args.quantize,
        forward=args.forward,
        compile=args.compile,
        jump_forward=args.jump_forward,
    )
