"""Scheduling policy: which sequences run next. No torch, no threads; the engine drives it.

The scheduler owns the three queues (``waiting``, ``prefilling``, ``decoding``); only its
own methods change them. An engine step is:

1. **admission**: ``admissible()`` lists waiting sequences in arrival order, and the
   engine starts (``start``) those it can place, at most ``max_running`` in all. A
   sequence the engine defers (it waits for another's prefill) keeps its place in line.
   One whose KV does not fit the budget yet (``KVManager.fits``) stops admission: it
   and everything behind it wait, first come first served, until running ones end.
2. **plan**: one batched decode step for every decoding sequence, then one prefill chunk
   (at most ``chunk_tokens``) for one prefilling sequence. The chunk goes to the
   sequence with the least prefill left (so a warm request with a 25-token suffix
   overtakes a cold 4k-token prompt after at most one chunk), generation before pin
   warm-ups, oldest first among equals. A sequence passed over ``starvation_steps``
   times in a row goes next regardless, so a long cold prompt always makes progress.
   The plan says how the step runs (``StepKind``): **mixed**, the decode step and a
   chunk of at most ``MIX_MAX_TOKENS`` in one forward where the runner can (``can_mix``)
   and every decode row feeds one token; else **split**, the decode step and then the
   chunk, each a forward of its own (``Plan.passes``).

Planning comes after admission, so a request that just arrived is already counted when
the prefill chunk is sized: a pin warming up while requests are served takes a
``PIN_SHARE``-th of a chunk per step, so a request that arrives mid-chunk waits less and
decode steps, which alternate with the pin's chunks, slow down less. A pin that requests
are waiting for (its followers) gets whole chunks: shrinking it would only delay them.
Alone, a pin gets whole chunks too.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from .sequence import Kind, Sequence, State

PIN_SHARE = 8  # a pin's chunk is chunk_tokens // PIN_SHARE while requests are served
# A prefill chunk of at most this many tokens runs in the same forward as a decode step
# (a mixed step): the weights are read once for both. Measured on a 2-core EPYC
# (default model, bf16, one decode row on the 5.4k house): see README, Decode speed.
MIX_MAX_TOKENS = 256


class StepKind(enum.Enum):
    """How a step's decode rows and prefill chunk run."""

    MIXED = "mixed"  # both in one forward
    SPLIT = "split"  # the decode step, then the chunk: a forward each (either may be absent)


def extends(rows: list[Sequence]) -> bool:
    """Whether the decode rows are one row with several tokens to feed (forced ones)."""
    return len(rows) == 1 and len(rows[0].unfed) > 1


@dataclass
class Plan:
    decode: list[Sequence] = field(default_factory=list)
    prefill: Sequence | None = None
    chunk: int = 0
    kind: StepKind = StepKind.SPLIT

    @property
    def empty(self) -> bool:
        return not (self.decode or self.prefill)

    def passes(self) -> Iterator[Plan]:
        """The forwards of the step in order, each to be run and postprocessed before the
        next is asked for: a mixed plan is one; a split plan is its decode step, then its
        chunk, unless that sequence stopped prefilling meanwhile."""
        if self.kind is StepKind.MIXED:
            yield self
            return
        if self.decode:
            yield Plan(decode=self.decode)
        if self.prefill is not None and self.prefill.state is State.PREFILLING:
            yield Plan(prefill=self.prefill, chunk=self.chunk)


class QueueFullError(RuntimeError):
    """More requests are waiting than ``max_queue`` allows."""


class NeverFitsError(QueueFullError):
    """A request could not run within the KV budget even alone (a 503, like a full queue)."""


class Scheduler:
    def __init__(
        self,
        max_running: int = 8,
        chunk_tokens: int = 256,
        max_queue: int = 64,
        starvation_steps: int = 16,
        can_mix: Callable[[], bool] | None = None,
    ) -> None:
        """``can_mix``: whether the runner can run a decode step and a prefill chunk in
        one forward now (``ModelRunner.can_mix``); without it every step is split."""
        if chunk_tokens < 1 or max_running < 1:
            raise ValueError("chunk_tokens and max_running must be positive")
        self.max_running = max_running
        self.chunk_tokens = chunk_tokens
        self.max_queue = max_queue
        self.starvation_steps = starvation_steps
        self.can_mix = can_mix
        self.waiting: deque[Sequence] = deque()
        self.prefilling: list[Sequence] = []
        self.decoding: list[Sequence] = []
        self._passed_over: dict[int, int] = {}

    # ------------------------------------------------------------------ queues

    @property
    def running(self) -> int:
        return len(self.prefilling) + len(self.decoding)

    @property
    def free_slots(self) -> int:
        return max(0, self.max_running - self.running)

    def all(self) -> list[Sequence]:
        """Every sequence the scheduler holds (a copy, safe to iterate while changing)."""
        return [*self.waiting, *self.prefilling, *self.decoding]

    def enqueue(self, seq: Sequence) -> None:
        """``seq`` waits for admission, after everything already waiting."""
        seq.state = State.WAITING
        self.waiting.append(seq)

    def admissible(self) -> list[Sequence]:
        """The waiting sequences in arrival order (a copy), if any slot is free."""
        return list(self.waiting) if self.free_slots else []

    def start(self, seq: Sequence) -> None:
        """The engine placed ``seq``'s KV: it leaves the line and prefills."""
        self.waiting.remove(seq)
        seq.state = State.PREFILLING
        self.prefilling.append(seq)

    def prefilled(self, seq: Sequence) -> None:
        """``seq`` finished its prompt and now decodes."""
        self.prefilling.remove(seq)
        self._passed_over.pop(seq.id, None)
        seq.state = State.DECODING
        self.decoding.append(seq)

    def remove(self, seq: Sequence) -> None:
        for group in (self.prefilling, self.decoding):
            if seq in group:
                group.remove(seq)
        if seq in self.waiting:
            self.waiting.remove(seq)
        self._passed_over.pop(seq.id, None)

    # ------------------------------------------------------------------ planning

    def plan(self) -> Plan:
        """The next step's work and how it runs (call after admission)."""
        plan = Plan(decode=list(self.decoding))
        if self.prefilling:
            chosen = self._pick_prefill()
            plan.prefill = chosen
            chunk = self.chunk_tokens
            if chosen.kind is Kind.PIN and not chosen.has_followers and self._serving():
                chunk = max(1, chunk // PIN_SHARE)
            plan.chunk = min(chunk, chosen.remaining_prefill)
        plan.kind = StepKind.MIXED if self._mixes(plan) else StepKind.SPLIT
        return plan

    def _mixes(self, plan: Plan) -> bool:
        """Whether ``plan``'s decode step and chunk run in one forward: a chunk of at most
        ``MIX_MAX_TOKENS`` beside decode rows that feed one token each, where the runner
        can."""
        prefill = plan.prefill
        return (
            bool(plan.decode)
            and prefill is not None
            and prefill.state is State.PREFILLING
            and plan.chunk <= MIX_MAX_TOKENS
            and self.can_mix is not None
            and self.can_mix()
            and not extends(plan.decode)
        )

    def _serving(self) -> bool:
        """Whether any generation request is in the engine (beyond pins)."""
        groups = (self.waiting, self.prefilling, self.decoding)
        return any(s.kind is Kind.GENERATE for group in groups for s in group)

    def _pick_prefill(self) -> Sequence:
        starving = [
            s for s in self.prefilling if self._passed_over.get(s.id, 0) >= self.starvation_steps
        ]
        if starving:
            chosen = min(starving, key=lambda s: s.arrival)
        else:
            chosen = min(
                self.prefilling,
                key=lambda s: (s.kind is Kind.PIN, s.remaining_prefill, s.arrival),
            )
        for seq in self.prefilling:
            if seq is chosen:
                self._passed_over.pop(seq.id, None)
            else:
                self._passed_over[seq.id] = self._passed_over.get(seq.id, 0) + 1
        return chosen
