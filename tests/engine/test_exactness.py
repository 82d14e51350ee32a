"""Cache hits must not change what the model says.

Greedy output with prefix-cache hits (including hits that end inside a cached node,
and hits on KV that was produced while decoding) must equal a run without any cache,
token for token. These run in float64: there, the ~1e-7 differences that kernel
choices make in float32 (a gemv for one row vs a gemm for many) cannot flip a greedy
choice, so any difference is a real cache bug (wrong KV, wrong position, off by one).
A float32 test then bounds the numerical difference of the production dtype.
"""

from __future__ import annotations

import asyncio
import random

import pytest
import torch

from hearth_engine.config import CacheMode
from hearth_engine.sampling import SamplingParams

GREEDY = SamplingParams(max_tokens=8)


def _random_tokens(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(3, vocab) for _ in range(n)]


@pytest.mark.parametrize("share_prefix", [True, False], ids=["read-in-place", "copied"])
async def test_greedy_with_cache_hits_equals_cold_runs(
    make_engine, tiny_runner64, share_prefix: bool
) -> None:
    vocab = tiny_runner64.info.vocab_size
    warm = make_engine(runner=tiny_runner64, chunk_tokens=64, share_prefix=share_prefix)
    assert warm.kv.share_prefix is share_prefix
    cold = make_engine(runner=tiny_runner64, chunk_tokens=64, cache_mode=CacheMode.NONE)
    rng = random.Random(1234)
    hits = 0
    for _ in range(100):
        shared = _random_tokens(rng, rng.randint(1, 300), vocab)
        first = shared + _random_tokens(rng, rng.randint(1, 40), vocab)
        second = shared + _random_tokens(rng, rng.randint(1, 40), vocab)
        _, first_ids, _ = await warm.generate(first, GREEDY)
        _, warm_ids, fin = await warm.generate(second, GREEDY)
        _, cold_ids, cold_fin = await cold.generate(second, GREEDY)
        assert cold_fin.stats.cached_tokens == 0
        assert fin.stats.cached_tokens >= len(shared) - 1
        assert warm_ids == cold_ids
        hits += fin.stats.cached_tokens
        # Multi-turn: the next prompt extends the first one with its own reply, so the
        # hit covers KV that was computed one token at a time during decoding.
        follow = first + first_ids + _random_tokens(rng, rng.randint(1, 10), vocab)
        _, warm_ids, fin = await warm.generate(follow, GREEDY)
        _, cold_ids, _ = await cold.generate(follow, GREEDY)
        assert fin.stats.cached_tokens >= len(first) + len(first_ids) - 1
        assert warm_ids == cold_ids
    assert hits > 0


async def test_batched_decode_equals_one_at_a_time(make_engine, tiny_runner64) -> None:
    """Left padding and masks in a decode batch must not change any row."""
    vocab = tiny_runner64.info.vocab_size
    engine = make_engine(runner=tiny_runner64, cache_mode=CacheMode.NONE)
    rng = random.Random(99)
    prompts = [_random_tokens(rng, rng.randint(5, 120), vocab) for _ in range(6)]
    params = SamplingParams(max_tokens=24)
    alone = [(await engine.generate(p, params))[1] for p in prompts]
    together = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    assert [ids for _, ids, _ in together] == alone


async def test_batched_decode_over_different_shared_prefixes(make_engine, tiny_runner64) -> None:
    """Rows reading two different pins (and one reading none) in one decode batch."""
    vocab = tiny_runner64.info.vocab_size
    engine = make_engine(runner=tiny_runner64, chunk_tokens=64)
    cold = make_engine(runner=tiny_runner64, cache_mode=CacheMode.NONE)
    rng = random.Random(7)
    houses = [_random_tokens(rng, n, vocab) for n in (200, 130)]
    for n, house in enumerate(houses):
        await engine.pin(f"house{n}", house)
    prompts = [houses[i % 2] + _random_tokens(rng, rng.randint(1, 30), vocab) for i in range(5)]
    prompts.append(_random_tokens(rng, 50, vocab))
    params = SamplingParams(max_tokens=20)
    together = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    alone = [(await cold.generate(p, params))[1] for p in prompts]
    assert [fin.stats.cached_tokens for _, _, fin in together][:5] == [
        len(houses[i % 2]) for i in range(5)
    ]
    assert [ids for _, ids, _ in together] == alone


@pytest.mark.parametrize("read_in_place", [True, False], ids=["read-in-place", "copied"])
def test_float32_cached_prefix_matches_full_prefill(tiny_runner, read_in_place: bool) -> None:
    """Production dtype: reused KV gives the same logits up to float32 rounding."""
    rng = random.Random(5)
    tokens = _random_tokens(rng, 700, tiny_runner.info.vocab_size)
    full = tiny_runner.new_buffer(1, 800)
    expected = tiny_runner.prefill(full, tokens)
    if read_in_place:  # two cache segments, read where they are
        own = tiny_runner.new_buffer(1, 100)
        segments = [full.read_segment(0, 0, 400), full.read_segment(0, 400, 650)]
        got = tiny_runner.prefill(own, tokens[650:], segments)
        assert own.length == 50
    else:
        cached = tiny_runner.new_buffer(1, 800)
        cached.write_segment(0, 0, full.read_segment(0, 0, 650))
        cached.set_length(650)
        got = tiny_runner.prefill(cached, tokens[650:])
    assert torch.allclose(got, expected, atol=1e-4, rtol=0)
    assert int(got.argmax()) == int(expected.argmax())
