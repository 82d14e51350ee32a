"""The engine: pins, eviction under pressure, persistence, cancellation, scheduling."""

from __future__ import annotations

import asyncio
import logging
import random
from pathlib import Path

import pytest

from hearth_engine.cache.radix import PinTooLargeError
from hearth_engine.server.metrics import engine_stats
from hearth_engine.serving.engine import ContextLengthError, QueueFullError
from hearth_engine.serving.sampling import SamplingParams
from hearth_engine.serving.sequence import FinishEvent, TokenEvent

GREEDY = SamplingParams(max_tokens=8)


def tokens(seed: int, n: int, vocab: int = 1000) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(n)]


def assert_baseline(engine) -> None:
    """No request holds anything: no locks, no working buffers, nothing queued."""
    stats = engine_stats(engine)
    assert stats["kv_cache_locked_nodes"] == 0
    assert stats["kv_cache_locked_bytes"] == 0
    assert stats["kv_working_bytes"] == 0
    assert stats["requests_running"] == 0
    assert stats["requests_waiting"] == 0
    assert stats["kv_cache_used_bytes"] <= stats["kv_cache_capacity_bytes"]


async def settle(engine) -> None:
    for _ in range(200):
        if not engine.busy and engine_stats(engine)["kv_working_bytes"] == 0:
            return
        await asyncio.sleep(0.01)


async def test_second_turn_reuses_first_turn_including_reply(make_engine) -> None:
    engine = make_engine()
    prompt = tokens(1, 200)
    _, reply, first = await engine.generate(prompt, GREEDY)
    assert first.stats.cached_tokens == 0
    follow = prompt + reply + tokens(2, 20)
    _, _, second = await engine.generate(follow, GREEDY)
    assert second.stats.cached_tokens >= len(prompt) + len(reply) - 1
    assert engine_stats(engine)["prefix_cache_hits_tokens"] == second.stats.cached_tokens


async def test_pin_hit_is_reported_and_counted(make_engine) -> None:
    engine = make_engine()
    house = tokens(3, 300)
    status = await engine.pin("house", house)
    assert (status.state, status.tokens, status.restored) == ("ready", 300, False)
    assert status.prefill_ms > 0
    _, _, fin = await engine.generate(house + tokens(4, 25), GREEDY)
    assert fin.stats.cached_tokens == 300
    assert fin.stats.pin == "house"
    info = engine.pin_status("house")
    assert (info["hits"], info["tokens_reused"]) == (1, 300)
    assert engine_stats(engine)["pin_rebuilds_total"] == 1


async def test_a_pin_is_cached_in_its_own_buffer_not_a_copy(make_engine) -> None:
    """A pin's working buffer becomes its cached KV: with a copy, the house was in
    memory twice at the pin's end (the engine's peak), and the buffer stayed in the
    pool after it. Later requests reuse the pool's storage and must never write into
    the pin's: their answers from it stay the same."""
    engine = make_engine()
    house = tokens(11, 300)
    await engine.pin("house", house)
    await settle(engine)
    assert engine.kv.pool.free_bytes == 0  # the pin's buffer went to the cache
    question = house + tokens(12, 20)
    _, first, _ = await engine.generate(question, GREEDY)
    for i in range(3):  # buffers of about the pin's size, from the pool
        await engine.generate(tokens(300 + i, 310), GREEDY)
    _, again, fin = await engine.generate(question, GREEDY)
    assert fin.stats.cached_tokens >= 300
    assert again == first
    # A re-pin that shares the old one's start computes only the rest: that is cached
    # in its own buffer too.
    changed = [*house[:200], *tokens(13, 150)]
    status = await engine.pin("house", changed)
    await settle(engine)
    assert status.state == "ready"
    _, _, fin = await engine.generate(changed + tokens(14, 10), GREEDY)
    assert fin.stats.cached_tokens == len(changed)
    await settle(engine)
    assert_baseline(engine)


async def test_pins_survive_pressure_and_lru_evicts_the_rest(make_engine, tiny_runner) -> None:
    bpt = tiny_runner.info.bytes_per_token
    engine = make_engine(kv_cache_bytes=1000 * bpt)
    house = tokens(5, 400)
    await engine.pin("house", house)
    for i in range(12):
        await engine.generate(tokens(100 + i, 150), GREEDY)
        stats = engine_stats(engine)
        assert stats["kv_cache_used_bytes"] <= stats["kv_cache_capacity_bytes"]
    stats = engine_stats(engine)
    assert stats["kv_cache_evictions_total"] > 0
    assert stats["kv_cache_pinned_bytes"] == 400 * bpt
    _, _, fin = await engine.generate(house + tokens(6, 10), GREEDY)
    assert fin.stats.cached_tokens == 400


async def test_pin_larger_than_budget_is_refused_and_others_stay(make_engine, tiny_runner) -> None:
    bpt = tiny_runner.info.bytes_per_token
    engine = make_engine(kv_cache_bytes=500 * bpt)
    await engine.pin("small", tokens(7, 100))
    with pytest.raises(PinTooLargeError, match="budget"):
        await engine.pin("huge", tokens(8, 600))
    assert engine.pin_names() == ["small"]
    _, _, fin = await engine.generate(tokens(7, 100) + [5, 6], GREEDY)
    assert fin.stats.cached_tokens == 100


async def test_repin_swaps_atomically_under_concurrent_requests(make_engine) -> None:
    """Requests keep hitting the old prefix until the new one is ready."""
    engine = make_engine(chunk_tokens=32)
    old = tokens(9, 300)
    await engine.pin("house", old)
    new = tokens(10, 2000)  # 63 chunks: a long warm-up
    repin = asyncio.create_task(engine.pin("house", new))
    seen_warming = False
    for i in range(30):
        _, _, fin = await engine.generate(old + tokens(200 + i, 5), SamplingParams(max_tokens=2))
        assert fin.stats.cached_tokens >= 300
        status = engine.pin_status("house")
        if status["state"] == "warming":
            seen_warming = True
            assert status["active"]["state"] == "ready"
            assert fin.stats.pin == "house"
        if repin.done():
            break
    assert seen_warming
    ready = await repin
    assert ready.state == "ready"
    _, _, fin = await engine.generate(new + [1, 2, 3], GREEDY)
    assert (fin.stats.cached_tokens, fin.stats.pin) == (2000, "house")
    assert engine_stats(engine)["kv_cache_pinned_bytes"] == 2000 * engine.info.bytes_per_token


async def test_warm_request_overtakes_a_long_pin_warm_up(make_engine) -> None:
    """Chunked prefill: a 4k-token pin does not hold a warm request back."""
    engine = make_engine(chunk_tokens=64)
    warm_prefix = tokens(11, 200)
    await engine.pin("warm", warm_prefix)
    pin = asyncio.create_task(engine.pin("big", tokens(12, 4096)))
    while (
        engine.pin_status("big") is None or engine_stats(engine)["prefill_tokens_total"] < 200 + 64
    ):
        await asyncio.sleep(0.001)
    _, _, fin = await engine.generate(warm_prefix + tokens(13, 25), SamplingParams(max_tokens=1))
    assert fin.stats.cached_tokens == 200
    assert engine.pin_status("big")["state"] == "warming"  # it overtook the 64-chunk pin
    assert (await pin).state == "ready"


async def test_pins_restore_from_store_after_restart(make_engine, tmp_path: Path) -> None:
    house = tokens(14, 500)
    first = make_engine(prefix_store=tmp_path)
    built = await first.pin("house", house)
    assert not built.restored
    await first.shutdown()
    assert len(list(tmp_path.rglob("*.safetensors"))) == 1

    second = make_engine(prefix_store=tmp_path)
    # Restored at start-up from the manifest, before any client asks.
    assert second.pin_status("house")["restored"] is True
    _, _, fin = await second.generate(house + [7, 8], GREEDY)
    assert (fin.stats.cached_tokens, fin.stats.pin) == (500, "house")
    again = await second.pin("house", house)
    assert again.state == "ready"
    assert engine_stats(second)["pin_rebuilds_total"] == 0
    assert engine_stats(second)["pin_restores_total"] == 1


async def test_corrupt_store_file_is_logged_ignored_and_rebuilt(
    make_engine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    house = tokens(15, 300)
    first = make_engine(prefix_store=tmp_path)
    await first.pin("house", house)
    await first.shutdown()
    (stored,) = tmp_path.rglob("*.safetensors")
    stored.write_bytes(stored.read_bytes()[: stored.stat().st_size // 2])  # truncated
    caplog.set_level(logging.WARNING)
    second = make_engine(prefix_store=tmp_path)
    assert second.pin_status("house") is None
    assert "Ignoring prefix store file" in caplog.text
    rebuilt = await second.pin("house", house)
    assert (rebuilt.state, rebuilt.restored) == ("ready", False)
    assert engine_stats(second)["pin_rebuilds_total"] == 1
    await second.shutdown()
    third = make_engine(prefix_store=tmp_path)
    assert third.pin_status("house")["restored"] is True


async def test_random_cancellations_leave_no_locks(make_engine) -> None:
    engine = make_engine(max_queue=256, max_running=6)
    house = tokens(20, 300)
    await engine.pin("house", house)
    baseline_used = engine_stats(engine)["kv_cache_pinned_bytes"]
    rng = random.Random(3)

    async def one(i: int) -> None:
        prompt = house + tokens(1000 + i, rng.randint(1, 80)) if i % 2 else tokens(1000 + i, 120)
        params = SamplingParams(max_tokens=rng.randint(1, 40))
        stream = engine.stream(prompt, params)
        try:
            async for event in stream:
                if isinstance(event, TokenEvent) and rng.random() < 0.2:
                    break
        finally:
            await stream.aclose()

    tasks = [asyncio.create_task(one(i)) for i in range(200)]
    await asyncio.sleep(0.05)
    for task in rng.sample(tasks, 70):
        task.cancel()  # cancelled while queued, prefilling or decoding
    await asyncio.gather(*tasks, return_exceptions=True)
    await settle(engine)
    assert_baseline(engine)
    await engine.clear_cache()
    assert engine_stats(engine)["kv_cache_used_bytes"] == baseline_used
    _, _, fin = await engine.generate(house + [1, 2], GREEDY)
    assert fin.stats.cached_tokens == 300


async def test_a_row_cancelled_between_steps_ends_alone(make_engine, monkeypatch) -> None:
    """Regression: ``Engine.cancel`` sets the flag, then posts the drop. A step that ends
    in between left the cancelled row with no token to feed, and the next step raised
    IndexError, failing every running request. Here the drop is never posted (the window
    held open): the worker drops the row itself and the other request finishes."""
    engine = make_engine()
    monkeypatch.setattr(engine, "cancel", lambda seq: setattr(seq, "cancelled", True))
    params = SamplingParams(max_tokens=40, min_tokens=40)
    other = asyncio.create_task(engine.generate(tokens(70, 30), params))
    stream = engine.stream(tokens(71, 30), params)
    async for event in stream:
        if isinstance(event, TokenEvent):
            break
    await stream.aclose()  # sets the flag only, mid-decode
    _, ids, fin = await other
    assert fin.reason == "length" and len(ids) == 40
    await settle(engine)
    assert engine_stats(engine)["requests_cancelled"] == 1
    assert engine_stats(engine)["requests_failed"] == 0


async def test_queue_full_is_refused_not_hung(make_engine) -> None:
    engine = make_engine(max_queue=2, max_running=1)
    streams = [engine.stream(tokens(30 + i, 50), SamplingParams(max_tokens=50)) for i in range(3)]
    firsts = [asyncio.create_task(s.__anext__()) for s in streams[:2]]
    await asyncio.sleep(0)
    with pytest.raises(QueueFullError):
        for _ in range(5):
            await engine.stream(tokens(40, 10), GREEDY).__anext__()
    for task in firsts:
        task.cancel()
    await asyncio.gather(*firsts, return_exceptions=True)
    for stream in streams:
        await stream.aclose()


async def test_context_limit_is_checked(make_engine) -> None:
    engine = make_engine()
    limit = engine.info.context_length
    with pytest.raises(ContextLengthError, match=str(limit)):
        await engine.stream(tokens(50, 10), SamplingParams(max_tokens=limit)).__anext__()


async def test_seeded_sampling_is_reproducible(make_engine) -> None:
    engine = make_engine()
    prompt = tokens(60, 40)
    params = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.9, seed=42)
    _, a, _ = await engine.generate(prompt, params)
    _, b, _ = await engine.generate(prompt, params)
    _, c, _ = await engine.generate(prompt, SamplingParams(max_tokens=16, temperature=1.0, seed=7))
    assert a == b
    assert a != c


async def test_stop_string_ends_generation_and_is_not_returned(make_engine) -> None:
    engine = make_engine()
    prompt = tokens(70, 30)
    text, _, fin = await engine.generate(prompt, SamplingParams(max_tokens=30))
    assert len(text) > 6
    stop = text[3:6]
    cut, _, fin = await engine.generate(prompt, SamplingParams(max_tokens=30, stop=(stop,)))
    assert fin.reason == "stop"
    assert cut == text[: text.index(stop)]


async def test_stream_yields_tokens_then_one_finish(make_engine) -> None:
    engine = make_engine()
    events = [e async for e in engine.stream(tokens(80, 20), SamplingParams(max_tokens=5))]
    assert all(isinstance(e, TokenEvent) for e in events[:-1])
    assert isinstance(events[-1], FinishEvent)
    assert events[-1].stats.completion_tokens == 5
    assert events[-1].reason == "length"


async def test_min_tokens_holds_back_the_end(make_engine) -> None:
    """``min_tokens`` (vLLM's extension): no stop token id before that many tokens."""
    engine = make_engine()
    prompt = tokens(40, 30)
    _, ids, _ = await engine.generate(prompt, SamplingParams(max_tokens=1))
    stop_here = SamplingParams(max_tokens=8, stop_token_ids=(ids[0],))
    _, first, fin = await engine.generate(prompt, stop_here)
    assert (first, fin.reason) == ([], "stop")  # the stop token itself is not returned
    held = SamplingParams(max_tokens=8, min_tokens=6, stop_token_ids=(ids[0],))
    _, longer, _ = await engine.generate(prompt, held)
    assert len(longer) >= 6
    assert ids[0] not in longer[:5]
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=2, min_tokens=3)
