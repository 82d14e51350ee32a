"""Where a sequence's KV lives: cache lookups and locks, working buffers, cache inserts.

``KVManager`` is the only owner of the prefix cache, the buffer pool and the decode
batch. Every method runs on the engine's worker thread (other threads only read stats),
so a match and the lock that follows it can never be split by an eviction.

* ``match`` finds the longest cached prefix; ``place`` locks it and gives the sequence
  its working buffer: cached segments are read in place (up to ``MAX_SHARED_SEGMENTS``
  of them, see ``attention``), the rest are copied in.
* ``store`` inserts a sequence's prompt (and generated) KV into the cache, so the next
  turn of a chat hits; ``release`` gives back its locks and buffer.
* ``make_room`` keeps cache + working buffers + pooled buffers within the KV budget.

**Sliding-window layers.** The radix cache holds every layer's KV for every token (a
sliding layer's window is applied when it is read, attention.py). A pin restored from
the store holds its sliding layers' last ``window`` tokens only (store.py); before them
its sliding KV is zero. The radix tree shares those zeros with every path that starts
with the pin's first tokens, also one that leaves the pin early, so a match whose next
query's window would reach into them is a miss (``_inside_windowed``), and no pin is
saved from such a path.

**State layers** (hybrid models, ``state.py``). Their state after a prefix is one
snapshot, not per-token KV, so a match is cut back to the longest prefix that has a
snapshot (``snapshots.longest``); everything after it is computed. ``store`` takes a
snapshot at the end of what it inserts: the end of every pin, of every prompt whose
followers wait for it, and of every finished request (prompt and generated tokens).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from .batch import DecodeBatch
from .cache import Match, RadixCache, common_prefix
from .config import CacheMode, EngineConfig
from .kv import BufferPool, kv_range, segment_nbytes, segment_tokens, split_segment
from .runner import ModelRunner
from .sequence import Kind, Sequence
from .state import Snapshot, SnapshotTable

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


class KVManager:
    def __init__(
        self,
        config: EngineConfig,
        runner: ModelRunner,
        budget: int,
        prefilling: Callable[[], Iterable[Sequence]],
    ) -> None:
        self._prefilling = prefilling  # the running prefills (their buffers count too)
        self.mode = config.cache_mode
        self.bytes_per_token = runner.info.bytes_per_token
        self.layout = runner.layout
        self.cache: RadixCache[torch.Tensor] = RadixCache(budget, TensorOps())
        # Recycled working buffers: at most a quarter of the KV budget (1 GiB at most).
        self.pool = BufferPool(runner.layout, max_free_bytes=min(budget // 4, 1 << 30))
        self.batch = DecodeBatch(runner, self.pool)
        # Cache hits read their prefix in place instead of copying it (see attention.py)
        # when the model passed the self-test.
        self.share_prefix = (
            config.share_prefix and config.cache_mode is not CacheMode.NONE and runner.shares_prefix
        )
        # Restored pins whose sliding layers hold only their last window: namespace ->
        # their token ids (see the module's docstring).
        self._windowed: dict[str, list[tuple[int, ...]]] = {}
        # Recurrent states at prefix boundaries (hybrid models only).
        self.snapshots = (
            SnapshotTable(
                lambda: [(r.namespace, r.tokens) for r in self.cache.pins().values()],
                max_unpinned_bytes=budget // 4,
            )
            if runner.layout.state_layers
            else None
        )

    # ------------------------------------------------------------------ lookups

    def match(self, seq: Sequence) -> Match[torch.Tensor]:
        """The longest cached prefix of ``seq``'s prompt (a request keeps one token to run)."""
        if self.mode is CacheMode.NONE:
            return Match(seq.namespace, 0, [], None)
        match = self.cache.match(seq.namespace, seq.prompt, self.match_limit(seq))
        if self._inside_windowed(seq.namespace, seq.prompt, match.length):
            return Match(seq.namespace, 0, [], None)
        if self.snapshots is not None:
            return self._to_snapshot(seq, match)
        return match

    def _to_snapshot(self, seq: Sequence, match: Match[torch.Tensor]) -> Match[torch.Tensor]:
        """``match`` cut back to the longest prefix whose recurrent state is kept."""
        assert self.snapshots is not None
        length = self.snapshots.longest(seq.namespace, seq.prompt, match.length)
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

    def _inside_windowed(self, namespace: str, tokens: list[int], length: int) -> bool:
        """Whether resuming ``tokens`` after ``length`` would read a restored pin's zeros.

        A restored windowed pin of ``T`` tokens has zero sliding KV before ``T - window``.
        A path that shares its first ``c`` tokens shares those runs (the radix tree keeps
        one copy), so along it the zeros end at ``min(c, T - window)``. The next query,
        at position ``length``, sees the keys from ``length - window + 1`` on: the match
        is usable only if those are past the zeros. (A match that leaves the pin early
        with a short tail used to read them.)
        """
        window = self.layout.window
        if length == 0 or window is None:
            return False
        head = tokens[:length]
        for pinned in self._windowed.get(namespace, ()):
            zeros = min(common_prefix(pinned, head), len(pinned) - window)
            if zeros > 0 and length - window + 1 < zeros:
                return True
        return False

    @staticmethod
    def match_limit(seq: Sequence) -> int:
        return len(seq.prompt) - (1 if seq.kind is Kind.GENERATE else 0)

    # ------------------------------------------------------------------ placement

    def place(self, seq: Sequence, match: Match[torch.Tensor]) -> None:
        """Lock ``match`` for ``seq`` and give it a working buffer holding the rest."""
        self.cache.lock(match.node)
        seq.lock_node = match.node
        try:
            self._place_buffer(seq, match)
        except BaseException:
            self.release(seq)
            raise

    def _place_buffer(self, seq: Sequence, match: Match[torch.Tensor]) -> None:
        reserve = 0 if seq.kind is Kind.PIN else min(seq.params.max_tokens, 256)
        segments = [payload[:, :, :, :used] for payload, used in match.segments]
        shared = segments[:MAX_SHARED_SEGMENTS] if self.share_prefix else []
        shared_len = sum(segment_tokens(s) for s in shared)
        capacity = len(seq.prompt) - shared_len + reserve + 1
        self.make_room(capacity * self.bytes_per_token)
        buffer = self.pool.buffer(rows=1, capacity=capacity)
        column = 0
        for segment in segments[len(shared) :]:
            buffer.write_segment(0, column, segment)
            column += segment_tokens(segment)
        buffer.set_length(column)
        if self.snapshots is not None and match.length:
            snapshot = self.snapshots.get(seq.namespace, seq.prompt[: match.length])
            if snapshot is None:  # ``match`` found it on this thread just now
                raise RuntimeError("the recurrent state of a cached prefix is gone")
            buffer.restore([snapshot])
        seq.shared, seq.shared_len = tuple(shared), shared_len
        seq.kv, seq.kv_row, seq.kv_offset, seq.kv_len = buffer, 0, 0, shared_len + column

    def release(self, seq: Sequence) -> None:
        """Give back ``seq``'s cache lock and working buffer (idempotent)."""
        if seq.lock_node is not None:
            node, seq.lock_node = seq.lock_node, None
            self.cache.unlock(node)
        if seq.kv is not None and seq.kv is not self.batch.buffer:
            self.pool.release(seq.kv)
        seq.kv, seq.shared, seq.shared_len = None, (), 0

    # ------------------------------------------------------------------ the cache

    def store(self, seq: Sequence) -> None:
        """Insert the sequence's prompt (and generated) KV into the prefix cache."""
        if self.mode is CacheMode.NONE or seq.kv is None or seq.kv_len == 0:
            return
        if self.mode is CacheMode.LAST_PROMPT:
            self.cache.clear()
        tokens = seq.tokens_with_kv()
        shared, buffer, row, offset = seq.shared, seq.kv, seq.kv_row, seq.kv_offset
        bpt = self.bytes_per_token
        cached = self.cache.insert(
            seq.namespace,
            tokens,
            lambda a, b: kv_range(shared, buffer, row, offset, a, b),
            lambda a, b: (b - a) * bpt,
        )
        if self.snapshots is not None and cached == len(tokens):
            self.snapshots.put(seq.namespace, tokens, buffer.snapshot(row, len(tokens)))

    def insert_segment(
        self,
        namespace: str,
        tokens: list[int],
        kv: torch.Tensor,
        snapshot: Snapshot | None = None,
    ) -> bool:
        """Cache one loaded ``[L, 2, H, T, D]`` segment for ``tokens``; True if all fit.

        The segment comes from the store: for a model with sliding layers, those hold
        the last ``window`` tokens only, so it is valid at its end only. A hybrid model's
        segment comes with the ``snapshot`` of its state layers at its end (without one
        it is useless: it is not cached).
        """
        if self.snapshots is not None and (snapshot is None or snapshot.tokens != len(tokens)):
            return False
        kv = kv.to(device=self.layout.device, dtype=self.layout.dtype)
        window = self.layout.window
        if self.layout.sliding and window is not None and len(tokens) > window:
            self._windowed.setdefault(namespace, []).append(tuple(tokens))
        bpt = self.bytes_per_token
        total = len(tokens)

        def payload(a: int, b: int) -> torch.Tensor:
            return kv if (a, b) == (0, total) else kv[:, :, :, a:b].clone()

        if self.cache.insert(namespace, tokens, payload, lambda a, b: (b - a) * bpt) != total:
            return False
        if self.snapshots is not None and snapshot is not None:
            self.snapshots.put(namespace, tokens, snapshot.to(self.layout.device))
        return True

    def segments(self, namespace: str, tokens: list[int]) -> list[torch.Tensor] | None:
        """The cached KV of ``tokens`` as segments in token order (None unless all cached)."""
        match = self.cache.match(namespace, tokens)
        if match.length != len(tokens) or self._inside_windowed(namespace, tokens, len(tokens)):
            return None
        return [payload[:, :, :, :used] for payload, used in match.segments]

    def snapshot(self, namespace: str, tokens: list[int]) -> Snapshot | None:
        """The state layers' snapshot after ``tokens`` (hybrid models; else ``None``)."""
        return None if self.snapshots is None else self.snapshots.get(namespace, tokens)

    def clear(self) -> int:
        """Drop every cached prefix and snapshot that no pin holds; returns bytes freed."""
        freed = self.cache.clear()
        return freed + (self.snapshots.clear() if self.snapshots is not None else 0)

    # ------------------------------------------------------------------ the budget

    def make_room(self, nbytes: int) -> None:
        """Keep cache + working buffers + pooled buffers (+ ``nbytes``) within the budget.

        Pooled buffers go first, then least recently used unpinned cache entries. What
        is pinned or in use cannot go: then the budget is exceeded by the working
        buffers of the running requests (``kv_working_bytes`` shows it).
        """
        working = self.working_bytes()

        states = self.snapshots.nbytes if self.snapshots is not None else 0

        def over() -> int:
            used = self.cache.used_bytes + working + self.pool.free_bytes + states
            return used + nbytes - self.cache.capacity_bytes

        if over() > 0 and self.pool.free_bytes:
            self.pool.clear()
        if (excess := over()) > 0:
            self.cache.evict(excess)

    def working_bytes(self) -> int:
        """Bytes of the decode batch plus the prefilling sequences' own buffers."""
        batch = self.batch.buffer
        return self.batch.nbytes + sum(
            s.kv.nbytes for s in list(self._prefilling()) if s.kv is not None and s.kv is not batch
        )
