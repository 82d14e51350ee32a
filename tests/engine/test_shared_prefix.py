"""Cache hits read their prefix in place: one copy of the house prompt, however many run.

Before, every running request copied its cached prefix into its own working buffer,
and a decode batch copied them all once more: with 8 clients on a 5.4k-token house
prompt the engine grew to 5.5 GB against a 1 GB KV budget.
"""

from __future__ import annotations

import random

import pytest
import torch

from hearth_engine import attention
from hearth_engine.config import CacheMode
from hearth_engine.runner import ModelRunner
from hearth_engine.sampling import SamplingParams
from hearth_engine.sequence import Kind, Sequence


def _tokens(seed: int, n: int, vocab: int = 1000) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(n)]


def _admit(engine, prompt: list[int]) -> Sequence:
    """Admit a request on the caller's thread (the worker is not started)."""
    seq = Sequence(Kind.GENERATE, prompt, engine.namespace, SamplingParams(max_tokens=16))
    engine._admit(seq)
    return seq


def _engine_with_pin(make_engine, house: list[int], **config):
    engine = make_engine(**config)
    engine.close()  # stop the worker: the test drives admission itself
    bpt = engine.info.bytes_per_token
    engine.cache.insert(
        engine.namespace,
        house,
        lambda a, b: torch.zeros(*_segment_shape(engine, b - a)),
        lambda a, b: (b - a) * bpt,
    )
    engine.cache.pin("house", engine.namespace, house)
    return engine


def _segment_shape(engine, tokens: int) -> tuple[int, ...]:
    layout = engine.runner.layout
    return (layout.layers, 2, layout.kv_heads, tokens, layout.head_dim)


@pytest.mark.parametrize("share_prefix", [True, False])
def test_running_requests_do_not_copy_the_pinned_prefix(make_engine, share_prefix) -> None:
    house = _tokens(1, 1500)
    engine = _engine_with_pin(make_engine, house, share_prefix=share_prefix)
    bpt = engine.info.bytes_per_token
    seqs = [_admit(engine, house + _tokens(10 + i, 20)) for i in range(8)]
    working = engine._working_bytes()
    if share_prefix:
        assert all(s.shared_len == len(house) and s.own_len == 0 for s in seqs)
        # 8 requests: each holds its 20-token suffix and decode room, not the house.
        assert working < len(house) * bpt
    else:
        assert all(s.shared_len == 0 and s.own_len == len(house) for s in seqs)
        assert working >= 8 * len(house) * bpt


def test_admission_evicts_unpinned_entries_to_keep_the_budget(make_engine, tiny_runner) -> None:
    bpt = tiny_runner.info.bytes_per_token
    house = _tokens(2, 1000)
    engine = _engine_with_pin(make_engine, house, kv_cache_bytes=4000 * bpt)
    # Fill the rest of the budget with old, unpinned conversations.
    for n in range(5):
        other = _tokens(100 + n, 600)
        engine.cache.insert(
            engine.namespace,
            other,
            lambda a, b: torch.zeros(*_segment_shape(engine, b - a)),
            lambda a, b: (b - a) * bpt,
        )
    assert engine.cache.used_bytes > 3500 * bpt
    for i in range(3):
        _admit(engine, _tokens(200 + i, 400))
        used = engine.cache.used_bytes + engine._working_bytes() + engine.pool.free_bytes
        assert used <= engine.cache.capacity_bytes
    assert engine.cache.stats().evictions > 0
    assert engine.cache.contains(engine.namespace, house)  # the pin stays


def test_a_model_failing_the_self_test_copies_prefixes(monkeypatch, make_engine) -> None:
    """If merged attention ever disagreed with the model, Hearth would copy, not lie."""

    def wrong(query, *args, **kwargs):
        return torch.zeros_like(query).transpose(1, 2).contiguous()

    monkeypatch.setattr(attention, "merged_attention", wrong)
    runner = ModelRunner.load("tiny", dtype="float32")
    assert runner.shares_prefix is False
    engine = make_engine(runner=runner)
    assert engine.share_prefix is False


def test_share_prefix_is_off_without_a_cache(make_engine) -> None:
    assert make_engine(cache_mode=CacheMode.NONE).share_prefix is False
    assert make_engine().share_prefix is True
