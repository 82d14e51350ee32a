"""What every handler needs, stored on the aiohttp application."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import ClassVar, TypeVar

from aiohttp import web

from ..chat.formatter import ChatFormatter
from ..constraints.compiler import ConstraintCompiler
from ..serving.engine import Engine
from .metrics import Metrics
from .prompts import PromptEncoder

T = TypeVar("T")


@dataclass
class ServerState:
    KEY: ClassVar[web.AppKey[ServerState]]

    engine: Engine
    formatter: ChatFormatter
    metrics: Metrics
    api_key: str | None
    log_prompts: bool = False
    prompts: PromptEncoder = field(init=False)
    # Grammars of constrained requests, compiled once per tool set (prepare thread only).
    constraints: ConstraintCompiler = field(init=False)
    # The one thread that renders and tokenizes prompts (the formatter's tokenizer is used
    # nowhere else): a 5k-token house prompt takes milliseconds the event loop can't spare.
    prepare_executor: ThreadPoolExecutor = field(init=False)

    def __post_init__(self) -> None:
        self.prompts = PromptEncoder(self.formatter)
        self.constraints = ConstraintCompiler(
            self.formatter.tokenizer,
            self.engine.info.vocab_size,
            self.engine.output.stop_token_ids,
            self.formatter.tool_format,
        )
        self.prepare_executor = ThreadPoolExecutor(1, thread_name_prefix="hearth-prepare")
        # Build the tokenizer's trie for constrained decoding now (1-3 s), not on the
        # first request with tools.
        self.prepare_executor.submit(self.constraints.warm)

    async def prepare_timed(
        self, fn: Callable[[], T], since: float
    ) -> tuple[T, tuple[float, float]]:
        """``prepare(fn)``, and how long it took in ms: from ``since`` (a ``monotonic``
        time: the request's arrival) until the prepare thread took it up, and running."""
        started = 0.0

        def timed() -> T:
            nonlocal started
            started = time.monotonic()
            return fn()

        result = await self.prepare(timed)
        done = time.monotonic()
        return result, ((started - since) * 1000, (done - started) * 1000)

    async def prepare(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` (rendering, tokenizing) on the prepare thread and wait for it.

        Its exceptions (``APIError``, ``ChatTemplateError``...) are raised here.
        """
        return await asyncio.get_running_loop().run_in_executor(self.prepare_executor, fn)

    def close(self) -> None:
        self.prepare_executor.shutdown(wait=False, cancel_futures=True)


ServerState.KEY = web.AppKey("hearth_state", ServerState)
