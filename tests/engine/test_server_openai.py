"""The official ``openai`` Python client against the engine: a real third-party client is
the best proof that the API is compatible (parsing, streaming, tool calls, errors)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from .conftest import ServerProcess
from .test_server_chat import DONE, HELLO, TOOL_RESULT, TOOLS, TRIGGER, system, user


@pytest.fixture
async def oai(tools_server: ServerProcess) -> AsyncIterator[openai.AsyncOpenAI]:
    assert tools_server.api_key is not None
    client = openai.AsyncOpenAI(
        base_url=f"{tools_server.url}/v1", api_key=tools_server.api_key, max_retries=0, timeout=300
    )
    async with client:
        yield client


async def test_non_streaming(oai: openai.AsyncOpenAI) -> None:
    completion = await oai.chat.completions.create(
        model="tiny-tools", messages=[system(), user("good evening")], max_tokens=32
    )
    assert completion.object == "chat.completion"
    assert completion.model == "tiny-tools"
    choice = completion.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == HELLO
    assert choice.message.tool_calls is None
    assert choice.finish_reason == "stop"
    assert completion.usage is not None
    assert completion.usage.completion_tokens > 0
    assert completion.usage.prompt_tokens_details is not None
    assert completion.usage.prompt_tokens_details.cached_tokens is not None


async def test_streaming(oai: openai.AsyncOpenAI) -> None:
    stream = await oai.chat.completions.create(
        model="tiny-tools",
        messages=[system(), user("good evening")],
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage = "", [], None
    async for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.finish_reason:
                finish.append(choice.finish_reason)
    assert text == HELLO
    assert finish == ["stop"]
    assert usage is not None
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


async def test_tool_call_round_trip(oai: openai.AsyncOpenAI) -> None:
    messages: list[Any] = [system(), user(TRIGGER)]
    first = await oai.chat.completions.create(model="tiny-tools", messages=messages, tools=TOOLS)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    [call] = choice.message.tool_calls
    assert call.type == "function"
    assert call.function.name == "HassTurnOn"
    assert json.loads(call.function.arguments) == {"name": "Kitchen Light"}

    # The usual client loop: send the assistant message back, then the tool result.
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": TOOL_RESULT})
    second = await oai.chat.completions.create(model="tiny-tools", messages=messages, tools=TOOLS)
    assert second.choices[0].message.content == DONE
    assert second.choices[0].finish_reason == "stop"


async def test_streamed_tool_call(oai: openai.AsyncOpenAI) -> None:
    stream = await oai.chat.completions.create(
        model="tiny-tools", messages=[system(), user(TRIGGER)], tools=TOOLS, stream=True
    )
    calls: dict[int, dict[str, str]] = {}
    text, finish = "", []
    async for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                call["id"] += delta.id or ""
                if delta.function is not None:
                    call["name"] += delta.function.name or ""
                    call["arguments"] += delta.function.arguments or ""
            if choice.finish_reason:
                finish.append(choice.finish_reason)
    assert "<tool_call>" not in text
    assert list(calls) == [0]
    assert calls[0]["id"].startswith("call_")
    assert calls[0]["name"] == "HassTurnOn"
    assert json.loads(calls[0]["arguments"]) == {"name": "Kitchen Light"}
    assert finish == ["tool_calls"]


async def test_models_list(oai: openai.AsyncOpenAI) -> None:
    models = [m.id async for m in oai.models.list()]
    assert models == ["tiny-tools"]


async def test_errors_become_the_clients_typed_exceptions(
    oai: openai.AsyncOpenAI, tools_server: ServerProcess
) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        await oai.chat.completions.create(model="tiny-tools", messages=[], max_tokens=4)
    assert bad.value.code == "invalid_value"
    assert bad.value.param == "messages"

    with pytest.raises(openai.UnprocessableEntityError) as too_long:
        await oai.chat.completions.create(
            model="tiny-tools", messages=[user("hi")], max_tokens=40_000
        )
    assert too_long.value.code == "context_length_exceeded"
    assert "32768" in too_long.value.message

    wrong_key = openai.AsyncOpenAI(
        base_url=f"{tools_server.url}/v1", api_key="not-the-key", max_retries=0
    )
    async with wrong_key:
        with pytest.raises(openai.AuthenticationError) as auth:
            await wrong_key.models.list()
        assert auth.value.code == "invalid_api_key"

    with pytest.raises(openai.NotFoundError) as missing:
        await oai.get("/prefixes/no-such-pin", cast_to=object)
    assert missing.value.code == "not_found"
