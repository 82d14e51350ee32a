"""The engine: an asyncio front over a worker thread that owns the model.

* The event loop never runs model code. ``stream()`` hands a ``Sequence`` to the worker
  and receives its events through an ``asyncio.Queue``.
* The worker loops: admit (prefix-cache lookup, lock; the cached KV is read in place,
  see ``attention``), one batched decode step, one prefill chunk (see ``scheduler``).
  After a request, its prompt and generated tokens go into the prefix cache, so the
  next turn of a chat hits.
* A request whose uncached prompt another running prefill is already computing waits
  for it (``_leader_for``) and then reads that KV from the cache.
* Pins are prefill-only sequences at low priority, or restores from the disk store.
  Re-pinning a name swaps atomically inside ``RadixCache.pin``.
* Cancelling (client gone, task cancelled) releases the request's cache locks at once
  from the caller's thread; the worker drops the sequence at its next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from .batch import DecodeBatch
from .cache import CacheFullError, Match, PinTooLargeError, RadixCache, common_prefix
from .config import CacheMode, EngineConfig, default_kv_budget
from .detok import TextStream
from .kv import BufferPool, kv_range, segment_nbytes, segment_tokens, split_segment
from .runner import ModelRunner
from .sampling import Sampler, SamplingParams
from .scheduler import QueueFullError, Scheduler
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
from .store import ManifestEntry, PrefixStore, prefix_key

_LOGGER = logging.getLogger(__name__)

# A cache hit reads at most this many segments (radix-tree nodes) in place; the KV of
# any further ones is copied into the working buffer (each part costs a few small
# operations per layer and step).
MAX_SHARED_SEGMENTS = 8

__all__ = [
    "CacheFullError",
    "ContextLengthError",
    "Engine",
    "EngineClosedError",
    "PinTooLargeError",
    "QueueFullError",
]


class EngineClosedError(RuntimeError):
    """The engine is shutting down and takes no new work."""


class ContextLengthError(ValueError):
    """Prompt plus ``max_tokens`` does not fit the model's context."""


class TensorOps:
    """``PayloadOps`` for KV segments ``[L, 2, H, T, D]``."""

    def nbytes(self, payload: torch.Tensor) -> int:
        return segment_nbytes(payload)

    def split(self, payload: torch.Tensor, at: int) -> tuple[torch.Tensor, torch.Tensor]:
        return split_segment(payload, at)


@dataclass
class PinStatus:
    name: str
    tokens: int
    hash: str
    state: str = "warming"  # warming | ready | failed
    prefill_ms: float = 0.0
    restored: bool = False
    error: str | None = None
    created_at: float = field(default_factory=time.time)
    ready_at: float | None = None
    generation: int = 0

    def as_dict(self, hits: int = 0, tokens_reused: int = 0) -> dict[str, Any]:
        return {
            "name": self.name,
            "tokens": self.tokens,
            "hash": self.hash,
            "state": self.state,
            "prefill_ms": round(self.prefill_ms, 3),
            "restored": self.restored,
            "error": self.error,
            "created_at": self.created_at,
            "ready_at": self.ready_at,
            "hits": hits,
            "tokens_reused": tokens_reused,
        }


@dataclass
class Counters:
    requests: int = 0
    requests_failed: int = 0
    requests_cancelled: int = 0
    query_tokens: int = 0
    hit_tokens: int = 0
    prompt_tokens: int = 0
    prefill_tokens: int = 0
    prefill_seconds: float = 0.0
    generated_tokens: int = 0
    decode_seconds: float = 0.0
    decode_steps: int = 0
    pin_rebuilds: int = 0
    pin_restores: int = 0
    pin_reuses: int = 0
    store_failures: int = 0


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
        self.cache: RadixCache[torch.Tensor] = RadixCache(budget, TensorOps())
        self.namespace = f"{self.info.namespace}:{config.cache_salt}"
        self.scheduler = Scheduler(config.max_running, config.chunk_tokens, config.max_queue)
        # Recycled working buffers: at most a quarter of the KV budget (1 GiB at most).
        self.pool = BufferPool(runner.layout, max_free_bytes=min(budget // 4, 1 << 30))
        self.batch = DecodeBatch(runner, self.pool)
        # Cache hits read their prefix in place instead of copying it (see attention.py)
        # when the model passed the self-test.
        self.share_prefix = (
            config.share_prefix and config.cache_mode is not CacheMode.NONE and runner.shares_prefix
        )
        self.store = PrefixStore(config.prefix_store) if config.prefix_store else None
        self.counters = Counters()
        self.stop_token_ids = self._stop_token_ids()
        self.finished_listeners: list[Callable[[RequestStats], None]] = []
        self._inbox: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._state_lock = threading.Lock()  # seq.lock_node / cancelled transitions
        self._pending = 0  # submitted, not yet admitted (guarded by _state_lock)
        self._pin_lock = threading.RLock()  # guards the three pin dicts below
        self._pins: dict[str, PinStatus] = {}  # active (ready) pins, or a failed first try
        self._pending_pins: dict[str, PinStatus] = {}  # latest attempt still warming
        self._restoring = False  # bringing pins back from the store at start-up
        self._pin_gen: dict[str, int] = {}
        self._pin_waiters: dict[tuple[str, int], list[Callable[[PinStatus], None]]] = {}
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hearth-store")
        self._closing = False
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hearth-engine", daemon=True)

    # ================================================================= lifecycle

    @classmethod
    def load(cls, config: EngineConfig) -> Engine:
        from .hardware import set_threads, tune_cpu_allocator

        tune_cpu_allocator()
        set_threads(config.threads)
        return cls(config, ModelRunner.load(config.model, config.device, config.dtype))

    def start(self) -> None:
        """Restore stored pins, then start the worker thread."""
        if self.store is not None and self.config.cache_mode is CacheMode.RADIX:
            self._restore_manifest()
        self._thread.start()

    async def shutdown(self, grace_s: float = 10.0) -> None:
        """Refuse new work, let running requests finish (up to ``grace_s``), flush the store."""
        self._closing = True
        deadline = time.monotonic() + grace_s
        while self.busy and time.monotonic() < deadline:  # noqa: ASYNC110 - state lives on a thread
            await asyncio.sleep(0.05)
        self._post(self._cancel_all)
        self._post(self._stopped.set)
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 30)
        self._io.shutdown(wait=True)

    def close(self) -> None:
        """Synchronous stop (tests, scripts)."""
        self._closing = True
        if self._thread.is_alive():
            self._post(self._cancel_all)
            self._post(self._stopped.set)
            self._thread.join(30)
        self._io.shutdown(wait=True)

    @property
    def busy(self) -> bool:
        return bool(self.scheduler.running or self.scheduler.waiting or self._pending)

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
        self, prompt: list[int], params: SamplingParams, *, salt: str | None = None
    ) -> AsyncIterator[Event]:
        """Generate from ``prompt``; yields events, the last one ``FinishEvent`` or ``ErrorEvent``.

        Leaving the iteration early (or cancelling the task) cancels the request.
        """
        if not prompt:
            raise ValueError("the prompt is empty")
        self.check_context(len(prompt), params.max_tokens)
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event] = asyncio.Queue()

        def emit(event: Event) -> None:
            with contextlib.suppress(RuntimeError):  # loop closed: nobody listens
                loop.call_soon_threadsafe(events.put_nowait, event)

        seq = Sequence(
            Kind.GENERATE,
            list(prompt),
            self.namespace_for(salt),
            params,
            emit,
        )
        seq.stream = TextStream(self.runner.tokenizer, params.stop)
        seq.sampler = Sampler(params)
        self._submit(seq)
        try:
            while True:
                event = await events.get()
                yield event
                if isinstance(event, FinishEvent | ErrorEvent):
                    return
        finally:
            if seq.state is not State.FINISHED:
                self.cancel(seq)

    async def generate(
        self, prompt: list[int], params: SamplingParams, *, salt: str | None = None
    ) -> tuple[str, list[int], FinishEvent]:
        """Non-streaming convenience: the whole text, the token ids and the finish event."""
        parts: list[str] = []
        ids: list[int] = []
        async for event in self.stream(prompt, params, salt=salt):
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
        """Cancel from any thread: the cache locks are released now."""
        with self._state_lock:
            if seq.cancelled or seq.state is State.FINISHED:
                return
            seq.cancelled = True
            self._unlock(seq)
        self._post(lambda: self._drop(seq, "cancelled"))

    async def pin(self, name: str, tokens: list[int], *, wait: bool = True) -> PinStatus:
        """Pin ``tokens`` as ``name`` (replacing an older pin of that name once ready)."""
        if self._closing:
            raise EngineClosedError("the engine is shutting down")
        if not tokens:
            raise ValueError("a pin needs at least one token")
        self.check_context(len(tokens), 1)
        ns = self.namespace
        if self.config.cache_mode is CacheMode.RADIX:
            bpt = self.info.bytes_per_token
            if len(tokens) * bpt > self.cache.capacity_bytes:
                raise PinTooLargeError(
                    f"the prefix is {len(tokens)} tokens ({len(tokens) * bpt} bytes of KV) but the "
                    f"KV cache budget is {self.cache.capacity_bytes} bytes; raise --kv-cache-mb"
                )
            new_tokens = len(tokens) - self.cache.match(ns, tokens).length
            self.cache.check_fits(new_tokens * bpt)
        with self._pin_lock:
            generation = self._pin_gen.get(name, 0) + 1
            self._pin_gen[name] = generation
            status = PinStatus(
                name, len(tokens), prefix_key(ns, tokens)[:16], generation=generation
            )
            self._pending_pins[name] = status
        loop = asyncio.get_running_loop()
        done: asyncio.Future[PinStatus] = loop.create_future()

        def resolve(result: PinStatus) -> None:
            def _set() -> None:
                if not done.done():
                    done.set_result(result)

            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_set)

        self._pin_waiters.setdefault((name, generation), []).append(resolve)
        self._post(lambda: self._start_pin(name, generation, list(tokens)))
        if not wait:
            return status
        return await done

    def unpin(self, name: str) -> bool:
        """Remove a pin; its KV stays cached (unpinned) until evicted. False if unknown."""
        with self._pin_lock:
            known = name in self._pins or name in self._pending_pins
            self._pin_gen[name] = self._pin_gen.get(name, 0) + 1
            self._pins.pop(name, None)
            self._pending_pins.pop(name, None)
            with contextlib.suppress(KeyError):
                self.cache.unpin(name)
        self._save_manifest()
        return known

    def pin_status(self, name: str) -> dict[str, Any] | None:
        """The latest attempt for ``name`` (warming, ready or failed), with hit counters.

        While a re-pin warms up, ``active`` describes the pin that requests still hit.
        """
        with self._pin_lock:
            pending = self._pending_pins.get(name)
            active = self._pins.get(name)
        status = pending or active
        if status is None:
            return None
        record = self.cache.pins().get(name)
        hits, reused = (record.hits, record.tokens_reused) if record else (0, 0)
        out = status.as_dict(hits, reused)
        if pending is not None and active is not None:
            out["active"] = active.as_dict(hits, reused)
        return out

    def pin_names(self) -> list[str]:
        with self._pin_lock:
            return sorted(set(self._pins) | set(self._pending_pins))

    def clear_cache(self) -> int:
        """Drop every cached prefix that is neither pinned nor in use; returns bytes freed."""
        return self.cache.clear()

    def stats(self) -> dict[str, Any]:
        c = self.counters
        cache = self.cache.stats()
        return {
            "instance_id": self.instance_id,
            "uptime_s": round(time.time() - self.started_at, 3),
            "model": self.info.name,
            "device": self.info.device,
            "dtype": self.info.dtype,
            "cache_mode": self.config.cache_mode.value,
            "requests_total": c.requests,
            "requests_failed": c.requests_failed,
            "requests_cancelled": c.requests_cancelled,
            "requests_running": self.scheduler.running,
            "requests_waiting": len(self.scheduler.waiting) + self._pending,
            "prefix_cache_queries_tokens": c.query_tokens,
            "prefix_cache_hits_tokens": c.hit_tokens,
            "prefix_cache_hit_rate": round(c.hit_tokens / c.query_tokens, 6)
            if c.query_tokens
            else 0.0,
            "prompt_tokens_total": c.prompt_tokens,
            "prefill_tokens_total": c.prefill_tokens,
            "prefill_seconds_total": round(c.prefill_seconds, 6),
            "prefill_tokens_per_s": round(c.prefill_tokens / c.prefill_seconds, 2)
            if c.prefill_seconds
            else 0.0,
            "generation_tokens_total": c.generated_tokens,
            "decode_seconds_total": round(c.decode_seconds, 6),
            "decode_steps_total": c.decode_steps,
            "decode_tokens_per_s": round(c.generated_tokens / c.decode_seconds, 2)
            if c.decode_seconds
            else 0.0,
            "kv_cache_capacity_bytes": cache.capacity_bytes,
            "kv_cache_used_bytes": cache.used_bytes,
            "kv_cache_usage": round(cache.used_bytes / cache.capacity_bytes, 6)
            if cache.capacity_bytes
            else 0.0,
            "kv_cache_pinned_bytes": cache.pinned_bytes,
            "kv_cache_locked_bytes": cache.locked_bytes,
            "kv_cache_nodes": cache.nodes,
            "kv_cache_locked_nodes": cache.locked_nodes,
            "kv_cache_evictions_total": cache.evictions,
            "kv_cache_evicted_bytes_total": cache.evicted_bytes,
            "kv_working_bytes": self._working_bytes(),
            "kv_pool_free_bytes": self.pool.free_bytes,
            "kv_bytes_per_token": self.info.bytes_per_token,
            "pinned_prefix_tokens": cache.pinned_tokens,
            "pins": cache.pins,
            "pin_rebuilds_total": c.pin_rebuilds,
            "pin_restores_total": c.pin_restores,
            "pin_reuses_total": c.pin_reuses,
            "store_failures_total": c.store_failures,
        }

    # ================================================================= worker side

    def _post(self, command: Callable[[], None]) -> None:
        self._inbox.put(command)
        self._wake.set()

    def _submit(self, seq: Sequence) -> None:
        if self._closing:
            raise EngineClosedError("the engine is shutting down")
        with self._state_lock:
            if self._pending + len(self.scheduler.waiting) >= self.config.max_queue:
                raise QueueFullError(
                    f"{self._pending + len(self.scheduler.waiting)} requests are already waiting"
                )
            self._pending += 1
        self._post(lambda: self._enqueue(seq))

    def _enqueue(self, seq: Sequence) -> None:
        with self._state_lock:
            self._pending -= 1
        if seq.cancelled:
            return
        self.scheduler.waiting.append(seq)

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._drain_inbox()
            if self._stopped.is_set():
                break
            plan = self.scheduler.plan()
            if plan.empty:
                self._wake.wait(timeout=0.5)
                self._wake.clear()
                continue
            try:
                deferred = [seq for seq in plan.admit if not self._admit(seq)]
                self.scheduler.waiting.extendleft(reversed(deferred))
                if plan.decode:
                    self._decode_step()
                if plan.prefill is not None and plan.prefill.state is State.PREFILLING:
                    self._prefill_chunk(plan.prefill, plan.chunk)
            except Exception as err:
                _LOGGER.exception("Engine step failed; failing the running requests")
                self._fail_running(f"internal engine error: {type(err).__name__}")

    def _drain_inbox(self) -> None:
        while True:
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                return
            command()

    # -- admission ----------------------------------------------------------------

    def _match(self, seq: Sequence) -> Match[torch.Tensor]:
        mode = self.config.cache_mode
        if mode is CacheMode.NONE:
            return Match(seq.namespace, 0, [], None)
        limit = len(seq.prompt) - (1 if seq.kind is Kind.GENERATE else 0)
        return self.cache.match(seq.namespace, seq.prompt, limit)

    def _leader_for(self, seq: Sequence, match: Match[torch.Tensor]) -> Sequence | None:
        """A running prefill that is computing at least a chunk of ``seq``'s uncached prompt.

        ``seq`` then waits for it instead of computing the same tokens twice: a burst of
        requests over one uncached prefix (right after a start, before the pin is ready)
        costs one prefill, not one each.
        """
        if self.config.cache_mode is not CacheMode.RADIX:
            return None
        limit = len(seq.prompt) - (1 if seq.kind is Kind.GENERATE else 0)
        for other in self.scheduler.prefilling:
            if other.namespace != seq.namespace or other.cancelled:
                continue
            shared = common_prefix(seq.prompt[:limit], other.prompt)
            if shared - match.length >= self.config.chunk_tokens:
                return other
        return None

    def _admit(self, seq: Sequence) -> bool:
        """Start ``seq`` (False: it waits for a leader's prefill; put it back in line)."""
        if seq.cancelled:
            return True
        match = self._match(seq)
        leader = self._leader_for(seq, match)
        if leader is not None:
            leader.has_followers = True
            return False
        with self._state_lock:
            if seq.cancelled:
                return True
            self.cache.lock(match.node)
            seq.lock_node = match.node
        seq.cached = match.length
        seq.prefill_started = time.monotonic()
        seq.stats.queue_ms = (seq.prefill_started - seq.arrival) * 1000
        seq.stats.prompt_tokens = len(seq.prompt)
        seq.stats.cached_tokens = match.length
        if seq.kind is Kind.GENERATE:
            self.counters.query_tokens += len(seq.prompt)
            self.counters.hit_tokens += match.length
            if match.pin is not None:
                pinned = self.cache.pins().get(match.pin)
                if pinned is not None:
                    seq.stats.pin = match.pin
                    self.cache.record_pin_hit(match.pin, len(pinned.tokens))
        reserve = 0 if seq.kind is Kind.PIN else min(seq.params.max_tokens, 256)
        segments = [payload[:, :, :, :used] for payload, used in match.segments]
        shared = segments[:MAX_SHARED_SEGMENTS] if self.share_prefix else []
        shared_len = sum(segment_tokens(s) for s in shared)
        capacity = len(seq.prompt) - shared_len + reserve + 1
        self._make_working_room(capacity * self.info.bytes_per_token)
        buffer = self.pool.buffer(rows=1, capacity=capacity)
        column = 0
        for segment in segments[len(shared) :]:
            buffer.write_segment(0, column, segment)
            column += segment_tokens(segment)
        buffer.set_length(column)
        seq.shared, seq.shared_len = tuple(shared), shared_len
        seq.kv, seq.kv_row, seq.kv_offset, seq.kv_len = buffer, 0, 0, shared_len + column
        self.scheduler.started(seq)
        if seq.remaining_prefill == 0:  # a pin that is fully cached already
            self._complete_pin(seq)
        return True

    # -- prefill --------------------------------------------------------------------

    def _prefill_chunk(self, seq: Sequence, n: int) -> None:
        start = seq.kv_len
        t0 = time.monotonic()
        logits = self.runner.prefill(seq.kv, seq.prompt[start : start + n], seq.shared)
        seq.kv_len += n
        self.counters.prefill_tokens += n
        self.counters.prefill_seconds += time.monotonic() - t0
        if seq.cancelled:
            self._drop(seq, "cancelled")
            return
        if seq.remaining_prefill > 0:
            return
        if seq.kind is Kind.PIN:
            self._complete_pin(seq)
            return
        self.scheduler.prefilled(seq)
        self._accept(seq, seq.sampler(logits))
        if seq.has_followers and seq.state is State.DECODING:
            self._store_kv(seq)  # now, not at the end: requests wait for this prompt

    # -- decode ---------------------------------------------------------------------

    def _decode_step(self) -> None:
        rows = list(self.scheduler.decoding)
        if [id(s) for s in self.batch.rows] != [id(s) for s in rows]:
            self.batch.set_rows(rows)
        t0 = time.monotonic()
        logits = self.batch.step([seq.generated[-1] for seq in rows])
        self.counters.decode_steps += 1
        self.counters.decode_seconds += time.monotonic() - t0
        for i, seq in enumerate(rows):
            if not seq.cancelled:
                self._accept(seq, seq.sampler(logits[i]))
        if not self.scheduler.decoding:
            self.batch.set_rows([])

    def _accept(self, seq: Sequence, token: int) -> None:
        """Record a sampled token: emit its text, or finish the sequence."""
        now = time.monotonic()
        seq.generated.append(token)
        self.counters.generated_tokens += 1
        if len(seq.generated) == 1:
            seq.first_token_at = now
            seq.stats.ttft_ms = (now - seq.arrival) * 1000
            seq.stats.prefill_ms = (now - seq.prefill_started) * 1000
        if token in self.stop_token_ids or token in seq.params.stop_token_ids:
            self._finish(seq, "stop")
            return
        text = seq.stream.push(token)
        if text or len(seq.generated) == 1:
            seq.emit(TokenEvent(token, text))
        if seq.stream.stopped:
            self._finish(seq, "stop")
        elif (
            len(seq.generated) >= seq.params.max_tokens or seq.total_len >= self.info.context_length
        ):
            self._finish(seq, "length")

    def _finish(self, seq: Sequence, reason: str) -> None:
        now = time.monotonic()
        seq.stats.completion_tokens = len(seq.generated)
        seq.stats.decode_ms = (now - seq.first_token_at) * 1000 if seq.first_token_at else 0.0
        self._store_kv(seq)
        self._release(seq)
        self.counters.requests += 1
        self.counters.prompt_tokens += len(seq.prompt)
        tail = seq.stream.finish() if seq.stream is not None else ""
        # Listeners (the stats window) first: a client that reads /v1/stats right after
        # its response must find its request there (it raced under load).
        for listener in self.finished_listeners:
            listener(seq.stats)
        seq.emit(FinishEvent(reason, tail, seq.stats))

    def _store_kv(self, seq: Sequence) -> None:
        """Insert the sequence's prompt (and generated) KV into the prefix cache."""
        mode = self.config.cache_mode
        if mode is CacheMode.NONE or seq.kv is None or seq.kv_len == 0:
            return
        if mode is CacheMode.LAST_PROMPT:
            self.cache.clear()
        tokens = seq.tokens_with_kv()
        shared, buffer, row, offset = seq.shared, seq.kv, seq.kv_row, seq.kv_offset
        bpt = self.info.bytes_per_token
        self.cache.insert(
            seq.namespace,
            tokens,
            lambda a, b: kv_range(shared, buffer, row, offset, a, b),
            lambda a, b: (b - a) * bpt,
        )

    def _unlock(self, seq: Sequence) -> None:
        """Release the sequence's cache locks (caller holds ``_state_lock``)."""
        if seq.lock_node is not None:
            self.cache.unlock(seq.lock_node)
            seq.lock_node = None

    def _release(self, seq: Sequence) -> None:
        """Leave the scheduler and give back locks and buffers (worker thread)."""
        with self._state_lock:
            self._unlock(seq)
            seq.state = State.FINISHED
        self.scheduler.remove(seq)
        if seq.kv is not None and seq.kv is not self.batch.buffer:
            self.pool.release(seq.kv)
        seq.kv, seq.shared = None, ()

    def _drop(self, seq: Sequence, reason: str) -> None:
        """Worker side of a cancellation."""
        if seq.state is State.FINISHED:
            return
        was_running = seq.state is not State.WAITING
        if seq.kind is Kind.GENERATE and seq.kv is not None and seq.kv_len > 0:
            self._store_kv(seq)  # the prompt KV computed so far is still good
        self._release(seq)
        if was_running or seq.kind is Kind.GENERATE:
            self.counters.requests_cancelled += 1
        if seq.kind is Kind.PIN and seq.pin_name is not None:
            self._resolve_pin(seq.pin_name, seq.pin_generation, state="failed", error=reason)
        seq.emit(FinishEvent("cancelled", "", seq.stats))
        if not self.scheduler.decoding and self.batch.rows:
            self.batch.set_rows([])

    def _cancel_all(self) -> None:
        for seq in [*self.scheduler.waiting, *self.scheduler.prefilling, *self.scheduler.decoding]:
            with self._state_lock:
                seq.cancelled = True
                self._unlock(seq)
            self._drop(seq, "engine shutting down")

    def _fail_running(self, message: str) -> None:
        for seq in [*self.scheduler.prefilling, *self.scheduler.decoding]:
            self.counters.requests_failed += 1
            with self._state_lock:
                self._unlock(seq)
                seq.state = State.FINISHED
            self.scheduler.remove(seq)
            if seq.kind is Kind.PIN and seq.pin_name is not None:
                self._resolve_pin(seq.pin_name, seq.pin_generation, state="failed", error=message)
            seq.emit(ErrorEvent(message))
        self.batch.set_rows([])
        self.pool.clear()

    def _make_working_room(self, nbytes: int) -> None:
        """Keep cache + working buffers + pooled buffers within the KV budget.

        Pooled buffers go first, then least recently used unpinned cache entries. What
        is pinned or in use cannot go: then the budget is exceeded by the working
        buffers of the running requests (``kv_working_bytes`` shows it).
        """

        def over() -> int:
            used = self.cache.used_bytes + self._working_bytes() + self.pool.free_bytes
            return used + nbytes - self.cache.capacity_bytes

        if over() > 0 and self.pool.free_bytes:
            self.pool.clear()
        if (excess := over()) > 0:
            self.cache.evict(excess)

    def _working_bytes(self) -> int:
        return self.batch.nbytes + sum(
            s.kv.nbytes
            for s in list(self.scheduler.prefilling)
            if s.kv is not None and s.kv is not self.batch.buffer
        )

    def _stop_token_ids(self) -> frozenset[int]:
        tokenizer = self.runner.tokenizer
        ids: set[int] = set()
        eos = getattr(self.runner.model.generation_config, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, list | tuple):
            ids.update(int(e) for e in eos)
        if tokenizer.eos_token_id is not None:
            ids.add(int(tokenizer.eos_token_id))
        vocab = tokenizer.get_vocab()
        for token in self.config.extra_stop_tokens:
            if token in vocab:
                ids.add(int(vocab[token]))
        return frozenset(ids)

    # ================================================================= pins (worker side)

    def _start_pin(self, name: str, generation: int, tokens: list[int]) -> None:
        if self._closing:
            self._resolve_pin(name, generation, state="failed", error="engine shutting down")
            return
        if self._pin_gen.get(name) != generation:
            self._resolve_pin(name, generation, state="failed", error="superseded")
            return
        mode = self.config.cache_mode
        if mode is CacheMode.NONE:
            self._resolve_pin(name, generation, state="ready")
            return
        ns = self.namespace
        if (
            mode is CacheMode.RADIX
            and self.store is not None
            and not self.cache.contains(ns, tokens)
        ):
            t0 = time.monotonic()
            kv = self.store.load(ns, tokens)
            if kv is not None and self._insert_segment(ns, tokens, kv):
                self.counters.pin_restores += 1
                self._activate_pin(
                    name, generation, tokens, (time.monotonic() - t0) * 1000, restored=True
                )
                return
        seq = Sequence(Kind.PIN, tokens, ns, pin_name=name)
        seq.pin_generation = generation
        self.scheduler.waiting.append(seq)

    def _insert_segment(self, ns: str, tokens: list[int], kv: torch.Tensor) -> bool:
        kv = kv.to(device=self.runner.layout.device, dtype=self.runner.layout.dtype)
        bpt = self.info.bytes_per_token
        total = len(tokens)

        def payload(a: int, b: int) -> torch.Tensor:
            return kv if (a, b) == (0, total) else kv[:, :, :, a:b].clone()

        return self.cache.insert(ns, tokens, payload, lambda a, b: (b - a) * bpt) == total

    def _complete_pin(self, seq: Sequence) -> None:
        """A pin sequence has all its KV: cache it, pin it, persist it."""
        name, generation = seq.pin_name, seq.pin_generation
        assert name is not None
        computed = seq.kv_len > seq.cached
        prefill_ms = (time.monotonic() - seq.prefill_started) * 1000 if computed else 0.0
        full_kv = None
        if self.store is not None and self.config.cache_mode is CacheMode.RADIX:
            full_kv = kv_range(seq.shared, seq.kv, seq.kv_row, seq.kv_offset, 0, seq.kv_len)
        self._store_kv(seq)
        self._release(seq)
        if self.config.cache_mode is CacheMode.LAST_PROMPT:
            self._resolve_pin(name, generation, state="ready", prefill_ms=prefill_ms)
            return
        if computed:
            self.counters.pin_rebuilds += 1
        else:
            self.counters.pin_reuses += 1
        if not self.cache.contains(seq.namespace, seq.prompt):
            self._resolve_pin(
                name,
                generation,
                state="failed",
                error="the KV cache budget is in use by other pins",
            )
            return
        self._activate_pin(name, generation, seq.prompt, prefill_ms, restored=False, kv=full_kv)

    def _activate_pin(
        self,
        name: str,
        generation: int,
        tokens: list[int],
        prefill_ms: float,
        *,
        restored: bool,
        kv: torch.Tensor | None = None,
    ) -> None:
        with self._pin_lock:
            if self._pin_gen.get(name) != generation:
                self._resolve_pin(name, generation, state="failed", error="superseded")
                return
            self.cache.pin(name, self.namespace, tokens)
        if self.store is not None and kv is not None:
            store = self.store
            ns = self.namespace

            def save() -> None:
                if not store.save(ns, tokens, kv):
                    self.counters.store_failures += 1

            self._submit_io(save)
        self._resolve_pin(name, generation, state="ready", prefill_ms=prefill_ms, restored=restored)
        self._save_manifest()

    def _resolve_pin(
        self,
        name: str,
        generation: int,
        *,
        state: str,
        prefill_ms: float = 0.0,
        restored: bool = False,
        error: str | None = None,
    ) -> None:
        with self._pin_lock:
            status = self._pending_pins.get(name)
            if status is not None and status.generation == generation:
                status.state = state
                status.prefill_ms = prefill_ms
                status.restored = restored
                status.error = error
                status.ready_at = time.time()
                del self._pending_pins[name]
                if state == "ready" or name not in self._pins:
                    self._pins[name] = status
                result = status
            else:
                result = PinStatus(name, 0, "", state="failed", error=error or "superseded")
        for waiter in self._pin_waiters.pop((name, generation), []):
            waiter(result)

    def _submit_io(self, task: Callable[[], None]) -> None:
        """Run store I/O off the worker thread; a failure is logged, never lost."""

        def done(future: Future[None]) -> None:
            error = future.exception()
            if error is not None:
                _LOGGER.error("Prefix store task failed: %s", error, exc_info=error)

        try:
            self._io.submit(task).add_done_callback(done)
        except RuntimeError:  # executor shut down: the engine is stopping
            _LOGGER.debug("store task dropped at shutdown")

    def _save_manifest(self) -> None:
        if self.store is None or self.config.cache_mode is not CacheMode.RADIX:
            return
        if self._restoring:
            # Mid-restore the cache holds only the pins restored so far: writing now
            # would prune the store files of the pins still to come.
            return
        records = self.cache.pins()
        entries = [
            ManifestEntry(name, prefix_key(r.namespace, r.tokens), len(r.tokens))
            for name, r in sorted(records.items())
        ]
        store, ns = self.store, self.namespace

        def write() -> None:
            store.write_manifest(ns, entries)
            store.prune({e.key for e in entries})

        self._submit_io(write)

    def _restore_manifest(self) -> None:
        """At start-up, bring back the pins of the previous run from the store."""
        assert self.store is not None
        self._restoring = True
        try:
            for entry in self.store.read_manifest(self.namespace):
                self._restore_entry(entry)
        finally:
            self._restoring = False
        self._save_manifest()

    def _restore_entry(self, entry: ManifestEntry) -> None:
        """Bring one pin back from the store (skipped with a warning if it cannot be)."""
        assert self.store is not None
        t0 = time.monotonic()
        loaded = self.store.load_by_key(self.namespace, entry.key)
        if loaded is None:
            return
        tokens, kv = loaded
        try:
            self.cache.check_fits(len(tokens) * self.info.bytes_per_token)
        except CacheFullError as err:
            _LOGGER.warning("Not restoring pin %s: %s", entry.name, err)
            return
        if not self._insert_segment(self.namespace, tokens, kv):
            return
        generation = self._pin_gen.get(entry.name, 0) + 1
        self._pin_gen[entry.name] = generation
        status = PinStatus(entry.name, len(tokens), entry.key[:16], generation=generation)
        self._pending_pins[entry.name] = status
        self.counters.pin_restores += 1
        self._activate_pin(
            entry.name, generation, tokens, (time.monotonic() - t0) * 1000, restored=True
        )
        _LOGGER.info("Restored pin %s (%d tokens) from the prefix store", entry.name, len(tokens))
