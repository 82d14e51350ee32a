"""The engine: an asyncio front over a worker thread that owns the model.

* The event loop never runs model code and never changes the cache. ``stream()`` hands a
  ``Sequence`` to the worker through the inbox and receives its events through an
  ``asyncio.Queue``. Every wait is bounded: if the worker dies, waiters get an error
  instead of hanging, and ``alive`` (what ``/health`` reports) turns false.
* The worker (``WorkerLoop``, worker.py: ``Engine``'s base, which makes the worker's
  state in its own ``__init__``) loops: drain the inbox, then one step: **schedule**
  (admit waiting requests, plan the step: mixed or split), **run** (one batched decode
  step, one prefill chunk), **postprocess** (sampled tokens to text, finished requests
  into the cache).
* Who owns what: ``Scheduler`` the queues and the plan, ``KVManager`` the cache, buffers
  and budget, ``PinManager`` pins (``PinStore`` their disk store), ``OutputProcessor``
  tokens, stops and finish.
* A request whose uncached prompt another running prefill is already computing waits
  for it (``_leader_for``) and then reads that KV from the cache.
* A failing inbox command fails its own request or pin; a row whose token cannot be
  sampled or processed fails its own request (``_next_token``), and the batch's other
  rows go on; a failing forward fails the running requests; the engine goes on serving
  either way.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from ..cache.radix import CacheFullError, PinTooLargeError
from ..config import EngineConfig, default_kv_budget
from ..constraints.mask import Constraint
from ..model.hardware import (
    on_passing_thread,
    release_free_memory,
    set_threads,
    tune_cpu_allocator,
)
from ..model.huge_pages import back_with_huge_pages
from ..model.runner import ModelRunner
from .detok import TextStream
from .pins import PinStatus
from .sampling import Sampler, SamplingParams
from .scheduler import NeverFitsError, QueueFullError
from .sequence import (
    ErrorEvent,
    Event,
    FinishEvent,
    Kind,
    RequestStats,
    Sequence,
    State,
    TokenEvent,
)
from .worker import Command, WorkerLoop

_LOGGER = logging.getLogger(__name__)
T = TypeVar("T")

# How often a waiter checks that the worker is still alive (seconds).
LIVENESS_S = 1.0

__all__ = [
    "CacheFullError",
    "ContextLengthError",
    "Engine",
    "EngineClosedError",
    "EngineFailedError",
    "NeverFitsError",
    "PinStatus",
    "PinTooLargeError",
    "QueueFullError",
]


class EngineClosedError(RuntimeError):
    """The engine is shutting down and takes no new work."""


class EngineFailedError(RuntimeError):
    """The engine's worker thread stopped: nothing will be served any more."""


class ContextLengthError(ValueError):
    """Prompt plus ``max_tokens`` does not fit the model's context."""


class Engine(WorkerLoop):
    """Thread-safe facade; create with ``Engine.load(config)`` or ``Engine(config, runner)``."""

    def __init__(self, config: EngineConfig, runner: ModelRunner) -> None:
        """The front's state; the worker's is ``WorkerLoop.__init__``'s."""
        self.info = runner.info
        self.instance_id = uuid.uuid4().hex
        self.started_at = time.time()
        budget = config.kv_cache_bytes
        if budget is None:
            chosen = default_kv_budget(runner.layout.device.type)
            budget, self.budget_rule = chosen.bytes, chosen.rule
            _LOGGER.info("KV budget %d MiB: %s", budget >> 20, chosen.rule)
        else:
            self.budget_rule = "--kv-cache-mb"
        super().__init__(config, runner, budget, f"{self.info.namespace}:{config.cache_salt}")
        self._pending_lock = threading.Lock()
        self._pending = 0  # submitted, not yet in the scheduler (guarded by _pending_lock)
        self._thread = threading.Thread(target=self._loop, name="hearth-engine", daemon=True)

    # ================================================================= lifecycle

    @classmethod
    def load(cls, config: EngineConfig) -> Engine:
        """Load the model and build the engine (on a passing thread: see
        ``hardware.on_passing_thread``; the caller's thread runs no torch work)."""
        tune_cpu_allocator()
        set_threads(config.threads)  # process-wide: the threads started later take it up

        def build() -> Engine:
            runner = ModelRunner.load(
                config.model,
                config.device,
                config.dtype,
                config.quantize,
                config.forward,
                compile_mode=config.compile,
                chat_template=config.chat_template,
                max_context=config.max_context,
            )
            return cls(config, runner)

        return on_passing_thread(build)

    def start(self) -> None:
        """Restore stored pins (on a passing thread), give back what loading freed, put
        the weights and restored KV on huge pages, then start the worker thread."""
        on_passing_thread(self.pins.restore_all)
        release_free_memory()  # load-time copies; before the huge pages, not splitting them
        started = time.monotonic()
        huge = back_with_huge_pages()
        if huge:
            _LOGGER.info("%d MiB on 2 MiB pages (%.1f s)", huge, time.monotonic() - started)
        self._thread.start()

    async def shutdown(self, grace_s: float = 10.0) -> None:
        """Refuse new work, let running requests finish (up to ``grace_s``), flush the store."""
        self._closing = True
        deadline = time.monotonic() + grace_s
        while self.busy and self.alive and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    def close(self) -> None:
        """Synchronous stop (tests, scripts)."""
        self._closing = True
        if self._thread.is_alive():
            self._post(self._cancel_all)
            self._post(self._stopped.set)
            self._thread.join(30)
        self.pins.close()

    @property
    def alive(self) -> bool:
        """Whether the worker thread is serving (``/health`` answers 503 when not)."""
        return self._thread.is_alive() and self.failure is None

    @property
    def busy(self) -> bool:
        return bool(self.scheduler.running or self.scheduler.waiting or self._pending)

    @property
    def pending(self) -> int:
        """Requests submitted but not yet queued by the worker."""
        return self._pending

    # ================================================================= public API

    def namespace_for(self, salt: str | None) -> str:
        return self.namespace if not salt else f"{self.namespace}:{salt}"

    def check_context(self, prompt_tokens: int, max_tokens: int) -> None:
        limit = self.info.context_length
        if prompt_tokens + max_tokens > limit:
            raise ContextLengthError(
                f"this model's context is {limit} tokens, but the request needs "
                f"{prompt_tokens + max_tokens} ({prompt_tokens} in the prompt + "
                f"{max_tokens} for the completion)"
            )

    async def stream(
        self,
        prompt: list[int],
        params: SamplingParams,
        *,
        salt: str | None = None,
        constraint: Constraint | None = None,
        stats: RequestStats | None = None,
    ) -> AsyncIterator[Event]:
        """Generate from ``prompt``; yields events, the last one ``FinishEvent`` or ``ErrorEvent``.

        ``constraint``: the grammar the reply must follow (its own, not shared); ``stats``:
        the request's figures so far (the server's preparation), filled in from here on.
        Leaving the iteration early (or cancelling the task) cancels the request.
        """
        if not prompt:
            raise ValueError("the prompt is empty")
        self.check_context(len(prompt), params.max_tokens)
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event] = asyncio.Queue()

        def emit(event: Event) -> None:
            try:
                loop.call_soon_threadsafe(events.put_nowait, event)
            except RuntimeError:  # loop closed: nobody listens
                return

        seq = Sequence(Kind.GENERATE, list(prompt), self.namespace_for(salt), params, emit)
        seq.stream = TextStream(self.runner.tokenizer, params.stop)
        seq.sampler = Sampler(params)
        seq.constraint = constraint
        if stats is not None:
            seq.stats = stats
        self._submit(seq)
        try:
            while True:
                try:
                    event = await asyncio.wait_for(events.get(), LIVENESS_S)
                except TimeoutError:
                    if self.alive:
                        continue
                    event = ErrorEvent(self._failed_message())
                yield event
                if isinstance(event, FinishEvent | ErrorEvent):
                    return
        finally:
            if seq.state is not State.FINISHED:
                self.cancel(seq)

    async def generate(
        self,
        prompt: list[int],
        params: SamplingParams,
        *,
        salt: str | None = None,
        constraint: Constraint | None = None,
    ) -> tuple[str, list[int], FinishEvent]:
        """Non-streaming convenience: the whole text, the token ids and the finish event."""
        parts: list[str] = []
        ids: list[int] = []
        async for event in self.stream(prompt, params, salt=salt, constraint=constraint):
            if isinstance(event, TokenEvent):
                parts.append(event.text)
                ids.append(event.token_id)
            elif isinstance(event, ErrorEvent):
                raise RuntimeError(event.message)
            else:
                parts.append(event.text)
                return "".join(parts), ids, event
        raise RuntimeError("generation ended without a finish event")

    def cancel(self, seq: Sequence) -> None:
        """Cancel from any thread; the worker drops it (and frees its KV) at its next step."""
        if seq.cancelled or seq.state is State.FINISHED:
            return
        seq.cancelled = True
        self._post(lambda: self._drop(seq, "cancelled"))

    async def pin(self, name: str, tokens: list[int], *, wait: bool = True) -> PinStatus:
        """Pin ``tokens`` as ``name`` (replacing an older pin of that name once ready)."""
        if self._closing:
            raise EngineClosedError("the engine is shutting down")
        self._check_alive()
        if not tokens:
            raise ValueError("a pin needs at least one token")
        self.check_context(len(tokens), 1)
        with self._pending_lock:  # a pin waits in the same line as requests
            waiting = self._pending + len(self.scheduler.waiting)
            if waiting >= self.config.max_queue:
                raise QueueFullError(f"{waiting} requests and pins are already waiting")
            self.pins.check_fits(tokens, name)
            status = self.pins.begin(name, tokens)
            self._pending += 1
        done = self.pins.wait(status)
        generation, tokens = status.generation, list(tokens)
        counted = [True]

        def queued() -> None:  # it left ``_pending`` (once, whatever happens next)
            if counted:
                counted.clear()
                with self._pending_lock:
                    self._pending -= 1

        def start() -> None:
            queued()
            self._start_pin(name, generation, tokens)

        def fail(message: str) -> None:
            queued()
            self.pins.fail(name, generation, message)

        self._post(start, fail=fail)
        if not wait:
            return status
        while True:
            try:
                return await asyncio.wait_for(asyncio.shield(done), LIVENESS_S)
            except TimeoutError:
                if not self.alive:
                    self.pins.fail(name, generation, self._failed_message())

    def unpin(self, name: str) -> bool:
        """Remove a pin; its KV stays cached (unpinned) until evicted. False if unknown."""
        known = self.pins.forget(name)
        self._post(lambda: self.pins.release(name))
        return known

    def pin_status(self, name: str) -> dict[str, Any] | None:
        return self.pins.status(name)

    def pin_names(self) -> list[str]:
        return self.pins.names()

    async def clear_cache(self) -> int:
        """Drop every cached prefix that is neither pinned nor in use; returns bytes freed."""
        return await self._call(self.kv.clear)

    async def settled(self) -> None:
        """Return once the worker has run every command posted before this call (an
        ``unpin``'s release, say), so counters read afterwards include them."""
        await self._call(lambda: None)

    async def on_worker(self, run: Callable[[], T]) -> T:
        """Run ``run`` on the worker thread and await its result (benchmarks: torch work
        on one thread, as in serving; see ``hardware.on_passing_thread``)."""
        return await self._call(run)

    async def _call(self, run: Callable[[], T]) -> T:
        """Run ``run`` on the worker thread and await its result (bounded waits)."""
        self._check_alive()
        result: Future[T] = Future()
        self._post(
            lambda: result.set_result(run()),
            fail=lambda message: result.set_exception(EngineFailedError(message)),
        )
        waiting = asyncio.wrap_future(result)
        while True:
            try:  # shielded: a check that times out must not cancel the call
                return await asyncio.wait_for(asyncio.shield(waiting), LIVENESS_S)
            except TimeoutError:
                self._check_alive()

    # ================================================================= cross-thread plumbing

    def _check_alive(self) -> None:
        if self._thread.ident is not None and not self.alive:
            raise EngineFailedError(self._failed_message())

    def _failed_message(self) -> str:
        return f"the engine stopped: {self.failure or 'worker not running'}"

    def _post(self, run: Callable[[], None], fail: Callable[[str], None] | None = None) -> None:
        self._inbox.put(Command(run, fail))
        self._wake.set()

    def _submit(self, seq: Sequence) -> None:
        if self._closing:
            raise EngineClosedError("the engine is shutting down")
        self._check_alive()
        if (reason := self.kv.never_fits(seq)) is not None:
            raise NeverFitsError(reason)
        with self._pending_lock:
            waiting = self._pending + len(self.scheduler.waiting)
            if waiting >= self.config.max_queue:
                raise QueueFullError(f"{waiting} requests are already waiting")
            self._pending += 1
        self._post(lambda: self._enqueue(seq), fail=lambda message: self._fail(seq, message))

    def _enqueue(self, seq: Sequence) -> None:
        with self._pending_lock:
            self._pending -= 1
        if seq.cancelled:
            seq.state = State.FINISHED
            return
        self.scheduler.enqueue(seq)
