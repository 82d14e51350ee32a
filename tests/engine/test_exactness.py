"""Cache hits must not change what the model says.

Greedy output with prefix-cache hits (including hits that end inside a cached node,
and hits on KV that was produced while decoding) must equal a run without any cache,
token for token. These run in float64: there, the ~1e-7 differences that kernel
choices make in float32 (a gemv for one row vs a gemm for many) cannot flip a greedy
choice, so any difference is a real cache bug (wrong KV, wrong position, off by one).
Then the production dtypes, on every host: float32 bounds the logit difference, and
bfloat16 (what ``--dtype auto`` picks on most hardware) must agree with a cold run at
least as well as a cold run chunked differently does: that is the dtype's own noise.
"""

from __future__ import annotations

import asyncio
import random

import pytest
import torch

from hearth_engine.config import CacheMode
from hearth_engine.serving.sampling import SamplingParams

GREEDY = SamplingParams(max_tokens=8)


def _random_tokens(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(3, vocab) for _ in range(n)]


@pytest.mark.parametrize("forward", ["lean", "transformers"])
@pytest.mark.parametrize("share_prefix", [True, False], ids=["read-in-place", "copied"])
async def test_greedy_with_cache_hits_equals_cold_runs(
    make_engine, request: pytest.FixtureRequest, share_prefix: bool, forward: str
) -> None:
    name = "tiny_runner64" if forward == "lean" else "tiny_runner64_transformers"
    tiny_runner64 = request.getfixturevalue(name)
    assert tiny_runner64.info.forward == forward
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


def _logits(runner, tokens: list[int], chunks: list[int], shared_until: int = 0):
    """Last logits of ``tokens`` prefilled in ``chunks``; with ``shared_until``, the tokens
    before it come from a cold prefill's KV read in place (the cache-hit path)."""
    buffer = runner.new_buffer(1, len(tokens) + 1)
    segments = []
    if shared_until:
        source = runner.new_buffer(1, len(tokens) + 1)
        runner.prefill(source, tokens)
        segments = [source.read_segment(0, 0, shared_until)]
    pos = shared_until
    for n in chunks:
        logits = runner.prefill(buffer, tokens[pos : pos + n], segments)
        pos += n
    assert pos == len(tokens)
    return logits


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("read_in_place", [True, False], ids=["read-in-place", "copied"])
def test_cached_prefix_logits_within_the_dtype_noise(
    tiny_runner, tiny_runner_bf16, read_in_place: bool, dtype: str
) -> None:
    """Reused KV moves the logits no more than chunking a cold prefill differently
    (float32: by 1e-4 at most)."""
    runner = tiny_runner if dtype == "float32" else tiny_runner_bf16
    rng = random.Random(5)
    tokens = _random_tokens(rng, 700, runner.info.vocab_size)
    expected = _logits(runner, tokens, [700])
    rechunked = _logits(runner, tokens, [300, 400])
    if read_in_place:
        got = _logits(runner, tokens, [50], shared_until=650)
    else:
        cold = runner.new_buffer(1, 800)
        runner.prefill(cold, tokens)
        cached = runner.new_buffer(1, 800)
        cached.write_segment(0, 0, cold.read_segment(0, 0, 650))
        cached.set_length(650)
        got = runner.prefill(cached, tokens[650:])
    noise = float((rechunked - expected).abs().max())
    eps = torch.finfo(runner.layout.dtype).eps
    bound = 1e-4 if dtype == "float32" else 2 * noise + 4 * eps * float(expected.abs().max())
    assert float((got - expected).abs().max()) <= bound
    assert int(got.argmax()) == int(expected.argmax())


async def test_bfloat16_cache_hits_agree_as_well_as_rechunking(make_engine, tiny_runner_bf16):
    """bfloat16 cannot promise identical text, but a cache hit must not be worse than the
    rounding noise: compared with a cold run, it agrees at least as often as a cold run
    with another prefill chunk size."""
    runner = tiny_runner_bf16
    vocab = runner.info.vocab_size
    warm = make_engine(runner=runner, chunk_tokens=64)
    assert warm.kv.share_prefix is True  # the self-test accepts bfloat16
    cold = make_engine(runner=runner, chunk_tokens=64, cache_mode=CacheMode.NONE)
    other = make_engine(runner=runner, chunk_tokens=40, cache_mode=CacheMode.NONE)
    rng = random.Random(77)
    params = SamplingParams(max_tokens=16)
    agree = {"cached": 0, "rechunked": 0}
    for n in range(25):
        house = _random_tokens(rng, rng.randint(60, 300), vocab)
        prompt = house + _random_tokens(rng, rng.randint(1, 40), vocab)
        await warm.pin(f"house{n}", house)
        _, reference, _ = await cold.generate(prompt, params)
        _, rechunked, _ = await other.generate(prompt, params)
        _, cached, fin = await warm.generate(prompt, params)
        assert fin.stats.cached_tokens == len(house)
        agree["cached"] += sum(a == b for a, b in zip(reference, cached, strict=False))
        agree["rechunked"] += sum(a == b for a, b in zip(reference, rechunked, strict=False))
    assert agree["cached"] >= agree["rechunked"], agree
