"""One request fails alone: a row whose token cannot be chosen fails its own request, and
every other row of the batch goes on (a real ``serve`` process, the tiny model, float32).

Reproduced before the fix: ``temperature: 1e-38`` overflowed ``logits / T`` to inf, the
softmax gave NaN, ``torch.multinomial`` raised inside the step, and the engine failed
every running request with a 500, a voice satellite's stream beside it included.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
import torch

from hearth_engine.serving.sampling import GREEDY_BELOW, Sampler, SamplingError, SamplingParams

from .conftest import Client, ServerProcess

VICTIM = {
    "messages": [{"role": "user", "content": "tell me a long story about the kitchen"}],
    "max_tokens": 160,
    "min_tokens": 160,
    "temperature": 0.0,
}
BOOLEAN = {"type": "json_schema", "json_schema": {"name": "b", "schema": {"type": "boolean"}}}
SHORT = [{"role": "user", "content": "is the door locked?"}]
BAD_REQUESTS: list[tuple[dict[str, Any], int]] = [
    # Tiny temperatures are greedy: answered, not failed.
    ({"messages": SHORT, "max_tokens": 8, "temperature": 1e-38, "seed": 1}, 200),
    ({"messages": SHORT, "max_tokens": 8, "temperature": 5e-324, "seed": 2}, 200),
    ({"messages": SHORT, "max_tokens": 8, "temperature": 2.0, "top_p": 1e-38}, 200),
    # The grammar ends the reply after `true`/`false` (the matcher stops), min_tokens
    # notwithstanding: the structured reply is complete.
    ({"messages": SHORT, "max_tokens": 40, "min_tokens": 40, "response_format": BOOLEAN}, 200),
]


@pytest.fixture(scope="module")
def server(server_factory: Any) -> ServerProcess:
    return server_factory("--model", "tiny", "--dtype", "float32")


def text_of(reply: dict[str, Any]) -> str:
    return str(reply["choices"][0]["message"]["content"])


async def test_a_bad_row_fails_alone_and_the_stream_beside_it_is_unchanged(
    client: Client,
) -> None:
    alone = text_of(await client.chat(**VICTIM))

    async def bad_ones() -> list[tuple[int, Any]]:
        await asyncio.sleep(0.05)  # the victim is decoding by now
        out = []
        for body, _ in BAD_REQUESTS:
            status, _, reply = await client.request("POST", "/v1/chat/completions", json_body=body)
            out.append((status, reply))
        return out

    victim, results = await asyncio.gather(client.chat(**VICTIM), bad_ones())
    assert text_of(victim) == alone
    assert victim["usage"]["completion_tokens"] == VICTIM["max_tokens"]
    for (body, expected), (status, reply) in zip(BAD_REQUESTS, results, strict=True):
        assert status == expected, (body, reply)
    assert text_of(results[-1][1]) in ("true", "false")
    stats = await client.settled()
    assert stats["kv_working_bytes"] == 0


async def test_a_tiny_temperature_is_greedy(client: Client) -> None:
    greedy = await client.chat(messages=SHORT, max_tokens=12, temperature=0.0)
    tiny = await client.chat(messages=SHORT, max_tokens=12, temperature=1e-30, seed=7)
    assert text_of(tiny) == text_of(greedy)


@pytest.mark.parametrize("temperature", [0.0, 1e-38, GREEDY_BELOW / 2, 0.7])
def test_sampler_refuses_rows_with_no_token(temperature: float) -> None:
    sampler = Sampler(SamplingParams(temperature=temperature, seed=0))
    with pytest.raises(SamplingError, match="every token is forbidden"):
        sampler(torch.full((16,), -math.inf))
    nan = torch.zeros(16)
    nan[3] = math.nan
    with pytest.raises(SamplingError, match="NaN"):
        sampler(nan)
    logits = torch.zeros(16)
    logits[5] = 30.0
    assert sampler(logits) == 5
