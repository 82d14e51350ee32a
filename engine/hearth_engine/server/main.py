"""``hearth_engine serve``: load the model, bind safely, serve, and shut down gracefully."""

from __future__ import annotations

import argparse
import asyncio
import gc
import ipaddress
import logging
import signal
import sys
import time

from aiohttp import web

from ..cli import engine_config_from_args
from ..config import MIB
from ..serving.engine import Engine
from .app import create_app
from .guard import Guard

_LOGGER = logging.getLogger("hearth_engine.server")


def freeze_startup_objects() -> int:
    """Move every object alive after start-up (the model's modules, torch, transformers:
    about 370k) out of the garbage collector's scans; returns how many.

    A full collection scans every tracked object: with the model loaded one took 190 ms
    (2-vCPU Xeon), a pause for whichever request's thread set it off. Python runs one when
    enough objects have outlived two younger collections, which a long-running server
    reaches now and then. Frozen, those objects are never scanned again (a full
    collection then took under 1 ms); what serving allocates is collected as before.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class StartupError(ValueError):
    """A configuration the server refuses to start with (one-line message)."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_unspecified(host: str) -> bool:
    """0.0.0.0, :: or an empty host: every interface."""
    if not host:
        return True
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def read_api_key(args: argparse.Namespace) -> str | None:
    if args.api_key_file is not None:
        try:
            key = args.api_key_file.read_text().strip()
        except OSError as err:
            raise StartupError(f"--api-key-file {args.api_key_file}: {err.strerror}") from None
        if not key:
            raise StartupError(f"--api-key-file {args.api_key_file} is empty")
        return key
    if args.api_key is None:
        return None
    # Stripped like --api-key-file: HTTP drops a header's surrounding whitespace, so a
    # padded key (say from a .env file) could never match and every request would be a 401.
    key = args.api_key.strip()
    if not key:
        raise StartupError("--api-key is empty")
    return key


def check_bind(host: str, api_key: str | None, insecure: bool) -> None:
    if not is_loopback(host) and api_key is None and not insecure:
        raise StartupError(
            f"refusing to listen on {host} without an API key: anyone on your network could "
            "use the engine. Pass --api-key/--api-key-file, bind to 127.0.0.1, or add "
            "--insecure if you really mean it."
        )


def allowed_hosts(args: argparse.Namespace) -> list[str]:
    """``--allowed-hosts``, and the address the engine listens on when it is a specific
    one: a client that reaches it there names it as the Host."""
    bound = [] if is_loopback(args.host) or is_unspecified(args.host) else [args.host]
    return [*args.allowed_hosts, *bound]


def check_guard(args: argparse.Namespace, api_key: str | None) -> None:
    """Refuse a bad ``--allowed-hosts``/``--allowed-origins`` before the model loads."""
    try:
        Guard.build(
            api_key=api_key,
            allowed_hosts=allowed_hosts(args),
            allowed_origins=args.allowed_origins,
        )
    except ValueError as err:
        raise StartupError(str(err)) from None
    if api_key is None and is_unspecified(args.host) and not args.allowed_hosts:
        _LOGGER.warning(
            "Listening on %s without an API key: only requests to a loopback name are served;"
            " add --allowed-hosts with the name or address other clients use",
            args.host,
        )


async def _serve(args: argparse.Namespace, api_key: str | None) -> int:
    # Signals are handled from the start: SIGTERM or Ctrl-C while the model loads is a
    # clean stop (exit 0) too, not a death by signal.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    config = engine_config_from_args(args)
    _LOGGER.info(
        "Loading model %s (device %s, dtype %s)...", config.model, config.device, config.dtype
    )
    started = time.monotonic()
    engine = await asyncio.to_thread(Engine.load, config)
    if stop.is_set():
        engine.close()
        _LOGGER.info("Stopped before serving (a stop signal came while the model loaded)")
        return 0
    await asyncio.to_thread(engine.start)
    frozen = freeze_startup_objects()
    _LOGGER.info(
        "Model ready in %.1f s (%d start-up objects frozen out of the garbage collector's scans)",
        time.monotonic() - started,
        frozen,
    )
    app = create_app(
        engine,
        api_key=api_key,
        max_body_bytes=args.max_body_kb * 1024,
        log_prompts=args.log_prompts,
        allowed_hosts=allowed_hosts(args),
        allowed_origins=args.allowed_origins,
    )
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    try:
        await site.start()
    except OSError as err:
        await runner.cleanup()
        await engine.shutdown(0)
        raise StartupError(f"cannot listen on {args.host}:{args.port}: {err.strerror}") from None
    info = engine.info
    _LOGGER.info(
        "Hearth engine ready on http://%s:%d (model=%s, device=%s, dtype=%s, KV budget=%d MiB, "
        "prefix store=%s, auth=%s)",
        args.host,
        args.port,
        info.name,
        info.device,
        info.dtype,
        engine.kv.cache.capacity_bytes // MIB,
        config.prefix_store or "off",
        "on" if api_key else "off",
    )
    await stop.wait()
    _LOGGER.info("Shutting down: no new requests; finishing running ones")
    await site.stop()
    await engine.shutdown(grace_s=max(0.0, args.shutdown_grace_s))
    await runner.cleanup()
    _LOGGER.info("Stopped")
    return 0


def serve(args: argparse.Namespace) -> int:
    try:
        api_key = read_api_key(args)
        check_bind(args.host, api_key, args.insecure)
        check_guard(args, api_key)
        return asyncio.run(_serve(args, api_key))
    except StartupError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
