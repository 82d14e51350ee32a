"""Reply time on the pinned demo house, as a streaming HTTP client sees it.

Part of ``scripts/bench decode``. A voice user waits for TTFT plus the decode of the
reply, so this starts a real ``hearth_engine serve`` process, pins the house prefix the
plugin sends (``bench/fixtures/household.json``: the ``hearth`` agent's messages and
tools), and times kitchen-satellite requests that generate ``max_tokens`` tokens:
TTFT (first content chunk) and the time to the end of the stream (the last token).

The engine has no ``ignore_eos``: requests use ``tool_choice: none`` (text only) and ask
for a long answer. Each candidate question is tried once (the warm-up); the first that
runs to ``max_tokens`` is timed. If none does, the last is timed and the row reports
the real token count in ``tokens``.

Every request is numbered at the start of its user message, as a new voice command
differs from the last one: the engine keeps each prompt's KV, so repeating one request
would hit it all. What hits is the pin plus the satellite's context message (as for the
second command of a satellite in a real house); the question is prefilled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from .client import Reply, put_pin, stream_chat
from .common import median, percentile
from .harness.fixture import Fixture, Sample
from .harness.server import EngineProcess

AGENT = "hearth"  # the conversation agent; a satellite's requests use its class pin
ROLE = "satellite_a"
# Tried on the default model (SmolLM2-135M, bf16): the first two ran to 40 tokens; asked
# to describe the rooms or to count, it stopped after 13-32.
QUESTIONS = (
    "Write a long story about a day in this house.",
    "Write a poem about the kitchen with ten verses.",
    "Explain in detail how to cook pasta, step by step.",
)


def satellite_sample(fixture: Fixture) -> Sample:
    """The kitchen satellite's first request to the agent (or to its class pin)."""
    return next(
        s
        for s in fixture.of_role(ROLE)
        if s.agent.split(".")[0] == AGENT and s.prefix == 0 and s.iteration == 0
    )


def request_body(fixture: Fixture, question: str, number: int, max_tokens: int) -> dict[str, Any]:
    """Kitchen-satellite request ``number`` on the pinned prefix, asking ``question``:
    the pinned messages whole (their worked examples too), the satellite's context line,
    then the question (the captured request's own words and example are left out)."""
    sample = satellite_sample(fixture)
    body = fixture.body(sample, version=0)
    pinned = fixture.agents[sample.agent].prefixes[0].messages
    context = [m for m in sample.suffix if m["role"] == "system"]
    return {
        **body,
        "messages": [
            *pinned,
            *context,
            {"role": "user", "content": f"Request {number}. {question}"},
        ],
        "tool_choice": "none",
        "temperature": 0.0,
        "max_tokens": max_tokens,
    }


def completion_tokens(reply: Reply) -> int:
    return int(reply.usage.get("completion_tokens", 0))


async def pick_question(
    session: aiohttp.ClientSession, url: str, fixture: Fixture, max_tokens: int
) -> str:
    """The first question that runs to ``max_tokens`` (each tried once)."""
    for question in QUESTIONS:
        reply = await stream_chat(session, url, request_body(fixture, question, 0, max_tokens))
        if reply.error is not None:
            raise RuntimeError(f"reply request failed: {reply.error}")
        if completion_tokens(reply) >= max_tokens:
            return question
    return QUESTIONS[-1]


def summarize(replies: Sequence[Reply], pin: dict[str, Any]) -> dict[str, Any]:
    """Medians over the runs; ms/token is the decode after the first token."""
    tokens = [completion_tokens(r) for r in replies]
    per_token = [
        (r.total_ms - r.ttft_ms) / (n - 1) for r, n in zip(replies, tokens, strict=True) if n > 1
    ]
    prefill_s = float(pin.get("prefill_ms", 0.0)) / 1000
    return {
        "context": int(median([r.prompt_tokens for r in replies])),
        "cached_tokens": int(median([r.cached_tokens for r in replies])),
        "ms_per_token_p50": round(median(per_token), 2) if per_token else None,
        "ms_per_token_p90": round(percentile(per_token, 0.9), 2) if per_token else None,
        "prefill_tok_s": round(int(pin["tokens"]) / prefill_s, 1) if prefill_s > 0 else None,
        "ttft_ms": round(median([r.ttft_ms for r in replies]), 1),
        "reply_ms": round(median([r.total_ms for r in replies]), 1),
        "tokens": int(median(tokens)),
    }


async def measure_reply(url: str, fixture: Fixture, max_tokens: int, runs: int) -> dict[str, Any]:
    timeout = aiohttp.ClientTimeout(total=1800)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        agent = fixture.agents[satellite_sample(fixture).agent]
        pin = await put_pin(session, url, agent.pin, agent.prefixes[0].body())
        question = await pick_question(session, url, fixture, max_tokens)
        replies = []
        for number in range(1, runs + 1):
            body = request_body(fixture, question, number, max_tokens)
            reply = await stream_chat(session, url, body)
            if reply.error is not None:
                raise RuntimeError(f"reply request failed: {reply.error}")
            replies.append(reply)
        async with session.get(f"{url}/v1/stats") as resp:
            forward = (await resp.json()).get("forward")
    return {**summarize(replies, pin), "forward": forward}


def reply_row(
    model: str,
    spec: str,
    dtype: str,
    dtype_args: Sequence[str],
    threads: int,
    fixture: Fixture,
    max_tokens: int,
    runs: int,
    log: Path,
) -> dict[str, Any]:
    """One ``reply`` row: a fresh server process for ``spec``, stopped afterwards."""
    args = ["--model", spec, *dtype_args, "--threads", str(threads)]
    engine = EngineProcess(args, log).start()
    try:
        result = asyncio.run(measure_reply(engine.url, fixture, max_tokens, runs))
    finally:
        engine.stop()
    row = {"kind": "reply", "model": model, "dtype": dtype, "threads": threads, "batch": 1}
    return {**row, **result}
