"""Cached against cold generation: the exactness check that the layer-type tests share."""

from __future__ import annotations

import random
from typing import Any

from hearth_engine.serving.engine import Engine
from hearth_engine.serving.sampling import SamplingParams


def tokens(rng: random.Random, n: int) -> list[int]:
    """``n`` random ids the tiny tokenizer knows (above its special tokens)."""
    return [rng.randrange(3, 1000) for _ in range(n)]


async def generate_both(
    warm: Engine, cold: Engine, prompt: list[int], params: SamplingParams
) -> tuple[list[int], Any]:
    """Generate ``prompt`` on the caching engine and on a cold one, assert that the token
    ids are equal, and return the cached run's ids and finish event."""
    _, warm_ids, fin = await warm.generate(prompt, params)
    _, cold_ids, _ = await cold.generate(prompt, params)
    assert warm_ids == cold_ids, len(prompt)
    return warm_ids, fin
