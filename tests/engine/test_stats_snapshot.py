"""Stats never wait for the worker (issue 26, item 7).

``/v1/stats`` and ``/metrics`` run on the event loop. They read the figures the cache
publishes after each change and the working-buffer figures the worker publishes after
each step, never the live state under the cache lock: a scrape used to stall every
stream while the worker held that lock to copy KV, and reading a sequence's buffer
twice raced with its release (a 500).
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from hearth_engine.cache.radix import RadixCache
from hearth_engine.config import EngineConfig
from hearth_engine.model.runner import ModelRunner
from hearth_engine.server.app import create_app
from hearth_engine.serving.engine import Engine
from hearth_engine.serving.kv_manager import KVManager, KVUsage

# How long the holder keeps the lock if nobody tells it to let go: a scrape that waits
# for the lock returns only after this (and the test fails); one that does not returns
# at once and the holder lets go then.
HOLD_S = 20.0


class LockHolder:
    """Holds ``lock`` on its own thread (as the worker does while it copies KV) until
    ``release`` or ``HOLD_S``; ``released_early`` says which came first."""

    def __init__(self, lock: Any) -> None:
        self._lock = lock
        self._held = threading.Event()
        self._done = threading.Event()
        self.released_early: bool | None = None
        self._thread = threading.Thread(target=self._hold, daemon=True)

    def _hold(self) -> None:
        with self._lock:
            self._held.set()
            self.released_early = self._done.wait(HOLD_S)

    def __enter__(self) -> LockHolder:
        self._thread.start()
        self._held.wait()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


class BytesOps:
    def nbytes(self, payload: bytes) -> int:
        return len(payload)

    def split(self, payload: bytes, at: int) -> tuple[bytes, bytes]:
        return payload[:at], payload[at:]


def test_cache_stats_do_not_wait_for_its_lock() -> None:
    cache: RadixCache[bytes] = RadixCache(1000, BytesOps())
    cache.insert("m", [1, 2, 3], lambda a, b: bytes(b - a), lambda a, b: b - a)
    answers: list[int] = []
    with LockHolder(cache._lock):
        reader = threading.Thread(target=lambda: answers.append(cache.stats().used_bytes))
        reader.start()
        reader.join(HOLD_S / 2)  # a hang guard: a reader that does not wait is done at once
        answered_while_held = not reader.is_alive()
    reader.join()
    assert answered_while_held, "stats() waited for the cache lock"
    assert answers == [3]


@pytest.fixture
async def served(
    make_engine: Callable[..., Engine],
) -> AsyncIterator[tuple[Engine, TestClient[Any, Any]]]:
    engine = make_engine()
    async with TestClient(TestServer(create_app(engine))) as client:
        yield engine, client


async def test_a_scrape_does_not_wait_while_the_worker_holds_the_cache_lock(
    served: tuple[Engine, TestClient[Any, Any]],
) -> None:
    engine, client = served
    reply = await client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
    )
    assert reply.status == 200
    await engine.settled()
    used = engine.kv.cache.stats().used_bytes
    assert used > 0  # the request's KV was cached: the figures below are not all zero
    with LockHolder(engine.kv.cache._lock) as holder:
        stats = await client.get("/v1/stats")
        metrics = await client.get("/metrics")
        stats_body, metrics_text = await stats.json(), await metrics.text()
    assert holder.released_early, "a scrape waited for the worker's cache lock"
    assert stats.status == metrics.status == 200
    assert stats_body["kv_cache_used_bytes"] == used
    assert stats_body["requests_total"] == 1
    assert "hearth:kv_cache_bytes{model_name=" in metrics_text


def test_the_worker_publishes_what_stats_read(tiny_runner: ModelRunner) -> None:
    """``usage`` is what the worker published after its last step, not the live state:
    a buffer handed out or given back shows once the worker publishes again."""
    kv = KVManager(EngineConfig(model="tiny"), tiny_runner, 64 << 20, list)
    assert kv.usage == KVUsage(0, 0)
    buffer = kv.pool.buffer(rows=1, capacity=16)
    assert kv.usage.working_bytes == 0  # not published yet
    kv.publish_usage()
    assert kv.usage.working_bytes == buffer.nbytes
    kv.pool.release(buffer)
    assert kv.usage.working_bytes == buffer.nbytes
    kv.publish_usage()
    assert kv.usage == KVUsage(0, kv.pool.free_bytes)
