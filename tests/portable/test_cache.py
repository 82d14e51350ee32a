"""The radix cache bookkeeping, without torch.

Payloads here are the token ids themselves, so every test can check that the KV a match
returns is exactly the KV of the tokens asked for (a wrong split or a stale payload shows
up as wrong tokens).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hearth_engine.cache.radix import CacheFullError, RadixCache, common_prefix

BPT = 10  # bytes per token


class TokenOps:
    """Payload = the tuple of token ids it stands for."""

    def nbytes(self, payload: tuple[int, ...]) -> int:
        return len(payload) * BPT

    def split(self, payload: tuple[int, ...], at: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return payload[:at], payload[at:]


class BudgetCheckingOps(TokenOps):
    """TokenOps that checks, at each split, that the copies it makes fit the budget."""

    def __init__(self) -> None:
        self.cache: RadixCache[tuple[int, ...]] | None = None
        self.splits = 0

    def split(self, payload: tuple[int, ...], at: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        assert self.cache is not None
        # The original is alive until the halves replace it: both count for a moment.
        transient = self.nbytes(payload)
        assert self.cache.used_bytes + transient <= self.cache.capacity_bytes
        self.splits += 1
        return super().split(payload, at)


def make(capacity_tokens: int = 1000) -> RadixCache[tuple[int, ...]]:
    ops = BudgetCheckingOps()
    cache: RadixCache[tuple[int, ...]] = RadixCache(capacity_tokens * BPT, ops)
    ops.cache = cache
    return cache


def insert(cache: RadixCache[tuple[int, ...]], tokens: list[int], ns: str = "m") -> int:
    return cache.insert(ns, tokens, lambda a, b: tuple(tokens[a:b]), lambda a, b: (b - a) * BPT)


def matched_tokens(match) -> list[int]:
    out: list[int] = []
    for payload, used in match.segments:
        out.extend(payload[:used])
    return out


def test_match_returns_the_exact_tokens_of_the_longest_prefix() -> None:
    cache = make()
    insert(cache, [1, 2, 3, 4, 5])
    insert(cache, [1, 2, 3, 9, 9])
    m = cache.match("m", [1, 2, 3, 4, 7])
    assert m.length == 4
    assert matched_tokens(m) == [1, 2, 3, 4]
    # A hit that ends inside a node (no split on read).
    m = cache.match("m", [1, 2])
    assert (m.length, matched_tokens(m)) == (2, [1, 2])
    assert cache.match("m", [7]).length == 0


def test_namespaces_never_share_state() -> None:
    cache = make()
    insert(cache, [1, 2, 3], ns="model-a:float32")
    assert cache.match("model-b:float32", [1, 2, 3]).length == 0
    assert cache.match("model-a:bfloat16", [1, 2, 3]).length == 0
    assert cache.match("model-a:float32", [1, 2, 3]).length == 3


def test_budget_is_exact_and_lru_leaf_is_evicted_first() -> None:
    cache = make(capacity_tokens=10)
    insert(cache, [1, 1, 1, 1])
    insert(cache, [2, 2, 2, 2])
    cache.match("m", [1, 1, 1, 1])  # touch: [2, ...] is now least recently used
    assert insert(cache, [3, 3, 3, 3]) == 4
    assert cache.used_bytes <= cache.capacity_bytes
    assert cache.match("m", [2, 2, 2, 2]).length == 0
    assert cache.match("m", [1, 1, 1, 1]).length == 4
    assert cache.stats().evictions == 1
    assert cache.stats().evicted_bytes == 4 * BPT


def test_locked_nodes_are_never_evicted() -> None:
    cache = make(capacity_tokens=8)
    insert(cache, [1, 1, 1, 1])
    m = cache.match("m", [1, 1, 1, 1])
    cache.lock(m.node)
    assert insert(cache, [2, 2, 2, 2, 2, 2]) == 4  # only what fits is inserted
    assert cache.match("m", [1, 1, 1, 1]).length == 4
    cache.unlock(m.node)
    assert insert(cache, [3, 3, 3, 3, 3, 3]) == 6
    assert cache.used_bytes <= cache.capacity_bytes


def test_unlocked_node_keeps_its_identity_and_payload() -> None:
    """nano-vllm's late fix: a freed block that is still cached must keep its hash/KV."""
    cache = make()
    insert(cache, [5, 6, 7, 8])
    first = cache.match("m", [5, 6, 7, 8])
    cache.lock(first.node)
    cache.unlock(first.node)
    insert(cache, [9, 9])  # unrelated activity after the release
    again = cache.match("m", [5, 6, 7, 8])
    assert again.node is first.node
    assert matched_tokens(again) == [5, 6, 7, 8]


def test_split_keeps_lock_handles_valid() -> None:
    cache = make()
    insert(cache, [1, 2, 3, 4, 5, 6])
    m = cache.match("m", [1, 2, 3, 4, 5, 6])
    cache.lock(m.node)
    insert(cache, [1, 2, 3, 9])  # splits the locked node after 3 tokens
    assert matched_tokens(cache.match("m", [1, 2, 3, 4, 5, 6])) == [1, 2, 3, 4, 5, 6]
    cache.unlock(m.node)
    assert cache.stats().locked_nodes == 0


def test_pin_survives_pressure_and_over_budget_pin_is_refused() -> None:
    cache = make(capacity_tokens=10)
    insert(cache, [1, 2, 3, 4, 5, 6])
    cache.pin("house", "m", [1, 2, 3, 4, 5, 6])
    for i in range(20):
        insert(cache, [100 + i, 1, 1, 1])
        assert cache.used_bytes <= cache.capacity_bytes
    assert cache.match("m", [1, 2, 3, 4, 5, 6]).length == 6
    with pytest.raises(CacheFullError):
        cache.check_fits(11 * BPT)
    assert cache.pins()["house"].tokens == (1, 2, 3, 4, 5, 6)


def test_repin_swaps_atomically_and_releases_the_old_path() -> None:
    cache = make(capacity_tokens=20)
    insert(cache, [1, 2, 3, 4])
    cache.pin("house", "m", [1, 2, 3, 4])
    insert(cache, [1, 2, 7, 7])
    cache.pin("house", "m", [1, 2, 7, 7])
    stats = cache.stats()
    assert stats.pins == 1
    assert stats.pinned_tokens == 4  # [1,2] shared + [7,7]
    cache.clear()
    assert cache.match("m", [1, 2, 3, 4]).length == 2  # the old tail was evictable
    assert cache.match("m", [1, 2, 7, 7]).length == 4


def test_pin_name_points_at_the_matched_pin() -> None:
    cache = make()
    insert(cache, [1, 2, 3, 4, 5])
    cache.pin("house", "m", [1, 2, 3])
    assert cache.match("m", [1, 2, 3, 4]).pin == "house"
    assert cache.match("m", [1, 2]).pin is None


def test_unlock_twice_is_an_error() -> None:
    cache = make()
    insert(cache, [1, 2])
    m = cache.match("m", [1, 2])
    cache.lock(m.node)
    cache.unlock(m.node)
    with pytest.raises(RuntimeError):
        cache.unlock(m.node)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), min_size=1, max_size=30),
    st.integers(4, 60),
)
def test_any_insert_sequence_keeps_matches_exact_and_budget(
    seqs: list[list[int]], cap: int
) -> None:
    cache = make(capacity_tokens=cap)
    for seq in seqs:
        insert(cache, seq)
        assert cache.used_bytes <= cache.capacity_bytes
    stats = cache.stats()
    assert stats.used_bytes == cache.used_bytes
    for seq in seqs:
        m = cache.match("m", seq)
        assert matched_tokens(m) == seq[: m.length]


class CacheMachine(RuleBasedStateMachine):
    """Random inserts, matches, locks, pins and evictions against simple invariants."""

    def __init__(self) -> None:
        super().__init__()
        self.cache = make(capacity_tokens=40)
        self.locks: list = []
        self.pinned: dict[str, list[int]] = {}
        self.rng = random.Random(0)

    seqs = st.lists(st.integers(0, 4), min_size=1, max_size=10)

    @rule(seq=seqs)
    def insert(self, seq: list[int]) -> None:
        insert(self.cache, seq)

    @rule(seq=seqs)
    def match_and_lock(self, seq: list[int]) -> None:
        m = self.cache.match("m", seq)
        assert matched_tokens(m) == seq[: m.length]
        if m.node is not None:
            self.cache.lock(m.node)
            self.locks.append((m.node, matched_tokens(m)))

    @precondition(lambda self: self.locks)
    @rule(data=st.data())
    def unlock(self, data: st.DataObject) -> None:
        node, _ = self.locks.pop(data.draw(st.integers(0, len(self.locks) - 1)))
        self.cache.unlock(node)

    @rule(seq=seqs, name=st.sampled_from(["a", "b"]))
    def pin(self, seq: list[int], name: str) -> None:
        if insert(self.cache, seq) == len(seq):
            try:
                self.cache.pin(name, "m", seq)
            except CacheFullError:  # it ends inside a node there is no room to split
                assert (name in self.cache.pins()) == (name in self.pinned)  # unchanged
                return
            self.pinned[name] = seq

    @rule(name=st.sampled_from(["a", "b"]))
    def unpin(self, name: str) -> None:
        if name in self.pinned:
            self.cache.unpin(name)
            del self.pinned[name]

    @rule(n=st.integers(0, 400))
    def evict(self, n: int) -> None:
        self.cache.evict(n)

    @invariant()
    def budget_and_residency(self) -> None:
        stats = self.cache.stats()
        assert 0 <= stats.used_bytes <= stats.capacity_bytes
        for seq in self.pinned.values():
            assert self.cache.match("m", seq).length == len(seq)
        for node, tokens in self.locks:
            assert node.payload is not None  # locked nodes are never evicted
            assert matched_tokens(self.cache.match("m", tokens)) == tokens

    @invariant()
    def published_stats_are_current(self) -> None:
        """What ``stats`` returns without the lock equals a fresh walk of the tree."""
        assert self.cache.stats() == self.cache._measure()

    def teardown(self) -> None:
        for node, _ in self.locks:
            self.cache.unlock(node)
        assert self.cache.stats().locked_nodes == 0


TestCacheMachine = CacheMachine.TestCase
TestCacheMachine.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)


def test_split_makes_room_for_its_copies_first() -> None:
    """Regression: splitting a pinned node cloned it without counting the bytes."""
    cache = make(capacity_tokens=13)
    insert(cache, [1, 2, 3, 4, 5, 6])
    cache.pin("house", "m", [1, 2, 3, 4, 5, 6])
    insert(cache, [9, 9, 9])  # an unpinned, unlocked leaf: 9 of 13 tokens used
    cache.pin("short", "m", [1, 2, 3])  # splits the 6-token node: 6 tokens of copies
    assert cache.match("m", [9, 9, 9]).length == 0  # evicted to make that room
    assert matched_tokens(cache.match("m", [1, 2, 3, 4, 5, 6])) == [1, 2, 3, 4, 5, 6]
    assert cache.used_bytes == 6 * BPT


def test_split_without_room_is_refused_and_changes_nothing() -> None:
    cache = make(capacity_tokens=12)
    insert(cache, [1, 2, 3, 4, 5, 6])
    cache.pin("house", "m", [1, 2, 3, 4, 5, 6])
    insert(cache, [7, 7, 7])
    m = cache.match("m", [7, 7, 7])
    cache.lock(m.node)  # 9 of 12 tokens in use, nothing evictable: 3 free, 6 needed
    with pytest.raises(CacheFullError, match="splitting a cached run of 6 tokens"):
        cache.pin("short", "m", [1, 2, 3])
    assert "short" not in cache.pins()
    assert cache.stats().nodes == 2
    # insert cannot split either: nothing new goes in, and it says what is cached.
    assert insert(cache, [1, 2, 3, 8]) == 3
    assert insert(cache, [1, 2, 3]) == 3
    assert cache.stats().nodes == 2
    assert cache.used_bytes == 9 * BPT
    cache.unlock(m.node)
    assert insert(cache, [1, 2, 3, 8]) == 4  # the leaf is evictable now: room to split


def naive_common_prefix(a: list[int], b: list[int]) -> int:
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    return i


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 3), max_size=40),
    st.lists(st.integers(0, 3), max_size=40),
    st.integers(0, 40),
)
def test_common_prefix_agrees_with_a_plain_loop(a: list[int], b: list[int], shared: int) -> None:
    b = a[:shared] + b  # make long shared runs likely
    assert common_prefix(a, b) == naive_common_prefix(a, b)
    assert common_prefix(tuple(a), b) == naive_common_prefix(a, b)
    assert common_prefix(b, tuple(a)) == naive_common_prefix(a, b)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=12), min_size=1, max_size=12),
    st.lists(st.integers(0, 2), max_size=16),
    st.integers(0, 16),
)
def test_match_agrees_with_a_plain_prefix_search(
    seqs: list[list[int]], query: list[int], limit: int
) -> None:
    cache = make()
    for seq in seqs:
        insert(cache, seq)
    best = max(naive_common_prefix(seq, query[:limit]) for seq in seqs)
    m = cache.match("m", query, max_tokens=limit)
    assert m.length == best
    assert matched_tokens(m) == query[:best]
