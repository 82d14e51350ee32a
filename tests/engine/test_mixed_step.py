"""A decode step and a prefill chunk in one forward (WorkerLoop._mixed_forward,
LeanDecoder.forward_mixed): the weights are read once for both.

In float64 the mixed forward gives the logits the two separate forwards give (up to
the order of float sums), for decode rows that read a shared prefix in place and have
padded rows, and a chunk that follows earlier chunks. In the engine, prompts prefilled
while other requests decode run in mixed steps, and every request gets the greedy text
it gets alone.
"""

from __future__ import annotations

import asyncio
import random

import pytest
import torch

from hearth_engine.model.attention import PrefixPart
from hearth_engine.model.runner import ModelRunner
from hearth_engine.server.metrics import engine_stats
from hearth_engine.serving.sampling import SamplingParams


def tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 1000) for _ in range(n)]


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
@pytest.mark.parametrize("chunk_after", [0, 9])
def test_a_mixed_forward_gives_the_separate_forwards_logits(
    request: pytest.FixtureRequest, dtype: str, chunk_after: int
) -> None:
    """Two decode rows (one left-padded) over a shared prefix, and a 7-token chunk that
    follows ``chunk_after`` tokens of its own and reads the same prefix. In float64 up to
    the order of sums; in bfloat16 (the decode rows then go through oneDNN, not the
    decode tiles) up to its rounding."""
    fixture = "tiny_runner64" if dtype == "float64" else "tiny_runner_bf16"
    runner: ModelRunner = request.getfixturevalue(fixture)
    assert runner.can_mix
    house = runner.new_buffer(1, 20)
    runner.prefill(house, tokens(1, 20))
    segment = house.read_segment(0, 0, 20)
    part = PrefixPart(segment)

    def state() -> tuple:
        own = runner.new_buffer(1, 5)
        runner.prefill(own, tokens(2, 5), [segment])
        rows = runner.new_buffer(2, 16, length=5)  # row 0: 5 own tokens
        rows.data[:, :, :, :, :5] = own.data[:, :, :1, :, :5]
        rows.data[:, :, 1, :, :2] = 0  # row 1: its last 3, left-padded
        mask = torch.ones(2, 16, dtype=torch.bool)
        mask[1, :2] = False
        chunk = runner.new_buffer(1, 24)
        if chunk_after:
            runner.prefill(chunk, tokens(3, chunk_after), [segment])
        return rows, mask[:, :6], chunk

    ids, positions, chunk_ids = [11, 12], [25, 25], tokens(4, 7)
    rows, mask, chunk = state()
    want = runner.decode(rows, ids, positions, mask, [part])
    want_chunk = runner.prefill(chunk, chunk_ids, [segment])
    rows, mask, chunk = state()
    got, got_chunk = runner.mixed(rows, ids, positions, mask, [part], chunk, chunk_ids, [segment])
    tolerance = 1e-9 if dtype == "float64" else 0.05 * float(want.abs().max())
    torch.testing.assert_close(got, want, atol=tolerance, rtol=0)
    torch.testing.assert_close(got_chunk, want_chunk, atol=tolerance, rtol=0)
    if dtype == "float64":
        assert torch.equal(got.argmax(-1), want.argmax(-1))
    assert rows.length == 6 and chunk.length == chunk_after + 7


async def test_prompts_prefilled_while_others_decode_run_in_mixed_steps(
    make_engine, tiny_runner64: ModelRunner
) -> None:
    engine = make_engine(tiny_runner64, chunk_tokens=16)
    params = SamplingParams(max_tokens=24)
    prompts = [tokens(10, 40), tokens(11, 70), tokens(12, 55)]
    alone = [(await engine.generate(p, params))[1] for p in prompts]
    await engine.clear_cache()
    before = engine_stats(engine)["mixed_steps_total"]

    # Together: one prefill chunk a step, so the first to finish its prompt decodes
    # while the others still prefill.
    together = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    assert [ids for _, ids, _ in together] == alone
    assert engine_stats(engine)["mixed_steps_total"] > before
