"""Prefix cache bookkeeping: a token-level radix tree under an exact byte budget.

This module imports no torch. A node's KV ("payload") is opaque here; the two things the
tree needs from it (its size, and how to cut it in two) come from ``PayloadOps``. That
keeps the data structure testable with plain Python payloads.

Rules (after SGLang's radix cache):

* Each namespace (model fingerprint + dtype + salt) has its own root: different models
  can never share KV.
* Edges hold token ids; matching compares real token ids, so a hit is always verified.
* A request **locks** the path it reads (``lock_ref`` on every node up to the root).
  Locked nodes are never evicted.
* A **pin** keeps a path resident (``pin_ref``). Pinned nodes are never evicted.
* Eviction removes least recently used leaves that are neither locked nor pinned, until
  the new bytes fit. ``used_bytes`` never exceeds ``capacity_bytes``.
* Splitting a node keeps the original object as the *lower* half, so every lock or pin
  handle (which points at the deepest node of its path) stays valid. The halves are
  copies, so a split first makes room for the node's bytes a second time (evicting other
  leaves); ``pin`` raises ``CacheFullError`` when that room cannot be made, and ``insert``
  then inserts nothing new.

* ``stats`` never waits for the lock: every change publishes a new, immutable
  ``CacheStats`` before it returns (one walk over the nodes), and ``stats`` returns the
  last one. A scrape on the event loop thus never stalls behind an insert that holds the
  lock while it copies KV, and what it reads is never older than the last change.

Public API: ``match``, ``lock``/``unlock``, ``insert``, ``pin``/``unpin``/``pins``,
``evict``, ``clear``, ``stats``. Everything else is internal.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Protocol, TypeVar

P = TypeVar("P")


class PayloadOps(Protocol[P]):
    """What the tree needs to know about a payload (the KV of a run of tokens)."""

    def nbytes(self, payload: P) -> int: ...

    def split(self, payload: P, at: int) -> tuple[P, P]: ...


class CacheFullError(RuntimeError):
    """The bytes needed cannot be freed: everything else is pinned or locked."""


class PinTooLargeError(CacheFullError):
    """A pin that can never fit in the budget."""


class Node(Generic[P]):
    __slots__ = (
        "children",
        "id",
        "key",
        "last_access",
        "lock_ref",
        "nbytes",
        "parent",
        "payload",
        "pin_ref",
        "pins_here",
    )

    def __init__(self, key: tuple[int, ...], parent: Node[P] | None, node_id: int) -> None:
        self.id = node_id
        self.key = key
        self.parent = parent
        self.children: dict[int, Node[P]] = {}
        self.payload: P | None = None
        self.nbytes = 0
        self.lock_ref = 0
        self.pin_ref = 0
        self.pins_here: set[str] = set()
        self.last_access = 0

    @property
    def is_root(self) -> bool:
        return self.parent is None

    def __repr__(self) -> str:
        return f"Node(id={self.id}, len={len(self.key)}, lock={self.lock_ref}, pin={self.pin_ref})"


@dataclass
class Match(Generic[P]):
    """The longest cached prefix of a token sequence.

    ``segments`` are ``(payload, used)`` pairs in order: the first ``used`` tokens of
    each node's payload. Only the last one can be partial. ``node`` is the deepest node
    touched (what ``lock`` takes); ``None`` when nothing matched.
    """

    namespace: str
    length: int
    segments: list[tuple[P, int]]
    node: Node[P] | None
    pin: str | None = None


@dataclass
class PinRecord:
    name: str
    namespace: str
    tokens: tuple[int, ...]
    nbytes: int
    node: Node[Any]
    hits: int = 0
    tokens_reused: int = 0


@dataclass(frozen=True)
class CacheStats:
    """The cache's figures after one change (published whole; see ``RadixCache.stats``)."""

    capacity_bytes: int
    used_bytes: int
    pinned_bytes: int
    locked_bytes: int
    nodes: int
    locked_nodes: int
    pinned_tokens: int
    pins: int
    evictions: int
    evicted_bytes: int
    evicted_tokens: int
    evictable_bytes: int  # neither pinned nor locked


@dataclass
class _Counters:
    evictions: int = 0
    evicted_bytes: int = 0
    evicted_tokens: int = 0
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    tick: itertools.count[int] = field(default_factory=itertools.count)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share.

    Compares whole runs in C (tuple equality) rather than token by token in Python: a
    5.4k-token house prompt is matched on every request. The common case (the whole run
    is equal) is one comparison; a divergence is found by bisection over slices.
    """
    n = min(len(a), len(b))
    x, y = tuple(a[:n]), tuple(b[:n])
    if x == y:
        return n
    lo, hi = 0, n  # x[:lo] == y[:lo], and the first difference lies in [lo, hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if x[lo:mid] == y[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class RadixCache(Generic[P]):
    """A radix tree of token runs with KV payloads, under a byte budget. Thread-safe."""

    def __init__(self, capacity_bytes: int, ops: PayloadOps[P]) -> None:
        if capacity_bytes < 0:
            raise ValueError("capacity_bytes must be >= 0")
        self.capacity_bytes = capacity_bytes
        self.ops = ops
        self.used_bytes = 0
        self._roots: dict[str, Node[P]] = {}
        self._pins: dict[str, PinRecord] = {}
        self._counters = _Counters()
        self._lock = threading.RLock()
        self._stats = self._measure()

    # ------------------------------------------------------------------ public API

    def match(
        self, namespace: str, tokens: Sequence[int], max_tokens: int | None = None
    ) -> Match[P]:
        """Longest cached prefix of ``tokens[:max_tokens]``. Marks the path as used now."""
        limit = len(tokens) if max_tokens is None else min(max_tokens, len(tokens))
        with self._lock:
            root = self._roots.get(namespace)
            segments: list[tuple[P, int]] = []
            deepest: Node[P] | None = None
            pin: str | None = None
            length = 0
            node = root
            now = next(self._counters.tick)
            while node is not None and length < limit:
                child = node.children.get(tokens[length])
                if child is None:
                    break
                used = common_prefix(
                    child.key, tokens[length : min(limit, length + len(child.key))]
                )
                if used == 0:
                    break
                assert child.payload is not None
                segments.append((child.payload, used))
                deepest = child
                length += used
                if used < len(child.key):
                    break
                if child.pins_here:
                    pin = min(child.pins_here)
                node = child
            for n in self._path(deepest):
                n.last_access = now
            return Match(namespace, length, segments, deepest, pin)

    def lock(self, node: Node[P] | None) -> None:
        """Protect ``node`` and its ancestors from eviction (one reference)."""
        with self._lock:
            turned = [n for n in self._path(node) if n.lock_ref == 0]
            self._lock_path(node)
            self._publish_locks(turned, 1)

    def unlock(self, node: Node[P] | None) -> None:
        with self._lock:
            turned = [n for n in self._path(node) if n.lock_ref == 1]
            try:
                self._unlock_path(node)
            except RuntimeError:
                self._publish()
                raise
            self._publish_locks(turned, -1)

    def insert(
        self,
        namespace: str,
        tokens: Sequence[int],
        payload_for: Callable[[int, int], P],
        bytes_for: Callable[[int, int], int],
    ) -> int:
        """Cache ``tokens``; ``payload_for(start, end)`` gives the KV of a new run.

        Runs already cached are shared, not copied. If the budget cannot hold all new
        tokens, the longest prefix that fits is inserted. Returns the number of tokens of
        ``tokens`` that are cached afterwards.
        """
        with self._lock:
            try:
                return self._insert(namespace, tokens, payload_for, bytes_for)
            finally:
                self._publish()

    def _insert(
        self,
        namespace: str,
        tokens: Sequence[int],
        payload_for: Callable[[int, int], P],
        bytes_for: Callable[[int, int], int],
    ) -> int:
        """``insert`` under the lock (it publishes the figures afterwards)."""
        root = self._roots.setdefault(namespace, Node((), None, 0))
        try:
            node, length = self._walk_split(root, tokens)
        except CacheFullError:
            # No room to cut a node in two: nothing new is inserted, and what is
            # cached is what a match finds.
            return self.match(namespace, tokens).length
        if length == len(tokens):
            return length
        guard = node if not node.is_root else None
        self._lock_path(guard)
        try:
            want = len(tokens) - length
            fit = self._make_room(want, lambda n: bytes_for(length, length + n))
            if fit == 0:
                return length
            child = Node[P](tuple(tokens[length : length + fit]), node, self._new_id())
            child.payload = payload_for(length, length + fit)
            child.nbytes = self.ops.nbytes(child.payload)
            if self.used_bytes + child.nbytes > self.capacity_bytes:
                raise RuntimeError("bytes_for disagrees with the payload size")
            child.last_access = next(self._counters.tick)
            node.children[child.key[0]] = child
            self.used_bytes += child.nbytes
            return length + fit
        finally:
            self._unlock_path(guard)

    def contains(self, namespace: str, tokens: Sequence[int]) -> bool:
        return self.match(namespace, tokens).length == len(tokens)

    def pin(self, name: str, namespace: str, tokens: Sequence[int]) -> PinRecord:
        """Pin ``tokens`` (already cached) under ``name``; replaces an older pin atomically.

        The new path is pinned before the old one is released, so requests never see a
        moment without a pinned prefix. Raises ``KeyError`` if ``tokens`` are not cached,
        and ``CacheFullError`` if they end inside a node that cannot be split for lack of
        room (see ``_split``); the cache is unchanged then, apart from evictions.
        """
        with self._lock:
            try:
                return self._pin(name, namespace, tokens)
            finally:
                self._publish()  # a split that failed may have evicted

    def unpin(self, name: str) -> PinRecord:
        with self._lock:
            record = self._pins.pop(name)
            self._release_pin(record)
            self._publish()
            return record

    def pins(self) -> dict[str, PinRecord]:
        with self._lock:
            return dict(self._pins)

    def record_pin_hit(self, name: str, tokens_reused: int) -> None:
        with self._lock:
            record = self._pins.get(name)
            if record is not None:
                record.hits += 1
                record.tokens_reused += tokens_reused

    def evictable_bytes(self) -> int:
        """Bytes neither pinned nor locked, after the last change (no lock taken)."""
        return self._stats.evictable_bytes

    def check_fits(self, nbytes: int) -> None:
        """Raise ``PinTooLargeError``/``CacheFullError`` unless ``nbytes`` could be made free.

        Reads the published figures (no lock): the event loop calls it before a pin.
        """
        if nbytes > self.capacity_bytes:
            raise PinTooLargeError(
                f"needs {nbytes} bytes but the KV cache budget is {self.capacity_bytes} bytes"
            )
        stats = self._stats
        free = self.capacity_bytes - stats.used_bytes + stats.evictable_bytes
        if nbytes > free:
            raise CacheFullError(
                f"needs {nbytes} bytes; only {free} of {self.capacity_bytes} bytes can be "
                "freed (the rest is pinned or in use)"
            )

    def evict(self, nbytes: int) -> int:
        """Evict LRU unlocked, unpinned leaves until ``nbytes`` are freed; returns freed."""
        with self._lock:
            freed = self._evict(nbytes)
            self._publish()
            return freed

    def clear(self) -> int:
        """Evict everything that is neither pinned nor locked. Returns bytes freed."""
        with self._lock:
            return self.evict(self.used_bytes)

    def stats(self) -> CacheStats:
        """The figures after the last change; never waits for the lock (see the module)."""
        return self._stats

    # ------------------------------------------------------------------ internals

    def _publish(self) -> None:
        """Replace the published figures (under the lock, after a change)."""
        self._stats = self._measure()

    def _publish_locks(self, turned: list[Node[P]], sign: int) -> None:
        """Publish after ``turned`` became locked (``sign`` 1) or unlocked (-1): a walk
        over one path, not the tree (a request locks and unlocks once each)."""
        stats = self._stats
        nbytes = sum(n.nbytes for n in turned)
        free = sum(n.nbytes for n in turned if n.pin_ref == 0)
        self._stats = replace(
            stats,
            locked_nodes=stats.locked_nodes + sign * len(turned),
            locked_bytes=stats.locked_bytes + sign * nbytes,
            evictable_bytes=stats.evictable_bytes - sign * free,
        )

    def _measure(self) -> CacheStats:
        """The figures now: one walk over the nodes."""
        pinned_bytes = locked_bytes = locked_nodes = pinned_tokens = evictable = 0
        nodes = self._all_nodes()
        for n in nodes:
            if n.pin_ref > 0:
                pinned_bytes += n.nbytes
                pinned_tokens += len(n.key)
            if n.lock_ref > 0:
                locked_bytes += n.nbytes
                locked_nodes += 1
            elif n.pin_ref == 0:
                evictable += n.nbytes
        return CacheStats(
            capacity_bytes=self.capacity_bytes,
            used_bytes=self.used_bytes,
            pinned_bytes=pinned_bytes,
            locked_bytes=locked_bytes,
            nodes=len(nodes),
            locked_nodes=locked_nodes,
            pinned_tokens=pinned_tokens,
            pins=len(self._pins),
            evictions=self._counters.evictions,
            evicted_bytes=self._counters.evicted_bytes,
            evicted_tokens=self._counters.evicted_tokens,
            evictable_bytes=evictable,
        )

    def _pin(self, name: str, namespace: str, tokens: Sequence[int]) -> PinRecord:
        """``pin`` under the lock (it publishes the figures afterwards)."""
        root = self._roots.get(namespace)
        if root is None or not tokens:
            raise KeyError("tokens are not cached")
        node, length = self._walk_split(root, tokens)
        if length != len(tokens) or node.is_root:
            raise KeyError("tokens are not cached")
        record = PinRecord(name, namespace, tuple(tokens), self._path_bytes(node), node)
        for n in self._path(node):
            n.pin_ref += 1
        node.pins_here.add(name)
        old = self._pins.get(name)
        self._pins[name] = record
        if old is not None:
            self._release_pin(old)
        return record

    def _lock_path(self, node: Node[P] | None) -> None:
        for n in self._path(node):
            n.lock_ref += 1

    def _unlock_path(self, node: Node[P] | None) -> None:
        for n in self._path(node):
            if n.lock_ref <= 0:
                raise RuntimeError(f"unlock of an unlocked node {n!r}")
            n.lock_ref -= 1

    def _new_id(self) -> int:
        return next(self._counters.ids)

    @staticmethod
    def _path(node: Node[P] | None) -> list[Node[P]]:
        """``node`` and its ancestors, root excluded."""
        out = []
        while node is not None and not node.is_root:
            out.append(node)
            node = node.parent
        return out

    def _path_bytes(self, node: Node[P]) -> int:
        return sum(n.nbytes for n in self._path(node))

    def _all_nodes(self) -> list[Node[P]]:
        out: list[Node[P]] = []
        stack = [c for root in self._roots.values() for c in root.children.values()]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def _walk_split(self, root: Node[P], tokens: Sequence[int]) -> tuple[Node[P], int]:
        """Follow ``tokens`` from ``root``; split the node where they diverge mid-edge.

        Returns the deepest node fully covered and the number of tokens it covers.
        """
        node, length = root, 0
        while length < len(tokens):
            child = node.children.get(tokens[length])
            if child is None:
                break
            used = common_prefix(child.key, tokens[length : length + len(child.key)])
            if used < len(child.key):
                child = self._split(child, used)
            node, length = child, length + used
        return node, length

    def _split(self, node: Node[P], at: int) -> Node[P]:
        """Cut ``node`` after ``at`` tokens; returns the new upper half.

        ``node`` itself becomes the lower half so handles to it stay valid. The two halves
        are copies made while the original still exists, so for a moment the node's bytes
        are held twice: that room is made first (``CacheFullError`` if it cannot be).
        """
        parent = node.parent
        if parent is None or node.payload is None or not 0 < at < len(node.key):
            raise RuntimeError(f"cannot split {node!r} at {at}")
        self._reserve_transient(node)
        upper = Node[P](node.key[:at], parent, self._new_id())
        upper_payload, lower_payload = self.ops.split(node.payload, at)
        upper.payload, node.payload = upper_payload, lower_payload
        upper.nbytes = self.ops.nbytes(upper_payload)
        old_bytes = node.nbytes
        node.nbytes = self.ops.nbytes(lower_payload)
        # Byte-exact payloads split without loss; anything else is a bug in PayloadOps.
        if upper.nbytes + node.nbytes != old_bytes:
            raise RuntimeError("payload split changed the byte count")
        upper.lock_ref, upper.pin_ref = node.lock_ref, node.pin_ref
        upper.last_access = node.last_access
        parent.children[upper.key[0]] = upper
        node.key = node.key[at:]
        node.parent = upper
        upper.children[node.key[0]] = node
        return upper

    def _reserve_transient(self, node: Node[P]) -> None:
        """Free ``node.nbytes`` (a split's copies) without evicting ``node`` or its path."""
        need = node.nbytes
        free = self.capacity_bytes - self.used_bytes
        if need <= free:
            return
        self._lock_path(node)
        try:
            self._evict(need - free)
        finally:
            self._unlock_path(node)
        free = self.capacity_bytes - self.used_bytes
        if need > free:
            raise CacheFullError(
                f"splitting a cached run of {len(node.key)} tokens needs {need} bytes of "
                f"temporary space; only {free} of {self.capacity_bytes} bytes are free "
                "(the rest is pinned or in use)"
            )

    def _make_room(self, tokens: int, bytes_for: Callable[[int], int]) -> int:
        """Free space for up to ``tokens`` new tokens; returns how many now fit."""
        need = bytes_for(tokens)
        free = self.capacity_bytes - self.used_bytes
        if need > free:
            self._evict(need - free)
            free = self.capacity_bytes - self.used_bytes
        if need <= free:
            return tokens
        lo, hi = 0, tokens  # largest n with bytes_for(n) <= free
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if bytes_for(mid) <= free:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _evictable(self, node: Node[P]) -> bool:
        return not node.children and node.lock_ref == 0 and node.pin_ref == 0 and not node.is_root

    def _evict(self, nbytes: int) -> int:
        heap = [(n.last_access, n.id, n) for n in self._all_nodes() if self._evictable(n)]
        heapq.heapify(heap)
        freed = 0
        while heap and freed < nbytes:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            assert parent is not None
            del parent.children[node.key[0]]
            self.used_bytes -= node.nbytes
            freed += node.nbytes
            self._counters.evictions += 1
            self._counters.evicted_bytes += node.nbytes
            self._counters.evicted_tokens += len(node.key)
            node.payload = None
            if self._evictable(parent):
                heapq.heappush(heap, (parent.last_access, parent.id, parent))
        return freed

    def _release_pin(self, record: PinRecord) -> None:
        node = record.node
        current = self._pins.get(record.name)
        # Re-pinning the same tokens under the same name puts the new record on the same
        # node: the name stays attached there.
        if current is None or current.node is not node:
            node.pins_here.discard(record.name)
        for n in self._path(node):
            n.pin_ref -= 1
