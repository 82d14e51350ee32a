"""KV memory stays bounded: the working-buffer pool (regression: 11 GB RSS under load),
and splitting cached segments inside the radix cache's budget."""

from __future__ import annotations

import pytest
import torch

from hearth_engine.cache.radix import CacheFullError, RadixCache
from hearth_engine.model.kv import (
    BufferPool,
    KVLayout,
    segment_nbytes,
    segment_tokens,
    split_segment,
)

LAYOUT = KVLayout(layers=2, kv_heads=2, head_dim=8, dtype=torch.float32, device=torch.device("cpu"))


def test_pool_reuses_a_freed_buffer_that_fits() -> None:
    pool = BufferPool(LAYOUT)
    first = pool.buffer(rows=1, capacity=100)
    pool.release(first)
    again = pool.buffer(rows=1, capacity=90)
    assert again.storage is first.storage
    assert pool.free_bytes == 0


def test_pool_drops_the_largest_buffers_beyond_its_byte_cap() -> None:
    per_token = LAYOUT.bytes_per_token
    pool = BufferPool(LAYOUT, max_free=4, max_free_bytes=300 * per_token)
    small = [pool.buffer(rows=1, capacity=100) for _ in range(2)]
    huge = pool.buffer(rows=8, capacity=1000)  # a decode batch of long prompts
    for buffer in (*small, huge):
        pool.release(buffer)
    assert pool.free_bytes == 200 * per_token  # the huge one went, the small ones stayed
    assert pool.free_bytes <= pool.max_free_bytes


def test_pool_keeps_at_most_max_free_buffers() -> None:
    pool = BufferPool(LAYOUT, max_free=2)
    buffers = [pool.buffer(rows=1, capacity=10 * (i + 1)) for i in range(4)]
    for buffer in buffers:
        pool.release(buffer)
    assert pool.free_bytes == (30 + 40) * LAYOUT.bytes_per_token  # the two largest remain


class CheckedTensorOps:
    """The engine's tensor payload ops, checking the budget at each split."""

    def __init__(self) -> None:
        self.cache: RadixCache[torch.Tensor] | None = None

    def nbytes(self, payload: torch.Tensor) -> int:
        return segment_nbytes(payload)

    def split(self, payload: torch.Tensor, at: int) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.cache is not None
        assert self.cache.used_bytes + segment_nbytes(payload) <= self.cache.capacity_bytes
        return split_segment(payload, at)


def segment(tokens: list[int]) -> torch.Tensor:
    """A ``[L, 2, H, T, D]`` segment whose values are its token ids."""
    values = torch.tensor(tokens, dtype=LAYOUT.dtype).view(1, 1, 1, -1, 1)
    return values.expand(LAYOUT.layers, 2, LAYOUT.kv_heads, len(tokens), LAYOUT.head_dim).clone()


def tensor_cache(capacity_tokens: int) -> RadixCache[torch.Tensor]:
    ops = CheckedTensorOps()
    cache: RadixCache[torch.Tensor] = RadixCache(capacity_tokens * LAYOUT.bytes_per_token, ops)
    ops.cache = cache
    return cache


def insert(cache: RadixCache[torch.Tensor], tokens: list[int]) -> int:
    kv = segment(tokens)
    bpt = LAYOUT.bytes_per_token
    return cache.insert(
        "m", tokens, lambda a, b: kv[:, :, :, a:b].clone(), lambda a, b: (b - a) * bpt
    )


def test_splitting_a_pinned_segment_counts_its_copies() -> None:
    """Regression: a split cloned a pinned segment past the budget without counting it."""
    house = list(range(100, 160))
    cache = tensor_cache(capacity_tokens=125)
    insert(cache, house)
    cache.pin("house", "m", house)
    insert(cache, [7] * 30)  # evictable: 90 of 125 tokens in use
    cache.pin("rooms", "m", house[:20])  # the 60-token segment is copied: 30 must go
    assert cache.match("m", [7] * 30).length == 0
    match = cache.match("m", house)
    assert [segment_tokens(p) for p, _ in match.segments] == [20, 40]
    assert torch.equal(torch.cat([p for p, _ in match.segments], dim=3), segment(house))
    assert cache.used_bytes == 60 * LAYOUT.bytes_per_token


def test_a_segment_split_that_cannot_fit_is_refused() -> None:
    house = list(range(100, 160))
    cache = tensor_cache(capacity_tokens=110)
    insert(cache, house)
    cache.pin("house", "m", house)
    with pytest.raises(CacheFullError, match="temporary space"):
        cache.pin("rooms", "m", house[:20])
    assert set(cache.pins()) == {"house"}
    assert cache.stats().nodes == 1
