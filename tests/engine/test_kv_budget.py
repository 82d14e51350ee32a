"""The KV budget covers working buffers: admission reserves what a request can grow to,
a request that does not fit yet waits (first come first served), one that never could is
refused, and the engine's own accounting (``KVManager.peak_bytes``) never passes the
budget. In-process engines over ``tiny`` (1 KiB of KV a token in float32)."""

from __future__ import annotations

import asyncio
import random

import pytest

from hearth_engine.cache.budget import Demand, batch_tokens, reserved_bytes
from hearth_engine.serving.engine import NeverFitsError
from hearth_engine.serving.sampling import SamplingParams


def tokens(seed: int, n: int, vocab: int = 1000) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(n)]


def test_a_batch_reserves_its_longest_row_for_every_row_and_a_rebuild_twice() -> None:
    long, short = Demand.of(300, 200), Demand.of(10, 20)
    assert long == Demand(300 + 200 + 1, 499, 199)  # the first token needs no step
    batch = 2 * (499 + 199 + 1)
    assert batch_tokens([long, short]) == batch  # left-padded rows
    assert reserved_bytes([long, short], 0, 1) == long.buffer + short.buffer + 2 * batch
    # A batch still holding a finished row counts until it is rebuilt.
    assert reserved_bytes([short], 10**6, 1) == short.buffer + 10**6 + batch_tokens([short])
    pin = Demand.of(400, None)
    assert (pin.buffer, pin.cached, batch_tokens([pin])) == (401, 400, 0)
    assert batch_tokens([Demand.of(400, 1)]) == 0  # one token: it never decodes


async def test_long_requests_past_the_budget_wait_instead_of_passing_it(
    make_engine, tiny_runner
) -> None:
    """Regression: ``max_running`` long prompts with a large ``max_tokens`` were all
    placed at once, and their buffers and decode batch grew past the budget."""
    bpt = tiny_runner.info.bytes_per_token
    # One at a time needs 501 (prefill) + 2 x 699 (decode buffer, old and new): 1,899
    # tokens; all four at once took more than 4,600 before.
    budget = 3000 * bpt
    engine = make_engine(kv_cache_bytes=budget, max_running=4, chunk_tokens=64)
    params = SamplingParams(max_tokens=200)
    prompts = [tokens(40 + i, 300) for i in range(4)]
    results = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    assert [len(ids) for _, ids, _ in results] == [200] * 4
    assert 0 < engine.kv.peak_bytes <= budget
    assert engine.kv.working_bytes() == 0
    # Waiting for KV shows as queue time.
    assert max(fin.stats.queue_ms for _, _, fin in results) > 0


async def test_a_request_that_fits_after_others_end_waits_and_completes(
    make_engine, tiny_runner
) -> None:
    bpt = tiny_runner.info.bytes_per_token
    budget = 2500 * bpt
    engine = make_engine(kv_cache_bytes=budget, max_running=8)
    params = SamplingParams(max_tokens=100)
    first = [engine.generate(tokens(60 + i, 200), params) for i in range(3)]
    results = await asyncio.gather(*first)
    assert all(len(ids) == 100 for _, ids, _ in results)
    assert engine.kv.peak_bytes <= budget
    assert engine.kv.idle


async def test_a_request_that_could_never_fit_is_refused_at_once(make_engine, tiny_runner) -> None:
    bpt = tiny_runner.info.bytes_per_token
    engine = make_engine(kv_cache_bytes=1000 * bpt)
    with pytest.raises(NeverFitsError, match="max_tokens"):
        await engine.generate(tokens(70, 100), SamplingParams(max_tokens=2000))
    # Small requests still run at once.
    _, ids, _ = await engine.generate(tokens(71, 20), SamplingParams(max_tokens=4))
    assert len(ids) == 4
    assert engine.kv.peak_bytes <= 1000 * bpt


async def test_small_requests_are_all_admitted_at_once(make_engine) -> None:
    """With room in the budget nobody waits for KV: all run in one decode batch."""
    engine = make_engine(max_running=8)
    params = SamplingParams(max_tokens=30)
    prompts = [tokens(80 + i, 20) for i in range(8)]
    tasks = [asyncio.create_task(engine.generate(p, params)) for p in prompts]
    seen = 0
    while not all(t.done() for t in tasks):
        seen = max(seen, engine.scheduler.running)
        await asyncio.sleep(0.001)
    await asyncio.gather(*tasks)
    assert seen == 8
