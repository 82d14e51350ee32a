"""The engine's worker thread: the step loop and everything it does to requests.

``Engine`` (engine.py) is the thread-safe front: it takes requests and pins on the event
loop and posts them here through the inbox. ``WorkerLoop`` is the half that runs only on
the worker thread (``_loop``): drain the inbox, then one **step**, and fail whoever waits
when a request, a row or the whole loop breaks. A step is three calls:

* **schedule** (``_schedule``): admit the waiting requests that fit, and plan the step
  (``Scheduler.plan``): which rows decode, which sequence prefills a chunk, and whether
  the two run mixed (one forward) or split (a forward each);
* **run** (``_run``): one forward of the plan, with its counters;
* **postprocess** (``_postprocess``): sampled tokens to their requests, finished ones
  into the cache, a prefilled prompt's first token.

A split plan runs and postprocesses its decode step before its chunk (``Plan.passes``).

The seam: ``WorkerLoop.__init__`` makes everything the worker owns (the scheduler, the
KV, pins and output, the inbox); ``Engine`` is its subclass and adds the front's state
(pending counts, the thread), so the two halves share one object as they share one
model, and each half's ``__init__`` makes its own.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..cache.radix import Match, common_prefix
from ..config import CacheMode, EngineConfig
from ..constraints.mask import Masker
from ..model.hardware import release_free_memory
from ..model.runner import ModelRunner
from .batch import DecodeBatch
from .kv_manager import KVManager
from .output import Counters, OutputProcessor
from .pins import PinManager
from .sampling import SamplingError
from .scheduler import Plan, Scheduler, StepKind, extends
from .sequence import (
    ErrorEvent,
    FinishEvent,
    Kind,
    Sequence,
    State,
)

_LOGGER = logging.getLogger(__name__)

# After this long without work the worker gives back what it kept for reuse (pooled
# buffers, the allocator's free memory): a burst of requests keeps it, a house that is
# quiet between voice commands does not hold its last peak (measured after 8 clients
# for 60 s: 1,723 MiB idle against 1,299 before the load). The next request faults in
# only its own buffers (a warm turn's: a few MiB).
IDLE_RELEASE_S = 30.0
# Pin prefill stretches remembered to tell requests how long they waited behind pins:
# a request waits at most ``max_queue`` steps' worth of chunks in practice.
PIN_WORK_KEPT = 256


@dataclass(frozen=True)
class Command:
    """Work for the worker thread; ``fail`` tells the command's owner when it raised."""

    run: Callable[[], None]
    fail: Callable[[str], None] | None = None


@dataclass(frozen=True)
class Outputs:
    """One forward's logits: the decode rows' ``[B, V]`` and the chunk's last ``[V]``
    (``None`` where the forward ran none)."""

    decode: torch.Tensor | None = None
    chunk: torch.Tensor | None = None


class WorkerLoop:
    """The worker thread's half of ``Engine`` (see the module docstring)."""

    def __init__(
        self, config: EngineConfig, runner: ModelRunner, budget: int, namespace: str
    ) -> None:
        """The worker's state, for ``runner`` with a KV budget of ``budget`` bytes and
        cache namespace ``namespace``."""
        self.config = config
        self.runner = runner
        self.namespace = namespace
        self.counters = Counters()
        self.scheduler = Scheduler(
            config.max_running,
            config.chunk_tokens,
            config.max_queue,
            can_mix=lambda: runner.can_mix,
        )
        self.kv = KVManager(config, runner, budget, lambda: self.scheduler.prefilling)
        self.output = OutputProcessor(config, runner, self.counters)
        self.masker = Masker(runner.info.vocab_size)  # grammar masks of constrained requests
        self.pins = PinManager(config, namespace, self.kv, self.counters, self._has_requests)
        if self.pins.store is not None:  # sliding layers store their last window only
            layout = runner.layout
            trimmed = layout.sliding if layout.trims_windows else ()
            self.pins.store.keep_windows(layout.layers, trimmed, layout.window)
            self.pins.store.keep_states(len(layout.state_layers))
        self._inbox: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._wake = threading.Event()
        # The latest stretches of pin prefill (monotonic start, end): worker thread only.
        self._pin_work: deque[tuple[float, float]] = deque(maxlen=PIN_WORK_KEPT)
        self._closing = False  # the front takes no new work (set by ``Engine``)
        self._stopped = threading.Event()
        self.failure: str | None = None  # why the worker stopped, if it died
        self._last_work = 0.0  # monotonic time of the last step that did work
        self._released = True  # nothing ran since the last idle release

    def _has_requests(self) -> bool:
        """Whether requests wait or run (read from the store's thread: a passing answer
        is enough there)."""
        return bool(self.scheduler.running or self.scheduler.waiting)

    def _loop(self) -> None:
        try:
            while not self._stopped.is_set():
                self._drain_inbox()
                self.kv.publish_usage()  # after each step and command: what stats read
                if self._stopped.is_set():
                    break
                if self.step():
                    self._last_work, self._released = time.monotonic(), False
                else:
                    self._release_when_idle()
                    self._wake.wait(timeout=0.5)
                    self._wake.clear()
        except BaseException as err:
            # A bug in the loop itself: say so loudly, and fail everyone (never hang).
            _LOGGER.critical("The engine worker stopped", exc_info=err)
            self.failure = f"internal engine error: {type(err).__name__}"
        finally:
            self._fail_everything(self.failure or "the engine is shutting down")

    def _release_when_idle(self) -> None:
        """Once ``IDLE_RELEASE_S`` passed without work: drop pooled buffers, trim."""
        if self._released or time.monotonic() - self._last_work < IDLE_RELEASE_S:
            return
        self._released = True
        if self.scheduler.running or self.scheduler.waiting:
            return
        self.kv.pool.drop_free()
        release_free_memory()
        self.kv.publish_usage()

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
        plan = self._schedule()
        if plan.empty:
            return False
        try:
            for part in plan.passes():  # mixed: one forward; split: decode, then the chunk
                outputs = self._run(part)
                self._postprocess(part, outputs)
        except Exception as err:
            _LOGGER.exception("Engine step failed; failing the running requests")
            self._fail_running(f"internal engine error: {type(err).__name__}")
        return True

    # -- schedule --------------------------------------------------------------------

    def _schedule(self) -> Plan:
        """Admit the waiting requests that fit, then plan the step (mixed or split)."""
        self._admit_waiting()
        return self.scheduler.plan()

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

    def _run(self, plan: Plan) -> Outputs:
        """One forward of a step (a pass of ``Plan.passes``), with its counters."""
        if plan.kind is StepKind.MIXED:
            assert plan.prefill is not None
            return self._mixed_forward(plan.decode, plan.prefill, plan.chunk)
        if plan.decode:
            return Outputs(decode=self._decode_forward(plan.decode))
        assert plan.prefill is not None
        return Outputs(chunk=self._prefill_forward(plan.prefill, plan.chunk))

    def _prefill_forward(self, seq: Sequence, n: int) -> torch.Tensor:
        """``seq``'s next ``n`` prompt tokens; the last one's logits ``[V]``."""
        start = seq.kv_len
        t0 = time.monotonic()
        logits = self.runner.prefill(seq.kv, seq.prompt[start : start + n], seq.shared, seq.window)
        seq.kv_len += n
        elapsed = time.monotonic() - t0
        self.counters.prefill_tokens += n
        self.counters.prefill_seconds += elapsed
        if seq.kind is Kind.PIN:
            self._pin_work.append((t0, t0 + elapsed))
        return logits

    def _decode_forward(self, rows: list[Sequence]) -> torch.Tensor:
        """One decode step of ``rows`` (a lone row with forced tokens: up to a chunk of
        them); the rows' logits ``[B, V]``."""
        batch = self._batch_of(rows)
        t0 = time.monotonic()
        if extends(rows):  # a lone row with forced tokens: up to a chunk in one forward
            logits = batch.extend(rows[0].unfed[: self.config.chunk_tokens])
            self.counters.extend_steps += 1
        else:  # one token a row (a row's forced tokens then take a step each)
            logits = batch.step([seq.unfed[0] for seq in rows])
        self.counters.decode_steps += 1
        self.counters.decode_seconds += time.monotonic() - t0
        return logits

    def _mixed_forward(self, rows: list[Sequence], seq: Sequence, n: int) -> Outputs:
        """A decode step and ``seq``'s next prefill chunk in one forward (see
        ``scheduler.MIX_MAX_TOKENS``); its time is split between the two by their token
        counts."""
        batch = self._batch_of(rows)
        start = seq.kv_len
        t0 = time.monotonic()
        logits, chunk_logits = batch.mixed_step(
            [row.unfed[0] for row in rows], seq, seq.prompt[start : start + n]
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
        return Outputs(decode=logits, chunk=chunk_logits)

    def _batch_of(self, rows: list[Sequence]) -> DecodeBatch:
        batch = self.kv.batch
        if [id(s) for s in batch.rows] != [id(s) for s in rows]:
            batch.set_rows(rows)
        return batch

    # -- postprocess -----------------------------------------------------------------

    def _postprocess(self, plan: Plan, outputs: Outputs) -> None:
        """After a forward: the decode rows' next tokens, then the chunk's sequence's."""
        if outputs.decode is not None:
            self._decoded(plan.decode, outputs.decode)
        if outputs.chunk is not None:
            assert plan.prefill is not None
            self._chunk_done(plan.prefill, outputs.chunk)

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

    def _pin_wait_ms(self, since: float, until: float) -> float:
        """How long pin prefill ran between ``since`` and ``until`` (monotonic times): what
        a request that arrived at ``since`` and got its first token at ``until`` waited
        behind pin work (``RequestStats.pin_wait_ms``)."""
        ran = sum(max(0.0, min(end, until) - max(start, since)) for start, end in self._pin_work)
        return ran * 1000

    def _decoded(self, rows: list[Sequence], logits: torch.Tensor) -> None:
        """After a decode step: the next token of each row that has fed all its tokens
        (a row still holding forced tokens feeds the next one instead)."""
        batch = self.kv.batch
        ready = [not seq.unfed for seq in rows]
        self.output.hold_stops(logits, rows)
        constraints = [s.constraint if r else None for s, r in zip(rows, ready, strict=True)]
        self.masker.apply(logits, constraints)
        for i, seq in enumerate(rows):
            if seq.cancelled:  # now: with no token sampled it has nothing to feed next
                self._drop(seq, "cancelled")
            elif ready[i]:
                self._next_token(seq, logits[i])
        if not self.scheduler.decoding:
            batch.set_rows([])

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
        prefilled = max(0, seq.kv_len - seq.cached)
        self.kv.store(seq)
        self._release(seq)
        self.pins.complete(seq, computed, prefill_ms, prefilled)
        if computed:  # its prefill's buffer and scratch: a one-off, not a request's size
            release_free_memory()

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
