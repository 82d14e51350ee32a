"""Where a sequence's KV lives: cache lookups and locks, working buffers, cache inserts.

``KVManager`` is the only owner of the prefix cache, the buffer pool and the decode
batch. Every method runs on the engine's worker thread (other threads only read stats),
so a match and the lock that follows it can never be split by an eviction.

* ``match`` finds the longest cached prefix; ``place`` locks it and gives the sequence
  its working buffer: cached segments are read in place (up to ``MAX_SHARED_SEGMENTS``
  of them, see ``attention``), the rest are copied in.
* ``store`` inserts a sequence's prompt (and generated) KV into the cache, so the next
  turn of a chat hits; ``release`` gives back its locks and buffer.
* ``fits`` admits a sequence only if what it and the running ones can still grow to
  fits the KV budget beside what the cache cannot evict (``budget.py``); ``make_room``
  makes room before every buffer is allocated, so cache + snapshots + working buffers +
  pooled buffers stay within the budget (``peak_bytes``: the most they ever held).

**Sliding-window layers** (a model whose ``KVLayout.trims_windows``). A sliding layer
at position ``p`` reads only the keys after ``p - window``, so a cached prefix keeps
only what its next token needs: radix-tree segments hold the full-attention layers
(``KVLayout.segment_layers``), and the sliding layers' KV of the prefix's last
``window`` tokens is a snapshot at its end (``Snapshot.window``), kept like a hybrid
model's state (below). A prefix of ``T`` tokens thus holds ``min(T, window) / T`` of
its sliding layers' full KV. A hit reads that tail in place as one more part, with its
own start (``Sequence.window``), or copies it into the working buffer where segments
are copied too. Like state layers, such a prefix resumes only where a snapshot exists:
at the end of a pin, and of what a turn cached.

**State layers** (hybrid models, ``state.py``). Their state after a prefix is one
snapshot, not per-token KV, so a match is cut back to the longest prefix that has a
snapshot (``snapshots.longest``); everything after it is computed. ``store`` takes a
snapshot at the end of what it inserts: the end of every pin, of every prompt whose
followers wait for it, and of every finished request (prompt and generated tokens).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from ..cache.budget import Demand, KVBudgetError, reserved_bytes
from ..cache.radix import Match, RadixCache
from ..config import CacheMode, EngineConfig
from ..model.attention import PrefixPart
from ..model.kv import BufferPool, KVBuffer, kv_range, segment_nbytes, segment_tokens, split_segment
from ..model.runner import ModelRunner
from ..model.state import Snapshot, SnapshotTable
from .batch import DecodeBatch
from .sequence import Kind, Sequence

# A cache hit reads at most this many segments (radix-tree nodes) in place; the KV of
# any further ones is copied into the working buffer (each part costs a few small
# operations per layer and step).
MAX_SHARED_SEGMENTS = 8


class TensorOps:
    """``PayloadOps`` for KV segments ``[L, 2, H, T, D]``."""

    def nbytes(self, payload: torch.Tensor) -> int:
        return segment_nbytes(payload)

    def split(self, payload: torch.Tensor, at: int) -> tuple[torch.Tensor, torch.Tensor]:
        return split_segment(payload, at)


@dataclass(frozen=True)
class KVUsage:
    """The KV the worker holds outside the cache, as of its last step: what ``/v1/stats``
    reads (the event loop must not walk the worker's sequences while they change)."""

    working_bytes: int = 0
    pool_free_bytes: int = 0


class KVManager:
    usage: KVUsage = KVUsage()  # replaced whole by ``publish_usage``; read from any thread

    def __init__(
        self,
        config: EngineConfig,
        runner: ModelRunner,
        budget: int,
        prefilling: Callable[[], Iterable[Sequence]],
    ) -> None:
        self._prefilling = prefilling  # the running prefills (their buffers count too)
        self.budget = budget
        self.peak_bytes = 0  # the most cache + snapshots + buffers held at once
        self._demands: dict[int, Demand] = {}  # of the placed sequences, by id
        self.mode = config.cache_mode
        self.bytes_per_token = runner.info.bytes_per_token  # of a working buffer
        self.layout = runner.layout
        # Of a cached segment (less than a buffer's when sliding layers are trimmed).
        self.segment_bytes_per_token = runner.layout.segment_bytes_per_token
        self._segment_layers = runner.layout.segment_layers if runner.layout.trims_windows else None
        self.cache: RadixCache[torch.Tensor] = RadixCache(budget, TensorOps())
        # Recycled working buffers: at most a quarter of the KV budget (1 GiB at most).
        self.pool = BufferPool(runner.layout, max_free_bytes=min(budget // 4, 1 << 30))
        self.batch = DecodeBatch(runner, self.pool, self.new_buffer)
        # Cache hits read their prefix in place instead of copying it (see attention.py)
        # when the model passed the self-test.
        self.share_prefix = (
            config.share_prefix and config.cache_mode is not CacheMode.NONE and runner.shares_prefix
        )
        # Recurrent states (hybrid models) or sliding windows at prefix boundaries.
        self.snapshots = (
            SnapshotTable(
                lambda: [(r.namespace, r.tokens) for r in self.cache.pins().values()],
                max_unpinned_bytes=budget // 4,
            )
            if runner.layout.state_layers or runner.layout.trims_windows
            else None
        )

    # ------------------------------------------------------------------ lookups

    def match(self, seq: Sequence) -> Match[torch.Tensor]:
        """The longest cached prefix of ``seq``'s prompt (a request keeps one token to run)."""
        if self.mode is CacheMode.NONE:
            return Match(seq.namespace, 0, [], None)
        match = self.cache.match(seq.namespace, seq.prompt, self.match_limit(seq))
        if self.snapshots is not None:
            return self._to_snapshot(seq, match)
        return match

    def _to_snapshot(self, seq: Sequence, match: Match[torch.Tensor]) -> Match[torch.Tensor]:
        """``match`` cut back to the longest prefix whose recurrent state is kept."""
        assert self.snapshots is not None
        length = self.snapshots.longest(seq.namespace, seq.prompt, match.length)
        if (
            length < match.length
            and self._snapshot_at(seq.namespace, seq.prompt, match.length) is not None
        ):
            length = match.length  # a window one token further on serves here too
        if length == match.length:
            return match
        if length == 0:
            return Match(seq.namespace, 0, [], None)
        segments, left = [], length
        for payload, used in match.segments:
            segments.append((payload, min(used, left)))
            left -= min(used, left)
            if left == 0:
                break
        # ``node`` stays the deepest one matched: locking it protects the shorter path too.
        return Match(seq.namespace, length, segments, match.node, match.pin)

    @staticmethod
    def match_limit(seq: Sequence) -> int:
        return len(seq.prompt) - (1 if seq.kind is Kind.GENERATE else 0)

    # ------------------------------------------------------------------ placement

    def place(self, seq: Sequence, match: Match[torch.Tensor], *, strict: bool = True) -> None:
        """Lock ``match`` for ``seq`` and give it a working buffer holding the rest
        (``strict`` False: even past the budget; a pin that runs alone, see ``budget``)."""
        self.cache.lock(match.node)
        seq.lock_node = match.node
        self._demands[seq.id] = self.demand(seq, match)
        try:
            self._place_buffer(seq, match, strict)
        except BaseException:
            self.release(seq)
            raise

    def _shared(self, match: Match[torch.Tensor]) -> list[torch.Tensor]:
        """The segments of ``match`` that a sequence reads in place."""
        if not self.share_prefix:
            return []
        return [payload[:, :, :, :used] for payload, used in match.segments][:MAX_SHARED_SEGMENTS]

    def demand(self, seq: Sequence, match: Match[torch.Tensor]) -> Demand:
        """The most working KV ``seq`` can take, placed over ``match``."""
        own = len(seq.prompt) - sum(segment_tokens(s) for s in self._shared(match))
        return Demand.of(own, None if seq.kind is Kind.PIN else seq.params.max_tokens)

    def _place_buffer(self, seq: Sequence, match: Match[torch.Tensor], strict: bool) -> None:
        segments = [payload[:, :, :, :used] for payload, used in match.segments]
        shared = self._shared(match)
        shared_len = sum(segment_tokens(s) for s in shared)
        buffer = self.new_buffer(1, self._demands[seq.id].buffer, strict=strict)
        seq.kv = buffer  # from now on ``release`` gives it back
        column = 0
        for segment in segments[len(shared) :]:
            buffer.write_segment(0, column, segment, self._segment_layers)
            column += segment_tokens(segment)
        buffer.set_length(column)
        window = None
        if self.snapshots is not None and match.length:
            snapshot = self._snapshot_at(seq.namespace, seq.prompt, match.length)
            if snapshot is None:  # ``match`` found it on this thread just now
                raise RuntimeError("the state or window of a cached prefix is gone")
            if snapshot.window is not None:
                window = self._place_window(buffer, snapshot.window, match.length, shared_len)
            else:
                buffer.restore([snapshot])
        seq.shared, seq.shared_len, seq.window = tuple(shared), shared_len, window
        seq.kv, seq.kv_row, seq.kv_offset, seq.kv_len = buffer, 0, 0, shared_len + column

    def _snapshot_at(self, namespace: str, tokens: list[int], length: int) -> Snapshot | None:
        """The snapshot to resume ``tokens`` after ``length`` from. For sliding windows
        also one a token further on, without its last token: a prompt that equals a
        cached one (a retry) resumes one token before its end, as a request must, and a
        window that reaches one token further holds everything needed there."""
        assert self.snapshots is not None
        snapshot = self.snapshots.get(namespace, tokens[:length])
        if snapshot is None and self.layout.trims_windows and length < len(tokens):
            later = self.snapshots.get(namespace, tokens[: length + 1])
            if later is not None and later.window is not None and later.window.shape[3] > 1:
                snapshot = Snapshot(length, (), (), later.window[:, :, :, :-1])
        return snapshot

    def _place_window(
        self, buffer: KVBuffer, tail: torch.Tensor, end: int, shared_len: int
    ) -> PrefixPart | None:
        """Give a new single-row ``buffer`` (its first column at position ``shared_len``)
        the sliding layers' ``tail`` of the tokens before ``end``: what lies before the
        buffer is read in place (the part returned), the rest is copied into it, and its
        sliding layers' older columns are zeroed (no query's window reaches them, but
        masked garbage could still be NaN)."""
        sliding = self.layout.sliding
        start = end - tail.shape[3]
        inside = max(0, start - shared_len)  # buffer columns before the tail
        if inside:
            for layer in sliding:
                buffer.data[layer, :, 0, :, :inside] = 0
        split = max(0, shared_len - start)  # tail tokens before the buffer
        if split < tail.shape[3]:
            buffer.write_segment(0, inside, tail[:, :, :, split:], sliding)
        if split == 0:
            return None
        return PrefixPart(tail[:, :, :, :split], layers=sliding, start=start)

    def copy_cached(self, buffer: KVBuffer, namespace: str, tokens: list[int]) -> None:
        """Copy the cached KV of ``tokens`` (with their snapshot) into row 0 of ``buffer``
        from column 0, as a request that copies its prefix gets it (benchmarks' floor)."""
        match = self.cache.match(namespace, tokens)
        if match.length != len(tokens):
            raise ValueError("the prefix is not cached")
        column = 0
        for payload, used in match.segments:
            buffer.write_segment(0, column, payload[:, :, :, :used], self._segment_layers)
            column += used
        buffer.set_length(column)
        snapshot = self.snapshot(namespace, tokens)
        if snapshot is not None and snapshot.window is not None:
            self._place_window(buffer, snapshot.window, len(tokens), 0)
        elif snapshot is not None:
            buffer.restore([snapshot])

    def _window_tail(self, seq: Sequence, end: int) -> torch.Tensor:
        """A new ``[Ls, 2, H, w, D]`` tensor: ``seq``'s sliding layers' KV of its last
        ``w = min(window, end)`` tokens before ``end``."""
        lo = end - self.layout.window_tokens(end)
        pieces = []
        if lo < seq.shared_len:  # before the buffer: in the window part read in place
            part = seq.window
            if part is None or part.start is None or part.start > lo:
                raise RuntimeError("a sequence lacks the sliding KV of its cached prefix")
            pieces.append(part.segment[:, :, :, lo - part.start : seq.shared_len - part.start])
        first = max(lo, seq.shared_len)
        column = seq.kv_offset + first - seq.shared_len
        sliding = self.layout.sliding
        pieces.append(seq.kv.read_layers(seq.kv_row, column, column + end - first, sliding))
        return torch.cat(pieces, dim=3) if len(pieces) > 1 else pieces[0]

    def release(self, seq: Sequence) -> None:
        """Give back ``seq``'s cache lock, working buffer and reservation (idempotent)."""
        self._demands.pop(seq.id, None)
        if seq.lock_node is not None:
            node, seq.lock_node = seq.lock_node, None
            self.cache.unlock(node)
        if seq.kv is not None and seq.kv is not self.batch.buffer:
            self.pool.release(seq.kv)
        seq.kv, seq.shared, seq.shared_len, seq.window = None, (), 0, None

    # ------------------------------------------------------------------ the cache

    def store(self, seq: Sequence) -> None:
        """Insert the sequence's prompt (and generated) KV into the prefix cache."""
        if self.mode is CacheMode.NONE or seq.kv is None or seq.kv_len == 0:
            return
        if self.mode is CacheMode.LAST_PROMPT:
            self.cache.clear()
        tokens = seq.tokens_with_kv()
        if seq.kind is Kind.GENERATE:  # what does not fit beside the buffers stays out
            tokens = tokens[: self._insertable(seq.namespace, tokens)]
            if not tokens:
                return
        shared, buffer, row, offset = seq.shared, seq.kv, seq.kv_row, seq.kv_offset
        bpt, layers = self.segment_bytes_per_token, self._segment_layers
        donated: list[KVBuffer] = []

        def payload(a: int, b: int) -> torch.Tensor:
            if (view := self._donated_view(seq, a, b)) is not None:
                donated.append(buffer)
                return view
            return kv_range(shared, buffer, row, offset, a, b, layers)

        cached = self.cache.insert(seq.namespace, tokens, payload, lambda a, b: (b - a) * bpt)
        for given in donated:  # the cache holds its storage now: never recycled
            self.pool.donate(given)
        if self.snapshots is not None and cached == len(tokens):
            if self.layout.trims_windows:
                snapshot = Snapshot(len(tokens), (), (), self._window_tail(seq, len(tokens)))
            else:
                snapshot = buffer.snapshot(row, len(tokens))
            self.snapshots.put(seq.namespace, tokens, snapshot)
        self.note_peak()

    def _donated_view(self, seq: Sequence, a: int, b: int) -> torch.Tensor | None:
        """The KV of a pin's tokens ``[a, b)`` as a view of its working buffer, where
        that is all the buffer holds (None: copy it). A pin ends right after it is
        cached, so the cache can keep its buffer instead of a copy: with a copy, the
        house's KV was in memory twice at the pin's end (the peak; 175 MB for the
        1.5B shape's 6,310 tokens), and the buffer stayed in the pool after it."""
        buffer = seq.kv
        if seq.kind is not Kind.PIN or buffer is None or self._segment_layers is not None:
            return None
        start = seq.kv_offset + a - seq.shared_len
        end = seq.kv_offset + b - seq.shared_len
        if (
            start != 0
            or end != buffer.length
            or buffer.rows != 1
            or buffer.capacity > end + 1  # a pin's buffer: its prompt + 1
            or buffer.storage.numel() != buffer.data.numel()  # not a larger recycled one
        ):
            return None
        return buffer.data[:, :, seq.kv_row, :, start:end]

    def _insertable(self, namespace: str, tokens: list[int]) -> int:
        """How many of ``tokens`` can be cached now without passing the budget: the new
        ones (and a split node's transient copy) must fit beside every buffer."""
        match = self.cache.match(namespace, tokens)
        split = 0
        if match.segments:
            payload, used = match.segments[-1]
            if used < segment_tokens(payload):
                split = segment_nbytes(payload)
        bpt = self.segment_bytes_per_token
        room = self.make_room((len(tokens) - match.length) * bpt + split)
        if room >= 0:
            return len(tokens)
        fit = len(tokens) + room // bpt - 1
        return fit if fit > match.length else 0  # 0: nothing new, nothing split

    def insert_segment(
        self,
        namespace: str,
        tokens: list[int],
        kv: torch.Tensor,
        snapshot: Snapshot | None = None,
    ) -> bool:
        """Cache one loaded segment ``[L, 2, H, T, D]`` of ``KVLayout.segment_layers`` for
        ``tokens``; True if all fit.

        The segment comes from the store, with the ``snapshot`` at its end of a hybrid
        model's state layers or of a sliding model's windows (without one it is useless:
        it is not cached).
        """
        if self.snapshots is not None and (snapshot is None or snapshot.tokens != len(tokens)):
            return False
        need = self.layout.prefix_bytes(len(tokens))
        if need > self.cache_room() or self.make_room(need) < 0:
            return False  # not beside the running requests' reservations: computed instead
        kv = kv.to(device=self.layout.device, dtype=self.layout.dtype)
        if snapshot is not None and snapshot.window is not None:
            window = snapshot.window.to(device=self.layout.device, dtype=self.layout.dtype)
            snapshot = Snapshot(snapshot.tokens, (), (), window)
        bpt = self.segment_bytes_per_token
        total = len(tokens)

        def payload(a: int, b: int) -> torch.Tensor:
            return kv if (a, b) == (0, total) else kv[:, :, :, a:b].clone()

        if self.cache.insert(namespace, tokens, payload, lambda a, b: (b - a) * bpt) != total:
            return False
        if self.snapshots is not None and snapshot is not None:
            self.snapshots.put(namespace, tokens, snapshot.to(self.layout.device))
        self.note_peak()
        return True

    def segments(self, namespace: str, tokens: list[int]) -> list[torch.Tensor] | None:
        """The cached KV of ``tokens`` as segments in token order (None unless all cached)."""
        match = self.cache.match(namespace, tokens)
        if match.length != len(tokens):
            return None
        return [payload[:, :, :, :used] for payload, used in match.segments]

    def snapshot(self, namespace: str, tokens: list[int]) -> Snapshot | None:
        """The snapshot after ``tokens`` (hybrid and window-trimming models; else None)."""
        return None if self.snapshots is None else self.snapshots.get(namespace, tokens)

    def clear(self) -> int:
        """Drop every cached prefix and snapshot that no pin holds; returns bytes freed."""
        freed = self.cache.clear()
        return freed + (self.snapshots.clear() if self.snapshots is not None else 0)

    # ------------------------------------------------------------------ the budget

    def used_bytes(self) -> int:
        """What the budget holds now: cache, snapshots, buffers in use and pooled."""
        states = self.snapshots.nbytes if self.snapshots is not None else 0
        return self.cache.used_bytes + states + self.pool.live_bytes + self.pool.free_bytes

    def note_peak(self) -> None:
        self.peak_bytes = max(self.peak_bytes, self.used_bytes())

    def make_room(self, nbytes: int) -> int:
        """Free room for ``nbytes`` more within the budget; returns the room left after
        them (negative: short by that much).

        Pooled buffers go first, then least recently used unpinned cache entries. What
        is pinned or in use cannot go.
        """

        def left() -> int:
            return self.budget - self.used_bytes() - nbytes

        if left() < 0 and self.pool.free_bytes:
            self.pool.clear()
        if (short := -left()) > 0:
            self.cache.evict(short)
        return left()

    def new_buffer(
        self, rows: int, capacity: int, length: int = 0, *, strict: bool = True
    ) -> KVBuffer:
        """A working buffer, made room for first (``KVBudgetError`` if there is none,
        unless not ``strict``).

        A reused storage larger than needed is taken only while the excess fits beside
        every reservation (it counts against them until it is given back).
        """
        excess = self.budget - self.cache.used_bytes - self.reserved()
        if not self.pool.reusable(rows, capacity, max(0, excess)):
            need = self.pool.nbytes_for(rows, capacity)
            if self.make_room(need) < 0 and strict:
                raise KVBudgetError(
                    f"a working buffer of {need} bytes does not fit the KV budget of "
                    f"{self.budget} bytes ({self.used_bytes()} in use)"
                )
        buffer = self.pool.buffer(rows, capacity, length, max_excess=max(0, excess))
        self.note_peak()
        return buffer

    # ------------------------------------------------------------------ admission

    def reserved(self, extra: Demand | None = None) -> int:
        """Bytes the placed sequences (and ``extra``) may still take, with the snapshots."""
        demands = [*self._demands.values(), *([extra] if extra is not None else [])]
        states = self.snapshots.nbytes if self.snapshots is not None else 0
        working = reserved_bytes(demands, self.batch.nbytes, self.bytes_per_token)
        return working + self.pool.live_excess + states

    @property
    def idle(self) -> bool:
        """No placed sequence holds a reservation (all the budget could be freed)."""
        return not self._demands

    def fits(self, seq: Sequence, match: Match[torch.Tensor]) -> bool:
        """Whether ``seq`` (over ``match``) may start now: with it, every reservation
        fits beside what the cache cannot evict (pinned, or locked by a reader)."""
        reserved = self.reserved(self.demand(seq, match))
        if self.cache.used_bytes + reserved <= self.budget:
            return True  # without evicting anything
        self.cache.lock(match.node)  # its prefix stays while it runs
        try:
            kept = self.cache.used_bytes - self.cache.evictable_bytes()
        finally:
            self.cache.unlock(match.node)
        return kept + reserved <= self.budget

    def cache_room(self) -> int:
        """Bytes the cache could still hold for good beside every reservation."""
        kept = self.cache.used_bytes - self.cache.evictable_bytes()
        return self.budget - kept - self.reserved()

    def never_fits(self, seq: Sequence) -> str | None:
        """Why ``seq`` could not run even alone, beside the pins (None: it could).

        Thread-safe (the event loop asks before queueing): it reads the cache only.
        """
        match = self.cache.match(seq.namespace, seq.prompt, self.match_limit(seq))
        pinned = self.cache.stats().pinned_bytes
        need = reserved_bytes([self.demand(seq, match)], 0, self.bytes_per_token)
        if pinned + need <= self.budget:
            return None
        mib = 1 << 20
        return (
            f"the request needs up to {need / mib:.1f} MiB of working KV for its "
            f"{len(seq.prompt)} prompt tokens and max_tokens {seq.params.max_tokens}, but "
            f"the KV budget is {self.budget / mib:.1f} MiB with {pinned / mib:.1f} MiB "
            "pinned; lower max_tokens or raise --kv-cache-mb"
        )

    def working_bytes(self) -> int:
        """Bytes of the working buffers in use (the decode batch and every sequence's)."""
        return self.pool.live_bytes

    def publish_usage(self) -> None:
        """Worker thread, after each step: the figures other threads read as ``usage``."""
        self.usage = KVUsage(self.working_bytes(), self.pool.free_bytes)
