"""The engine with a constraint: the tiny random model, forced by the grammar, writes valid
tool calls; without it (the control) it never does. Batches mix constrained rows and free
ones."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hearth_engine.chat.formatter import ChatFormatter, parse_tool_calls
from hearth_engine.constraints.compiler import ConstraintCompiler
from hearth_engine.constraints.grammar import ConstraintRequest
from hearth_engine.serving.sampling import SamplingParams

from .constrained import HOUSE_NAMES, TOOLS, call_errors

pytest.importorskip("llguidance")

MESSAGES = [
    {"role": "system", "content": "You control the house."},
    {"role": "user", "content": "turn on the kitchen light please"},
]
SEEDS = range(8)


@pytest.fixture(scope="module")
def formatter(tiny_runner: Any) -> ChatFormatter:
    return ChatFormatter(tiny_runner.tokenizer)


@pytest.fixture(scope="module")
def compiler(tiny_runner: Any, formatter: ChatFormatter) -> ConstraintCompiler:
    return ConstraintCompiler(
        formatter.tokenizer, tiny_runner.info.vocab_size, [2], formatter.tool_format
    )


def prompt(formatter: ChatFormatter, forced: str) -> list[int]:
    text = formatter.render(MESSAGES, TOOLS, add_generation_prompt=True) + forced
    return formatter.encode(text)


def params(seed: int) -> SamplingParams:
    return SamplingParams(max_tokens=120, temperature=(0.7, 1.0, 1.5)[seed % 3], seed=seed)


def valid_calls(formatter: ChatFormatter, forced: str, text: str) -> list[str]:
    """Problems with ``text`` as a reply of tool calls (empty: all calls valid)."""
    content, calls = parse_tool_calls(forced + text, formatter.tool_format)
    if not calls:
        return [f"no tool call in {text!r}"]
    problems = [f"content {content!r}"] if content.strip() else []
    for call in calls:
        problems.extend(call_errors(call.name, call.arguments))
    return problems


async def test_required_makes_the_random_model_call_valid_tools(
    make_engine: Any, formatter: ChatFormatter, compiler: ConstraintCompiler
) -> None:
    engine = make_engine()
    forced = formatter.forced_prefix("required")
    tokens = prompt(formatter, forced)
    # The house's names close the one free string (a random model never ends a string).
    # One call: with parallel calls a sampling random model may go on calling until
    # max_tokens (which seeds do depends on how many draws its sampler made).
    req = ConstraintRequest(
        tools=tuple(TOOLS),
        tool_choice="required",
        parallel_tool_calls=False,
        argument_values={"name": HOUSE_NAMES},
    )

    async def one(seed: int, constrained: bool) -> tuple[list[str], str]:
        constraint = compiler.start(req, forced) if constrained else None
        text, _, finish = await engine.generate(tokens, params(seed), constraint=constraint)
        return valid_calls(formatter, forced, text), finish.reason

    # All at once: constrained and free rows share decode batches.
    results = await asyncio.gather(
        *(one(seed, constrained) for seed in SEEDS for constrained in (True, False))
    )
    constrained = results[0::2]
    free = results[1::2]
    assert all(problems == [] for problems, _ in constrained), constrained
    assert all(reason == "stop" for _, reason in constrained)
    # The control: the same random model, unconstrained, never writes a valid call.
    assert all(problems for problems, _ in free), free
    assert engine.masker.tokens > 0


async def test_named_tool_is_called_once(
    make_engine: Any, formatter: ChatFormatter, compiler: ConstraintCompiler
) -> None:
    engine = make_engine()
    choice = {"type": "function", "function": {"name": "HassSetMode"}}
    forced = formatter.forced_prefix(choice)
    req = ConstraintRequest(tools=tuple(TOOLS), tool_choice=choice)
    for seed in range(4):
        constraint = compiler.start(req, forced)
        text, _, _ = await engine.generate(
            prompt(formatter, forced), params(seed), constraint=constraint
        )
        _, calls = parse_tool_calls(forced + text, formatter.tool_format)
        assert [c.name for c in calls] == ["HassSetMode"], text
        assert call_errors(calls[0].name, calls[0].arguments) == []
