"""The engine: an asyncio front over a worker thread that owns the model.

* The event loop never runs model code and never changes the cache. ``stream()`` hands a
  ``Sequence`` to the worker through the inbox and receives its events through an
  ``asyncio.Queue``. Every wait is bounded: if the worker dies, waiters get an error
  instead of hanging, and ``alive`` (what ``/health`` reports) turns false.
* The worker loops: drain the inbox, then one step: **schedule** (admit waiting
  requests, plan the step), **run** (one batched decode step, one prefill chunk),
  **postprocess** (sampled tokens to text, finished requests into the cache).
* Who owns what: ``Scheduler`` the queues, ``KVManager`` the cache, buffers and budget,
  ``PinManager`` pins and the disk store, ``OutputProcessor`` tokens, stops and finish.
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
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from .batch import DecodeBatch
from .cache import CacheFullError, Match, PinTooLargeError, common_prefix
from .config import CacheMode, EngineConfig, default_kv_budget
from .constraints.mask import Constraint, Masker
from .detok import TextStream
from .hardware import on_passing_thread, set_threads, tune_cpu_allocator
from .kv_manager import KVManager
from .output import Counters, OutputProcessor
from .pins import PinManager, PinStatus
from .runner import ModelRunner
from .sampling import Sampler, SamplingError, SamplingParams
from .scheduler import NeverFitsError, QueueFullError, Scheduler
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

_LOGGER = logging.getLogger(__name__)
T = TypeVar("T")

# How often a waiter checks that the worker is still alive (seconds).
LIVENESS_S = 1.0
# A prefill chunk of at most this many tokens runs in the same forward as a decode step
# (``_mixed_step``): the weights are read once for both. Measured on a 2-core EPYC
# (default model, bf16, one decode row on the 5.4k house): see README, Decode speed.
MIX_MAX_TOKENS = 256
# Pin prefill stretches remembered to tell requests how long they waited behind pins:
# a request waits at most ``max_queue`` steps' worth of chunks in practice.
PIN_WORK_KEPT = 256

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


@dataclass(frozen=True)
class Command:
    """Work for the worker thread; ``fail`` tells the command's owner when it raised."""

    run: Callable[[], None]
    fail: Callable[[str], None] | None = None


class Engine:
    """Thread-safe facade; create with ``Engine.load(config)`` or ``Engine(config, runner)``."""

    def __init__(self, config: EngineConfig, runner: ModelRunner) -> None:
        self.config = config
        self.runner = runner
        self.info = runner.info
        self.instance_id = uuid.uuid4().hex
        self.started_at = time.time()
        budget = config.kv_cache_bytes
        if budget is None:
            budget = default_kv_budget(runner.layout.device.type)
        self.namespace = f"{self.info.namespace}:{config.cache_salt}"
        self.counters = Counters()
        self.scheduler = Scheduler(config.max_running, config.chunk_tokens, config.max_queue)
        self.kv = KVManager(config, runner, budget, lambda: self.scheduler.prefilling)
        self.output = OutputProcessor(config, runner, self.counters)
        self.masker = Masker(self.info.vocab_size)  # grammar masks of constrained requests
        self.pins = PinManager(config, self.namespace, self.kv, self.counters)
        if self.pins.store is not None:  # sliding layers store their last window only
            layout = runner.layout
            trimmed = layout.sliding if layout.trims_windows else ()
            self.pins.store.keep_windows(layout.layers, trimmed, layout.window)
            self.pins.store.keep_states(len(layout.state_layers))
        self._inbox: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._pending_lock = threading.Lock()
        self._pending = 0  # submitted, not yet in the scheduler (guarded by _pending_lock)
        # The latest stretches of pin prefill (monotonic start, end): worker thread only.
        self._pin_work: deque[tuple[float, float]] = deque(maxlen=PIN_WORK_KEPT)
        self._closing = False
        self._stopped = threading.Event()
        self.failure: str | None = None  # why the worker stopped, if it died
        self._thread = threading.Thread(target=self._run, name="hearth-engine", daemon=True)

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
            )
            return cls(config, runner)

        return on_passing_thread(build)

    def start(self) -> None:
        """Restore stored pins (on a passing thread), then start the worker thread."""
        on_passing_thread(self.pins.restore_all)
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

    # ================================================================= the worker

    def _run(self) -> None:
        try:
            while not self._stopped.is_set():
                self._drain_inbox()
                self.kv.publish_usage()  # after each step and command: what stats read
                if self._stopped.is_set():
                    break
                if not self.step():
                    self._wake.wait(timeout=0.5)
                    self._wake.clear()
        except BaseException as err:
            # A bug in the loop itself: say so loudly, and fail everyone (never hang).
            _LOGGER.critical("The engine worker stopped", exc_info=err)
            self.failure = f"internal engine error: {type(err).__name__}"
        finally:
            self._fail_everything(self.failure or "the engine is shutting down")

    def _drain_inbox(self) -> None:
        while True:
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                return
            try:
                command.run()
            except Exception as err:
                _LOGGER.exception("Engine command failed")
                if command.fail is not None:
                    self._report(command.fail, f"internal engine error: {type(err).__name__}")

    def step(self) -> bool:
        """One engine step: schedule, run, postprocess. False when there was nothing to do."""
        self._admit_waiting()
        plan = self.scheduler.plan()
        if plan.empty:
            return False
        try:
            prefill = plan.prefill
            if (
                plan.decode
                and prefill is not None
                and prefill.state is State.PREFILLING
                and plan.chunk <= MIX_MAX_TOKENS
                and self.runner.can_mix
            ):
                self._mixed_step(plan.decode, prefill, plan.chunk)
                return True
            if plan.decode:
                self._decode_step(plan.decode)
            if prefill is not None and prefill.state is State.PREFILLING:
                self._prefill_chunk(prefill, plan.chunk)
        except Exception as err:
            _LOGGER.exception("Engine step failed; failing the running requests")
            self._fail_running(f"internal engine error: {type(err).__name__}")
        return True

    # -- schedule: admission ---------------------------------------------------------

    def _admit_waiting(self) -> None:
        free = self.scheduler.free_slots
        for seq in self.scheduler.admissible():
            if free <= 0:
                return
            try:
                started = self._admit(seq)
            except Exception as err:
                _LOGGER.exception("Admitting a request failed")
                self._fail(seq, f"internal engine error: {type(err).__name__}")
                continue
            if started is None:  # its KV does not fit yet: nothing overtakes it
                return
            free -= started

    def _leader_for(self, seq: Sequence, match: Match[torch.Tensor]) -> Sequence | None:
        """A running prefill that is computing at least a chunk of ``seq``'s uncached prompt.

        ``seq`` then waits for it instead of computing the same tokens twice: a burst of
        requests over one uncached prefix (right after a start, before the pin is ready)
        costs one prefill, not one each.
        """
        if self.config.cache_mode is not CacheMode.RADIX:
            return None
        limit = self.kv.match_limit(seq)
        for other in self.scheduler.prefilling:
            if other.namespace != seq.namespace or other.cancelled:
                continue
            shared = common_prefix(seq.prompt[:limit], other.prompt)
            # A snapshot model resumes only where the leader's snapshot will be: at the
            # end of its prompt (KVManager.store).
            resumable = self.kv.snapshots is None or shared == len(other.prompt)
            if resumable and shared - match.length >= self.config.chunk_tokens:
                return other
        return None

    def _admit(self, seq: Sequence) -> bool | None:
        """Start ``seq``; False when it stays in line (it waits for a leader's prefill),
        None when its KV does not fit the budget beside the running ones yet."""
        if seq.cancelled:
            self._drop(seq, "cancelled")
            return False
        match = self.kv.match(seq)
        leader = self._leader_for(seq, match)
        if leader is not None:
            leader.has_followers = True
            return False
        fits = self.kv.fits(seq, match)
        if not fits and not self.kv.idle:
            return None  # running requests will end and free their KV
        if not fits and seq.kind is Kind.GENERATE:  # not even alone: never
            reason = self.kv.never_fits(seq) or "the KV budget is held by pins"
            self._fail(seq, reason, status=503)
            return False
        seq.cached = match.length
        seq.prefill_started = time.monotonic()
        seq.stats.queue_ms = (seq.prefill_started - seq.arrival) * 1000
        seq.stats.prompt_tokens = len(seq.prompt)
        seq.stats.cached_tokens = match.length
        self.kv.place(seq, match, strict=fits)  # a pin that fits only alone: see budget.py
        self.scheduler.start(seq)
        if seq.kind is Kind.GENERATE:
            self.counters.query_tokens += len(seq.prompt)
            self.counters.hit_tokens += match.length
            if match.pin is not None:
                pinned = self.kv.cache.pins().get(match.pin)
                if pinned is not None:
                    seq.stats.pin = match.pin
                    self.kv.cache.record_pin_hit(match.pin, len(pinned.tokens))
        if seq.remaining_prefill == 0:  # a pin that is fully cached already
            self._complete_pin(seq)
        return True

    # -- run -------------------------------------------------------------------------

    def _prefill_chunk(self, seq: Sequence, n: int) -> None:
        start = seq.kv_len
        t0 = time.monotonic()
        logits = self.runner.prefill(seq.kv, seq.prompt[start : start + n], seq.shared, seq.window)
        seq.kv_len += n
        elapsed = time.monotonic() - t0
        self.counters.prefill_tokens += n
        self.counters.prefill_seconds += elapsed
        if seq.kind is Kind.PIN:
            self._pin_work.append((t0, t0 + elapsed))
        self._chunk_done(seq, logits)

    def _chunk_done(self, seq: Sequence, logits: torch.Tensor) -> None:
        """After a prefill chunk of ``seq``: the next one, or its first token."""
        if seq.cancelled:
            self._drop(seq, "cancelled")
            return
        if seq.remaining_prefill > 0:
            return
        if seq.kind is Kind.PIN:
            self._complete_pin(seq)
            return
        self.scheduler.prefilled(seq)
        self.output.hold_stops(logits[None], [seq])
        self.masker.apply(logits, [seq.constraint])
        self._next_token(seq, logits)
        if seq.has_followers and seq.state is State.DECODING:
            self.kv.store(seq)  # now, not at the end: requests wait for this prompt

    def _decode_step(self, rows: list[Sequence]) -> None:
        batch = self._batch_of(rows)
        t0 = time.monotonic()
        logits = batch.step([seq.generated[-1] for seq in rows])
        self.counters.decode_steps += 1
        self.counters.decode_seconds += time.monotonic() - t0
        self._decoded(rows, logits)

    def _mixed_step(self, rows: list[Sequence], seq: Sequence, n: int) -> None:
        """A decode step and ``seq``'s next prefill chunk in one forward (see
        ``MIX_MAX_TOKENS``); its time is split between the two by their token counts."""
        batch = self._batch_of(rows)
        start = seq.kv_len
        t0 = time.monotonic()
        logits, chunk_logits = batch.mixed_step(
            [row.generated[-1] for row in rows], seq, seq.prompt[start : start + n]
        )
        elapsed = time.monotonic() - t0
        seq.kv_len += n
        share = n / (n + len(rows))
        self.counters.decode_steps += 1
        self.counters.decode_seconds += elapsed * (1 - share)
        self.counters.prefill_tokens += n
        self.counters.prefill_seconds += elapsed * share
        self.counters.mixed_steps += 1
        if seq.kind is Kind.PIN:  # the pin's share of the step, as one stretch
            self._pin_work.append((t0, t0 + elapsed * share))
        self._decoded(rows, logits)
        self._chunk_done(seq, chunk_logits)

    def _pin_wait_ms(self, since: float, until: float) -> float:
        """How long pin prefill ran between ``since`` and ``until`` (monotonic times): what
        a request that arrived at ``since`` and got its first token at ``until`` waited
        behind pin work (``RequestStats.pin_wait_ms``)."""
        ran = sum(max(0.0, min(end, until) - max(start, since)) for start, end in self._pin_work)
        return ran * 1000

    def _batch_of(self, rows: list[Sequence]) -> DecodeBatch:
        batch = self.kv.batch
        if [id(s) for s in batch.rows] != [id(s) for s in rows]:
            batch.set_rows(rows)
        return batch

    def _decoded(self, rows: list[Sequence], logits: torch.Tensor) -> None:
        """After a decode step: each row's next token."""
        batch = self.kv.batch
        self.output.hold_stops(logits, rows)
        self.masker.apply(logits, [seq.constraint for seq in rows])
        for i, seq in enumerate(rows):
            if not seq.cancelled:
                self._next_token(seq, logits[i])
        if not self.scheduler.decoding:
            batch.set_rows([])

    # -- postprocess -----------------------------------------------------------------

    def _next_token(self, seq: Sequence, logits: torch.Tensor) -> None:
        """Sample ``seq``'s next token from its row ``logits`` ([V]) and accept it.

        A row that cannot be sampled or processed fails its own request only: a bad
        parameter of one automation must not end what a voice satellite is saying.
        """
        failure = seq.constraint.failure if seq.constraint is not None else ""
        if failure:
            self._fail_quietly(seq, failure)
            return
        try:
            token = seq.sampler(logits)
        except SamplingError as err:
            self._fail_quietly(seq, str(err), status=400)
            return
        except Exception as err:
            _LOGGER.exception("Sampling a request's token failed; failing that request")
            self._fail_quietly(seq, f"internal engine error: {type(err).__name__}")
            return
        if not seq.generated and self._pin_work:
            seq.stats.pin_wait_ms = self._pin_wait_ms(seq.arrival, time.monotonic())
        try:
            self._accept(seq, token)
        except Exception as err:
            _LOGGER.exception("Processing a request's token failed; failing that request")
            self._fail_quietly(seq, f"internal engine error: {type(err).__name__}")

    def _accept(self, seq: Sequence, token: int) -> None:
        reason = self.output.accept(seq, token)
        if reason is not None:
            self.kv.store(seq)
            self._release(seq)
            self.output.finish(seq, reason)

    def _complete_pin(self, seq: Sequence) -> None:
        """A pin sequence has all its KV: cache it, then pin and persist it."""
        computed = seq.kv_len > seq.cached
        prefill_ms = (time.monotonic() - seq.prefill_started) * 1000 if computed else 0.0
        self.kv.store(seq)
        self._release(seq)
        self.pins.complete(seq, computed, prefill_ms)

    def _start_pin(self, name: str, generation: int, tokens: list[int]) -> None:
        if self._closing:
            self.pins.fail(name, generation, "engine shutting down")
            return
        seq = self.pins.start(name, generation, tokens)
        if seq is not None:
            self.scheduler.enqueue(seq)

    # -- teardown --------------------------------------------------------------------

    def _release(self, seq: Sequence) -> None:
        """Leave the scheduler and give back locks and buffers (worker thread)."""
        seq.state = State.FINISHED
        self.scheduler.remove(seq)
        self.kv.release(seq)
        if not self.scheduler.decoding and self.kv.batch.rows:
            self.kv.batch.set_rows([])

    def _drop(self, seq: Sequence, reason: str) -> None:
        """Worker side of a cancellation: keep the prompt KV computed so far, then go."""
        if seq.state is State.FINISHED:
            return
        was_running = seq.state is not State.WAITING
        if was_running or seq.kind is Kind.GENERATE:
            # Counted before the release: a reader that sees the request gone sees this.
            self.counters.requests_cancelled += 1
        if seq.kind is Kind.GENERATE and seq.kv is not None and seq.kv_len > 0:
            self.kv.store(seq)
        self._release(seq)
        if seq.kind is Kind.PIN and seq.pin_name is not None:
            self.pins.fail(seq.pin_name, seq.pin_generation, reason)
        seq.emit(FinishEvent("cancelled", "", seq.stats))

    def _fail(self, seq: Sequence, message: str, status: int = 500) -> None:
        """End one sequence with an error, wherever it is (its KV is not kept). ``status``:
        400 when the request's own parameters made it fail, 503 when its KV can never fit,
        500 when the engine failed it."""
        if seq.state is State.FINISHED:
            return
        self.counters.requests_failed += 1
        try:
            self._release(seq)
        finally:
            seq.state = State.FINISHED
            if seq.kind is Kind.PIN and seq.pin_name is not None:
                self.pins.fail(seq.pin_name, seq.pin_generation, message)
            seq.emit(ErrorEvent(message, status))

    def _fail_running(self, message: str) -> None:
        for seq in [*self.scheduler.prefilling, *self.scheduler.decoding]:
            self._fail_quietly(seq, message)
        self.kv.batch.set_rows([])
        self.kv.pool.clear()

    def _fail_quietly(self, seq: Sequence, message: str, status: int = 500) -> None:
        try:
            self._fail(seq, message, status)
        except Exception:
            _LOGGER.exception("Failing a request failed")

    def _cancel_all(self) -> None:
        for seq in self.scheduler.all():
            seq.cancelled = True
            self._drop(seq, "engine shutting down")

    @staticmethod
    def _report(fail: Callable[[str], None], message: str) -> None:
        """Tell a command's owner it failed (a failure there is logged, not raised)."""
        try:
            fail(message)
        except Exception:
            _LOGGER.exception("Reporting a failed engine command failed")

    def _fail_everything(self, message: str) -> None:
        """The worker is going: nobody may wait for it (queued commands included)."""
        while True:
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                break
            if command.fail is not None:
                self._report(command.fail, message)
        for seq in self.scheduler.all():
            self._fail_quietly(seq, message)
        self.pins.fail_all(message)
