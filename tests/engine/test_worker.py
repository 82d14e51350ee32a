"""The worker thread: no failure hangs a waiter, and only the worker changes the cache.

Regression tests for issue 11's bugs 1-5, driven through the engine's public API (the
scheduler is not started by hand). Faults are injected by wrapping one method of a real
component (a store read, a buffer allocation): that is the only way to make them happen
on demand.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hearth_engine.server.metrics import engine_stats
from hearth_engine.serving.engine import Engine, EngineFailedError
from hearth_engine.serving.sampling import SamplingParams
from hearth_engine.serving.sequence import ErrorEvent, FinishEvent, Kind

from .test_engine import GREEDY, assert_baseline, settle, tokens

BOUND_S = 20.0  # a test that would hang fails after this instead


async def bounded(awaitable: Any) -> Any:
    return await asyncio.wait_for(awaitable, BOUND_S)


async def events_of(engine: Engine, prompt: list[int], params: SamplingParams = GREEDY) -> list:
    async def collect() -> list:
        return [event async for event in engine.stream(prompt, params)]

    return await bounded(collect())


def fail_once(target: object, name: str, error: BaseException) -> list[int]:
    """Make ``target.name`` raise ``error`` on its first call; returns the call counter."""
    original = getattr(target, name)
    calls = [0]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1:
            raise error
        return original(*args, **kwargs)

    setattr(target, name, wrapper)
    return calls


# ---------------------------------------------------------------- bug 1: inbox commands


async def test_a_failing_pin_command_fails_that_pin_and_the_engine_serves_on(
    make_engine, tmp_path: Path
) -> None:
    """A store read that raises (as a garbage header length did: OverflowError) used to
    kill the worker: the PUT and every later request hung while /health said ok."""
    engine = make_engine(prefix_store=tmp_path)
    assert engine.pins.store is not None
    fail_once(engine.pins.store, "load_prefix", OverflowError("cannot fit 'int' into an index"))
    status = await bounded(engine.pin("house", tokens(1, 300)))
    assert status.state == "failed"
    assert "OverflowError" in (status.error or "")
    assert engine.alive
    _, _, fin = await bounded(engine.generate(tokens(2, 20), GREEDY))
    assert fin.reason in ("stop", "length")
    again = await bounded(engine.pin("house", tokens(1, 300)))
    assert again.state == "ready"


async def test_a_dead_worker_fails_waiters_and_refuses_new_work(make_engine) -> None:
    """Nothing waits forever: a worker that dies fails the waiting requests and pins."""
    engine = make_engine()
    started = threading.Event()
    original_plan = engine.scheduler.plan

    def broken_plan() -> Any:
        if any(s.kind is Kind.GENERATE for s in engine.scheduler.all()):
            started.set()
            raise SystemExit("simulated bug in the loop itself")
        return original_plan()

    engine.scheduler.plan = broken_plan  # type: ignore[method-assign]
    events = await events_of(engine, tokens(3, 20))
    assert started.is_set()
    assert isinstance(events[-1], ErrorEvent)
    assert "stopped" in events[-1].message or "internal" in events[-1].message
    assert not engine.alive
    with pytest.raises(EngineFailedError):
        await bounded(engine.generate(tokens(4, 20), GREEDY))
    with pytest.raises(EngineFailedError):
        await bounded(engine.pin("late", tokens(5, 50)))


# ---------------------------------------------------------------- bug 2: admission


async def test_a_failing_admission_fails_only_its_request_and_leaves_no_lock(
    make_engine,
) -> None:
    """Allocation failing at admission (out of memory) used to lose the requests popped
    for that step and keep the matched cache node locked for ever."""
    engine = make_engine()
    house = tokens(6, 400)
    await engine.pin("house", house)
    calls = fail_once(engine.kv.pool, "buffer", MemoryError("simulated out of memory"))
    results = await asyncio.gather(
        *(events_of(engine, house + tokens(10 + i, 12)) for i in range(4))
    )
    finals = [r[-1] for r in results]
    assert sum(isinstance(e, ErrorEvent) for e in finals) == 1
    assert sum(isinstance(e, FinishEvent) and e.reason != "cancelled" for e in finals) == 3
    assert calls[0] >= 4
    await settle(engine)
    assert_baseline(engine)
    assert engine_stats(engine)["requests_failed"] == 1


# ---------------------------------------------------------------- bug 3: scheduling order


def record_prefills(engine: Engine, log: list[tuple[str, int]]) -> None:
    """Log ("enqueue", kind) and ("prefill", n tokens) events in worker order."""
    runner, scheduler = engine.runner, engine.scheduler
    prefill, enqueue = runner.prefill, scheduler.enqueue

    def logged_prefill(cache: Any, ids: list[int], *cached: Any) -> Any:
        running = [s for s in scheduler.prefilling if s.kv is cache]
        kind = running[0].kind.value if running else "?"
        log.append((f"prefill:{kind}", len(ids)))
        return prefill(cache, ids, *cached)

    def logged_enqueue(seq: Any) -> None:
        log.append((f"enqueue:{seq.kind.value}", len(seq.prompt)))
        enqueue(seq)

    engine.runner.prefill = logged_prefill  # type: ignore[method-assign]
    scheduler.enqueue = logged_enqueue  # type: ignore[method-assign]


@pytest.fixture
def restore_runner(tiny_runner) -> Any:
    prefill = tiny_runner.prefill
    yield
    tiny_runner.prefill = prefill


async def wait_for(predicate: Callable[[], bool]) -> None:
    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.002)

    await bounded(poll())


async def test_a_request_during_a_lone_pin_warm_up_goes_first(make_engine, restore_runner) -> None:
    """It used to wait for one whole pin chunk: planning ran before its admission."""
    engine = make_engine(chunk_tokens=256)
    log: list[tuple[str, int]] = []
    record_prefills(engine, log)
    pin = asyncio.ensure_future(engine.pin("house", tokens(7, 6000)))
    await wait_for(lambda: any(e[0] == "prefill:pin" for e in log))
    await bounded(engine.generate(tokens(8, 30), SamplingParams(max_tokens=1)))
    first = log.index(("enqueue:generate", 30))
    after = [e[0] for e in log[first + 1 :]]
    assert after[0] == "prefill:generate", log[first - 1 : first + 4]
    assert (await bounded(pin)).state == "ready"


async def test_followers_of_a_warming_pin_do_not_shrink_its_chunks(
    make_engine, restore_runner
) -> None:
    """Eight requests waiting for a pin's prefix used to cut it to 32-token chunks."""
    engine = make_engine(chunk_tokens=256, max_running=8)
    log: list[tuple[str, int]] = []
    record_prefills(engine, log)
    house = tokens(9, 3000)
    pin = asyncio.ensure_future(engine.pin("house", house))
    await wait_for(lambda: any(e[0] == "prefill:pin" for e in log))
    followers = [
        asyncio.ensure_future(engine.generate(house + tokens(20 + i, 10), GREEDY)) for i in range(9)
    ]
    await wait_for(lambda: sum(e[0] == "enqueue:generate" for e in log) == 9)
    assert (await bounded(pin)).state == "ready"
    results = await bounded(asyncio.gather(*followers))
    assert all(fin.stats.cached_tokens >= len(house) for _, _, fin in results)
    enqueued = max(i for i, e in enumerate(log) if e[0] == "enqueue:generate")
    pin_chunks = [n for kind, n in log[enqueued:] if kind == "prefill:pin"]
    assert pin_chunks, log
    assert all(n == 256 for n in pin_chunks[:-1]), pin_chunks


# ---------------------------------------------------------------- bug 4: one cache owner


async def test_only_the_worker_changes_the_cache(make_engine) -> None:
    """clear_cache and cancel used to change the cache from the event loop's thread
    while the worker was between a match and its lock."""
    engine = make_engine()
    cache = engine.kv.cache
    threads: set[str] = set()
    for name in ("lock", "unlock", "insert", "evict", "clear", "pin", "unpin"):
        original = getattr(cache, name)

        def wrapper(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            threads.add(threading.current_thread().name)
            return _original(*args, **kwargs)

        setattr(cache, name, wrapper)
    house = tokens(11, 300)
    await bounded(engine.pin("house", house))
    stream = engine.stream(house + tokens(12, 5), SamplingParams(max_tokens=50))
    async for _event in stream:
        break  # leave early: the request is cancelled
    await stream.aclose()
    await bounded(engine.generate(house + tokens(13, 5), GREEDY))
    assert await bounded(engine.clear_cache()) >= 0
    engine.unpin("house")
    await settle(engine)
    assert threads == {"hearth-engine"}
    assert_baseline(engine)


# ---------------------------------------------------------------- bug 5: manifest order


async def test_the_last_manifest_written_is_the_newest_state(make_engine, tmp_path: Path) -> None:
    """A pin snapshot taken on the event loop could be written after a newer one from
    the worker: the manifest lost a live pin and its file was pruned."""
    engine = make_engine(prefix_store=tmp_path)
    await bounded(engine.pin("old", tokens(14, 200)))
    cache = engine.kv.cache
    original = cache.pins
    main = threading.current_thread()
    slow = threading.Event()

    def pins() -> Any:
        result = original()
        if slow.is_set() and threading.current_thread() is main:
            slow.clear()
            # Hold this snapshot while the worker activates "new" and writes its own.
            for _ in range(2000):
                if "new" in original():
                    break
                threading.Event().wait(0.005)
        return result

    cache.pins = pins  # type: ignore[method-assign]
    new = await engine.pin("new", tokens(15, 300), wait=False)
    slow.set()
    engine.unpin("old")
    slow.clear()
    assert (await bounded(engine.pins.wait(new))).state == "ready"
    await settle(engine)
    await asyncio.get_running_loop().run_in_executor(None, engine.pins.flush, BOUND_S)
    assert engine.pins.store is not None
    names = [e.name for e in engine.pins.store.read_manifest(engine.namespace)]
    assert names == ["new"]
    engine.close()
    restarted = make_engine(prefix_store=tmp_path)
    assert restarted.pin_status("new")["restored"] is True


# ---------------------------------------------------------------- bug 6: copies of a pin


async def test_a_pin_is_saved_from_the_cache_without_another_copy(
    make_engine, tmp_path: Path
) -> None:
    """Completing a pin used to build one more contiguous copy of its KV to save it."""
    engine = make_engine(prefix_store=tmp_path)
    store = engine.pins.store
    assert store is not None
    saved: list[Any] = []
    original = store.save

    def spy(namespace: str, tokens: list[int], kv: Any, *rest: Any) -> bool:
        saved.append(kv)
        return original(namespace, tokens, kv, *rest)

    store.save = spy  # type: ignore[method-assign]
    house = tokens(16, 500)
    await bounded(engine.generate(house[:200] + [5], GREEDY))  # cache a part first
    assert (await bounded(engine.pin("house", house))).state == "ready"
    engine.pins.flush(BOUND_S)
    (pieces,) = saved
    payloads = {
        segment.untyped_storage().data_ptr()
        for segment in engine.kv.segments(engine.namespace, house) or []
    }
    assert len(pieces) >= 2  # the cached part and the new part
    assert {p.untyped_storage().data_ptr() for p in pieces} <= payloads
    assert sum(p.shape[3] for p in pieces) == len(house)
