"""Command line: ``python -m hearth_engine {serve,generate,prepare} ...``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence

from . import cpu_class
from .cli import add_engine_args, add_serve_args, engine_config_from_args
from .model.errors import ModelLoadError

_LOGGER = logging.getLogger("hearth_engine")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hearth_engine",
        description="Hearth: a local LLM engine that keeps your house's prompt warm.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the OpenAI-compatible HTTP server")
    add_engine_args(serve)
    add_serve_args(serve)

    gen = sub.add_parser("generate", help="print one reply to a prompt")
    add_engine_args(gen)
    gen.add_argument("prompt", help="the user message")
    gen.add_argument("--system", default=None, help="an optional system message")
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--seed", type=int, default=None)

    prep = sub.add_parser(
        "prepare", help="build the default and test models (and the native kernels) into the cache"
    )
    prep.add_argument(
        "models",
        nargs="*",
        default=["default", "tiny", "tiny-tools", "native"],
        choices=["default", "tiny", "tiny-tools", "native"],
        help="native: Hearth's C++ decode attention for this CPU (native.py)",
    )
    return parser


def _prepare(models: Sequence[str]) -> int:
    from .model import native
    from .model.loader import resolve_model

    for name in models:
        if name == "native":
            if native.load() is None:
                print(f"error: the native kernels did not build: {native.error()}", file=sys.stderr)
                return 1
            print(f"native: {native.build_dir()}")
            continue
        path = resolve_model(name)
        print(f"{name}: {path}")
    return 0


async def _generate(args: argparse.Namespace) -> int:
    from .chat.formatter import ChatFormatter
    from .serving.engine import Engine
    from .serving.sampling import SamplingParams
    from .serving.sequence import FinishEvent, TokenEvent

    engine = await asyncio.to_thread(Engine.load, engine_config_from_args(args))
    engine.start()
    try:
        formatter = ChatFormatter(engine.runner.tokenizer)
        messages = [{"role": "user", "content": args.prompt}]
        if args.system:
            messages.insert(0, {"role": "system", "content": args.system})
        prompt = formatter.encode(formatter.render(messages, add_generation_prompt=True))
        params = SamplingParams(
            max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed
        )
        async for event in engine.stream(prompt, params):
            if isinstance(event, TokenEvent | FinishEvent):
                sys.stdout.write(event.text)
                sys.stdout.flush()
        sys.stdout.write("\n")
    finally:
        await engine.shutdown()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        cpu_class.selected()  # HEARTH_CPU: a class this CPU cannot run stops here, in one line
        if args.command == "prepare":
            return _prepare(args.models)
        if args.command == "generate":
            return asyncio.run(_generate(args))
        from .server.main import serve

        return serve(args)
    except ModelLoadError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
