"""The working-buffer pool keeps memory bounded (regression: 11 GB RSS under load)."""

from __future__ import annotations

import torch

from hearth_engine.kv import BufferPool, KVLayout

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
