"""Jump-forward decoding: tokens a grammar forces get no decode step of their own.

After ``<tool_call>`` the grammar allows only ``{"name": "``; once a tool's name is
chosen, ``", "arguments": {`` and any required key follow. The engine appends such
tokens at once (``Constraint.forced``) and feeds them in one forward when the request
decodes alone (``DecodeBatch.extend``), or one a step beside other rows.

In float64 (rounding far below any logit gap) the replies are what step-by-step greedy
decoding gives for the same tokens: every token the model chose is the masked argmax of
a cold forward over everything before it, so the KV the forced tokens got is right.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest
import torch

from hearth_engine.chat.formatter import ToolFormat
from hearth_engine.constraints.compiler import ConstraintCompiler
from hearth_engine.constraints.grammar import ConstraintRequest
from hearth_engine.constraints.mask import Masker
from hearth_engine.model.runner import ModelRunner
from hearth_engine.server.metrics import engine_stats
from hearth_engine.serving.sampling import SamplingParams

from .constrained import TOOLS, call_errors

pytest.importorskip("llguidance")

FORCED = "<tool_call>\n"  # what tool_choice "required" puts after the generation prompt
REQUIRED = ConstraintRequest(tools=tuple(TOOLS), tool_choice="required", parallel_tool_calls=False)


@pytest.fixture(scope="module")
def compiler(tiny_runner64: ModelRunner) -> ConstraintCompiler:
    tokenizer = tiny_runner64.tokenizer
    return ConstraintCompiler(
        tokenizer, len(tokenizer), [tokenizer.eos_token_id], ToolFormat.HERMES
    )


def prompt(runner: ModelRunner, seed: int) -> list[int]:
    rng = random.Random(seed)
    words = " ".join(
        rng.choice(["kitchen", "light", "turn", "on", "mode", "eco"]) for _ in range(30)
    )
    return runner.tokenizer.encode(words + "\n" + FORCED, add_special_tokens=False)


def call_of(runner: ModelRunner, ids: list[int]) -> tuple[str, str]:
    """The one call a reply after ``FORCED`` makes: (name, arguments JSON)."""
    body = json.loads(runner.tokenizer.decode(ids).removesuffix("\n</tool_call>"))
    return body["name"], json.dumps(body["arguments"])


def replay(
    runner: ModelRunner, compiler: ConstraintCompiler, prompt_ids: list[int], ids: list[int]
) -> int:
    """Check ``ids`` token by token against cold forwards; returns how many were forced
    (as the engine counts them: its first token comes from the prompt's logits)."""
    constraint = compiler.start(REQUIRED, FORCED)
    assert constraint is not None
    masker = Masker(runner.info.vocab_size)
    forced, i = 0, 0
    while i < len(ids):
        ahead = constraint.forced() if i else []
        if ahead:
            assert ids[i : i + len(ahead)] == ahead
            assert all(constraint.advance(t) for t in ahead)
            forced += len(ahead)
            i += len(ahead)
            continue
        context = prompt_ids + ids[:i]
        cache = runner.new_buffer(1, len(context) + 1)
        logits = runner.prefill(cache, context)
        masker.apply(logits, [constraint])
        assert int(logits.argmax()) == ids[i], f"token {i} is not the greedy choice"
        assert constraint.advance(ids[i])
        i += 1
    return forced


async def test_forced_tokens_are_appended_and_fed_in_one_forward(
    make_engine: Any, tiny_runner64: ModelRunner, compiler: ConstraintCompiler
) -> None:
    engine = make_engine(tiny_runner64)
    params = SamplingParams(max_tokens=60)
    for seed in range(4):
        before = engine_stats(engine)
        ids_in = prompt(tiny_runner64, seed)
        _, ids, finish = await engine.generate(
            ids_in, params, constraint=compiler.start(REQUIRED, FORCED)
        )
        assert finish.reason == "stop"
        assert call_errors(*call_of(tiny_runner64, ids)) == []
        forced = replay(tiny_runner64, compiler, ids_in, ids)
        stats = engine_stats(engine)
        assert forced >= 4  # {"name": " at least
        assert stats["forced_tokens_total"] - before["forced_tokens_total"] == forced
        assert stats["extend_steps_total"] > before["extend_steps_total"]
        steps = stats["decode_steps_total"] - before["decode_steps_total"]
        assert steps <= len(ids) - forced  # one step per token the model chose, at most


async def test_beside_other_rows_forced_tokens_take_a_step_each_and_give_the_same_reply(
    make_engine: Any, tiny_runner64: ModelRunner, compiler: ConstraintCompiler
) -> None:
    engine = make_engine(tiny_runner64)
    params = SamplingParams(max_tokens=60)
    prompts = [prompt(tiny_runner64, seed) for seed in (10, 11, 12)]

    async def run(ids: list[int]) -> list[int]:
        return (await engine.generate(ids, params, constraint=compiler.start(REQUIRED, FORCED)))[1]

    alone = [await run(p) for p in prompts]
    await engine.clear_cache()
    together = await asyncio.gather(*(run(p) for p in prompts))
    assert list(together) == alone


async def test_without_jump_forward_every_token_takes_a_step(
    make_engine: Any, tiny_runner64: ModelRunner, compiler: ConstraintCompiler
) -> None:
    engine = make_engine(tiny_runner64, jump_forward=False)
    _, ids, _ = await engine.generate(
        prompt(tiny_runner64, 3),
        SamplingParams(max_tokens=60),
        constraint=compiler.start(REQUIRED, FORCED),
    )
    stats = engine_stats(engine)
    assert call_errors(*call_of(tiny_runner64, ids)) == []
    assert stats["forced_tokens_total"] == 0 and stats["extend_steps_total"] == 0
    assert stats["decode_steps_total"] == len(ids) - 1  # the first came from the prefill


def test_extend_gives_the_logits_of_one_step_a_token(tiny_runner64: ModelRunner) -> None:
    """The forward ``extend`` runs (a prefill chunk onto a decoding row's own buffer,
    after a prefix read in place) against decode steps of the same tokens."""
    runner = tiny_runner64
    house = runner.new_buffer(1, 24)
    runner.prefill(house, list(range(5, 29)))
    segment = house.read_segment(0, 0, 24)
    shared, window = runner.as_cached(segment)
    tokens = [40, 41, 42, 43, 44]

    def own() -> Any:
        cache = runner.new_buffer(1, 16)
        runner.prefill(cache, [30, 31, 32], shared, window)
        return cache

    stepped = own()
    parts = runner.prefix_parts(shared, window)
    for k, token in enumerate(tokens):
        want = runner.decode(stepped, [token], [27 + k], None, parts)[0]
    extended = own()
    got = runner.prefill(extended, tokens, shared, window)
    torch.testing.assert_close(got, want, atol=1e-9, rtol=0)
    assert extended.length == stepped.length == 8


async def test_forced_tokens_are_fed_a_chunk_at_a_time(
    make_engine: Any, tiny_runner64: ModelRunner, compiler: ConstraintCompiler
) -> None:
    """A grammar may force many tokens (a long required key): they are fed in pieces of
    at most ``chunk_tokens``, as a prompt is, and the reply is the same."""
    ids_in = prompt(tiny_runner64, 5)
    params = SamplingParams(max_tokens=60)
    replies, extends = [], []
    for chunk in (256, 2):
        engine = make_engine(tiny_runner64, chunk_tokens=chunk)
        _, ids, _ = await engine.generate(
            ids_in, params, constraint=compiler.start(REQUIRED, FORCED)
        )
        replies.append(ids)
        extends.append(engine_stats(engine)["extend_steps_total"])
    assert replies[0] == replies[1]
    assert extends[1] > extends[0] > 0
