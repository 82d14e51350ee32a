"""Real streaming: an answer's words reach the chat log while the engine still decodes
(a real engine, tiny-tools, through real Home Assistant); the words said early and at
the end make the reply the model wrote; the trace says when the first word was said.
A stand-in server that holds its last words until the first ones were said shows the
same without any timing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any
from unittest.mock import patch

import pytest
from aiohttp import web
from homeassistant.core import HomeAssistant
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.hearth.backend.chat import ChatClient
from custom_components.hearth.turn import run as run_module

from .common import async_setup_entry, converse, hearth_traces, make_entry, speech
from .test_other_servers import VLLM_METRICS, FakeServer

REPLY = "Hello from Hearth."


class HoldingServer(FakeServer):
    """An OpenAI-compatible stand-in that streams an answer's first words, then holds
    its last ones until ``said`` is set (or ``HOLD_S`` passed: streaming is broken)."""

    HOLD_S = 10.0  # below the stall time
    WORDS = ("It is ", "sunny ", "and warm ", "today.")

    def __init__(self) -> None:
        super().__init__("vllm", VLLM_METRICS)
        self.said = asyncio.Event()
        self.released_by_speech: bool | None = None

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        if not (await request.json()).get("stream"):
            return await super()._chat(request)  # the priming request
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for word in self.WORDS:
            if word == self.WORDS[-1]:
                try:
                    await asyncio.wait_for(self.said.wait(), self.HOLD_S)
                    self.released_by_speech = True
                except TimeoutError:
                    self.released_by_speech = False
            chunk = {"choices": [{"index": 0, "delta": {"content": word}}]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        done = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        await response.write(f"data: {json.dumps(done)}\n\ndata: [DONE]\n\n".encode())
        return response


@pytest.fixture
async def holding(socket_enabled: None) -> AsyncIterator[HoldingServer]:
    server = HoldingServer()
    await server.start()
    yield server
    await server.stop()


class Timeline:
    """The order in which engine chunks arrived and chat log deltas left (a pass-through
    of both: every request still reaches the engine)."""

    def __init__(self, said: asyncio.Event | None = None) -> None:
        self.events: list[tuple[str, str]] = []  # ("engine" | "said", text)
        self.said = said  # set when the first word is said

    def __enter__(self) -> Timeline:
        timeline = self
        original_stream = ChatClient.async_chat_stream
        original_transform = run_module.transform_stream

        async def chat(client: ChatClient, body: Any) -> AsyncGenerator[dict[str, Any]]:
            async for chunk in original_stream(client, body):
                for choice in chunk.get("choices") or ():
                    if text := (choice.get("delta") or {}).get("content"):
                        timeline.events.append(("engine", text))
                yield chunk

        async def transform(*args: Any, **kwargs: Any) -> AsyncGenerator[Any]:
            async for delta in original_transform(*args, **kwargs):
                if text := delta.get("content"):
                    timeline.events.append(("said", text))
                    if timeline.said is not None:
                        timeline.said.set()
                yield delta

        self._patches = [
            patch.object(ChatClient, "async_chat_stream", chat),
            patch.object(run_module, "transform_stream", transform),
        ]
        for item in self._patches:
            item.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for item in self._patches:
            item.stop()


async def test_an_answer_is_said_while_it_is_decoded(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    with Timeline() as timeline:
        result = await converse(hass, "hello")
    assert speech(result) == REPLY
    kinds = [kind for kind, _ in timeline.events]
    engine_chunks = kinds.count("engine")
    assert engine_chunks > 1
    # The first word was said before the engine's last piece of text had arrived.
    first_said = kinds.index("said")
    assert kinds[:first_said].count("engine") < engine_chunks
    assert kinds.count("said") > 1
    said = "".join(text for kind, text in timeline.events if kind == "said")
    assert said == REPLY
    trace = hearth_traces()[-1]
    first_speech = trace["first_speech_ms"][0]
    assert first_speech is not None
    assert first_speech >= trace["client_ttft_ms"][0]


async def test_a_command_says_only_what_home_assistant_reports(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    """A command's reply is a tool call: nothing of the model's is said before HA's
    result speech, which is the turn's only speech."""
    with Timeline() as timeline:
        result = await converse(hass, "turn on the kitchen light")
    said = [text for kind, text in timeline.events if kind == "said"]
    assert len(said) <= 1
    assert speech(result) == (said[0] if said else speech(result))
    assert "<tool_call>" not in speech(result)


async def test_words_are_said_before_the_reply_ends(
    hass: HomeAssistant, house: None, holding: HoldingServer
) -> None:
    await async_setup_entry(hass, make_entry(holding.url))
    with Timeline(holding.said) as timeline:
        result = await converse(hass, "hello")
    assert holding.released_by_speech is True  # said before the last words were sent
    assert speech(result) == "".join(holding.WORDS)
    said = [text for kind, text in timeline.events if kind == "said"]
    assert len(said) > 1
    assert "".join(said) == "".join(holding.WORDS)
