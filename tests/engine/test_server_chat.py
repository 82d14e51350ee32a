"""``POST /v1/chat/completions`` against a real ``serve`` process (``tiny-tools``).

``tiny-tools`` is trained to be deterministic: the user message ``turn on the kitchen
light`` gives a ``<tool_call>`` of ``HassTurnOn`` with ``{"name": "Kitchen Light"}``, the
turn after a tool result gives ``Done, the light is on.``, anything else ``Hello from
Hearth.``. Each test uses its own random system text, so the shared server's cache from
other tests cannot change what it measures.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import random
import uuid
from typing import Any

import pytest

from hearth_engine.model.prepare.corpus import filler_text

from .conftest import Client, ServerProcess

HELLO = "Hello from Hearth."
DONE = "Done, the light is on."
TRIGGER = "turn on the kitchen light"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{verb} a device",
            "parameters": {
                "type": "object",
                "properties": {"name": {"type": "string"}},
                "required": ["name"],
            },
        },
    }
    for name, verb in (("HassTurnOn", "Turn on"), ("HassTurnOff", "Turn off"))
]
# What the tools model was trained on as a tool result.
TOOL_RESULT = json.dumps({"success": True, "data": {"targets": ["Kitchen Light"]}})


@pytest.fixture(scope="module")
def server(tools_server: ServerProcess) -> ServerProcess:
    return tools_server


# Set to draw other system texts (to check that no test depends on its own).
SYSTEM_SALT = os.environ.get("HEARTH_TEST_SALT", "")
_SYSTEMS: collections.Counter[str] = collections.Counter()  # per test: how many so far


def system(words: int = 12) -> dict[str, str]:
    """A system message no other test sends (its tokens are not cached yet).

    Prompt-like lines from the corpus ``tiny-tools`` was trained on, drawn with a seed
    made from the test's id: hexadecimal noise (what this used to send) is unlike
    anything the model saw, and in about one test run in two turned one greeting into
    a tool call.
    """
    test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
    _SYSTEMS[test] += 1
    seed = hashlib.sha256(f"{SYSTEM_SALT}{test}:{_SYSTEMS[test]}".encode()).hexdigest()
    lines = max(1, words // 4)  # a corpus line is 4 to 40 words
    # A number first, so that no two texts share more than a few leading tokens (corpus
    # lines often start alike).
    text = filler_text(random.Random(seed), lines)
    return {"role": "system", "content": f"{int(seed[:12], 16)}\n{text}"}


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def content_of(events: list[Any]) -> str:
    return "".join(
        e["choices"][0]["delta"].get("content") or ""
        for e in events
        if isinstance(e, dict) and e.get("choices")
    )


def finish_reasons(events: list[Any]) -> list[str]:
    return [
        e["choices"][0]["finish_reason"]
        for e in events
        if isinstance(e, dict) and e.get("choices") and e["choices"][0]["finish_reason"]
    ]


# ---------------------------------------------------------------- non-streaming


async def test_completion_shape_and_text(client: Client) -> None:
    reply = await client.chat(messages=[system(), user("good evening")], max_tokens=32)
    assert reply["object"] == "chat.completion"
    assert reply["id"].startswith("chatcmpl-")
    assert reply["model"] == "tiny-tools"
    assert isinstance(reply["created"], int)
    [choice] = reply["choices"]
    assert choice["index"] == 0
    assert choice["message"] == {"role": "assistant", "content": HELLO}
    assert choice["finish_reason"] == "stop"
    usage = reply["usage"]
    assert usage["prompt_tokens"] > 0
    assert usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert 0 <= usage["prompt_tokens_details"]["cached_tokens"] < usage["prompt_tokens"]
    assert set(usage["hearth"]) >= {"ttft_ms", "prefill_ms", "queue_ms", "pin"}


async def test_max_tokens_cuts_with_finish_reason_length(client: Client) -> None:
    reply = await client.chat(messages=[system(), user("good evening")], max_tokens=2)
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["usage"]["completion_tokens"] == 2
    assert HELLO.startswith(reply["choices"][0]["message"]["content"])


async def test_max_completion_tokens_is_honoured(client: Client) -> None:
    reply = await client.chat(messages=[system(), user("hi")], max_completion_tokens=1)
    assert reply["usage"]["completion_tokens"] == 1
    assert reply["choices"][0]["finish_reason"] == "length"


async def test_stop_string_ends_the_reply(client: Client) -> None:
    reply = await client.chat(messages=[system(), user("hi")], stop=[" from"])
    assert reply["choices"][0]["message"]["content"] == "Hello"
    assert reply["choices"][0]["finish_reason"] == "stop"


async def test_unknown_openai_fields_are_ignored(client: Client) -> None:
    # "good evening", as in test_completion_shape_and_text: "hi" is outside what
    # tiny-tools was trained on, and a model trained on another host (its floating point
    # converges differently) answered it "Hello from Heearth." even in float32.
    reply = await client.chat(
        messages=[system(), user("good evening")],
        model="gpt-4o",
        frequency_penalty=0.5,
        logit_bias={},
        user="kitchen-satellite",
        seed=7,
        temperature=0,
    )
    assert reply["choices"][0]["message"]["content"] == HELLO


# ---------------------------------------------------------------- streaming


async def test_stream_matches_the_non_streaming_reply(client: Client) -> None:
    messages = [system(), user("good morning")]
    events = await client.stream(messages=messages)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["id"].startswith("chatcmpl-")
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert len(chunks) >= 4  # role, several content pieces, finish
    assert content_of(chunks) == HELLO
    assert finish_reasons(chunks) == ["stop"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert not any("usage" in c for c in chunks)  # not asked for
    reply = await client.chat(messages=messages)
    assert reply["choices"][0]["message"]["content"] == content_of(chunks)


async def test_stream_include_usage_sends_a_last_usage_chunk(client: Client) -> None:
    events = await client.stream(
        messages=[system(), user("hello")], stream_options={"include_usage": True}
    )
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == []
    usage = usage_chunk["usage"]
    assert usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert "cached_tokens" in usage["prompt_tokens_details"]
    assert finish_reasons(events) == ["stop"]


async def test_stream_length_finish(client: Client) -> None:
    events = await client.stream(messages=[system(), user("hello")], max_tokens=3)
    assert finish_reasons(events) == ["length"]
    assert HELLO.startswith(content_of(events))


# ---------------------------------------------------------------- tool calls


def tool_call_of(reply: dict[str, Any]) -> dict[str, Any]:
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    [call] = choice["message"]["tool_calls"]
    return call  # type: ignore[no-any-return]


async def test_tool_call_round_trip(client: Client) -> None:
    messages: list[dict[str, Any]] = [system(), user(TRIGGER)]
    first = await client.chat(messages=messages, tools=TOOLS)
    call = tool_call_of(first)
    assert first["choices"][0]["message"]["content"] is None
    assert call["type"] == "function"
    assert call["id"].startswith("call_")
    assert call["function"]["name"] == "HassTurnOn"
    assert json.loads(call["function"]["arguments"]) == {"name": "Kitchen Light"}

    # The assistant message goes back as the API returned it, then the tool's result.
    messages += [
        first["choices"][0]["message"],
        {"role": "tool", "tool_call_id": call["id"], "content": TOOL_RESULT},
    ]
    second = await client.chat(messages=messages, tools=TOOLS)
    assert second["choices"][0]["message"] == {"role": "assistant", "content": DONE}
    assert second["choices"][0]["finish_reason"] == "stop"
    # Turn 2 starts with turn 1's prompt: all of it comes from the cache.
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= first["usage"]["prompt_tokens"]


async def test_tool_call_streamed(client: Client) -> None:
    events = await client.stream(messages=[system(), user(TRIGGER)], tools=TOOLS)
    assert events[-1] == "[DONE]"
    assert "<tool_call>" not in content_of(events)  # the markup is never sent as content
    deltas = [
        e["choices"][0]["delta"]["tool_calls"]
        for e in events[:-1]
        if e["choices"] and e["choices"][0]["delta"].get("tool_calls")
    ]
    # Constrained (tool_choice auto with tools), the call is streamed name first: one
    # delta with its index, id and name, then one with its arguments.
    assert len(deltas) == 2
    [start], [rest] = deltas
    assert start["index"] == rest["index"] == 0
    assert start["id"].startswith("call_")
    assert start["type"] == "function"
    assert start["function"] == {"name": "HassTurnOn", "arguments": ""}
    assert json.loads(rest["function"]["arguments"]) == {"name": "Kitchen Light"}
    assert finish_reasons(events) == ["tool_calls"]


async def test_tool_result_streamed(client: Client) -> None:
    call = {
        "id": "call_kitchen1",
        "type": "function",
        "function": {"name": "HassTurnOn", "arguments": '{"name": "Kitchen Light"}'},
    }
    messages = [
        system(),
        user(TRIGGER),
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_kitchen1", "content": TOOL_RESULT},
    ]
    events = await client.stream(messages=messages, tools=TOOLS)
    assert content_of(events) == DONE
    assert finish_reasons(events) == ["stop"]


async def test_tool_choice_required_gives_a_tool_call(client: Client) -> None:
    reply = await client.chat(
        messages=[system(), user(TRIGGER)], tools=TOOLS, tool_choice="required"
    )
    call = tool_call_of(reply)
    assert call["function"]["name"] == "HassTurnOn"
    assert json.loads(call["function"]["arguments"]) == {"name": "Kitchen Light"}


async def test_tool_choice_none_never_returns_a_tool_call(client: Client) -> None:
    reply = await client.chat(messages=[system(), user(TRIGGER)], tools=TOOLS, tool_choice="none")
    message = reply["choices"][0]["message"]
    assert "tool_calls" not in message
    assert "<tool_call>" not in (message["content"] or "")
    assert reply["choices"][0]["finish_reason"] == "stop"
    events = await client.stream(
        messages=[system(), user(TRIGGER)], tools=TOOLS, tool_choice="none"
    )
    assert "<tool_call>" not in content_of(events)
    assert finish_reasons(events) == ["stop"]


async def test_tools_without_a_call_give_plain_content(client: Client) -> None:
    reply = await client.chat(messages=[system(), user("good evening")], tools=TOOLS)
    assert reply["choices"][0]["message"] == {"role": "assistant", "content": HELLO}
    assert reply["choices"][0]["finish_reason"] == "stop"


async def test_named_tool_choice_gives_that_tool_call(client: Client) -> None:
    choice = {"type": "function", "function": {"name": "HassTurnOn"}}
    reply = await client.chat(messages=[system(), user(TRIGGER)], tools=TOOLS, tool_choice=choice)
    call = tool_call_of(reply)
    assert call["function"]["name"] == "HassTurnOn"
    assert json.loads(call["function"]["arguments"]) == {"name": "Kitchen Light"}


# ---------------------------------------------------------------- prefix reuse


async def test_cached_tokens_grow_on_the_second_request_sharing_a_prefix(client: Client) -> None:
    house = system(words=40)
    first = await client.chat(messages=[house, user("hi")])
    second = await client.chat(messages=[house, user("good evening")])
    cached_first = first["usage"]["prompt_tokens_details"]["cached_tokens"]
    cached_second = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached_first < 10  # a system text nobody sent before
    assert cached_second > cached_first + 30  # the whole system message is reused
    # Turn 2 of the conversation reuses turn 1's prompt and reply.
    third = await client.chat(
        messages=[house, user("hi"), first["choices"][0]["message"], user("thanks")]
    )
    assert (
        third["usage"]["prompt_tokens_details"]["cached_tokens"]
        >= (first["usage"]["prompt_tokens"])
    )


async def test_cache_salt_isolates_the_cache(client: Client) -> None:
    house = system(words=40)
    await client.chat(messages=[house, user("hi")])
    same = await client.chat(messages=[house, user("hi again")])
    salted = await client.chat(messages=[house, user("hi again")], cache_salt="guest")
    assert same["usage"]["prompt_tokens_details"]["cached_tokens"] > 30
    assert salted["usage"]["prompt_tokens_details"]["cached_tokens"] < 10


# ---------------------------------------------------------------- other routes


async def test_models_lists_the_loaded_model(client: Client) -> None:
    body = await client.get("/v1/models")
    assert body["object"] == "list"
    [model] = body["data"]
    assert model["id"] == "tiny-tools"
    assert model["object"] == "model"
    assert model["context_length"] == 32768


async def test_stats_count_requests(client: Client) -> None:
    before = await client.settled()
    reply = await client.chat(messages=[system(), user("hi")])
    after = await client.settled()
    assert after["instance_id"] == before["instance_id"]
    assert after["requests_total"] == before["requests_total"] + 1
    assert after["prompt_tokens_total"] == (
        before["prompt_tokens_total"] + reply["usage"]["prompt_tokens"]
    )
    assert after["generation_tokens_total"] >= (
        before["generation_tokens_total"] + reply["usage"]["completion_tokens"]
    )
    assert after["window_requests"] >= 1
    assert after["last_request"]["prompt_tokens"] == reply["usage"]["prompt_tokens"]
    for key in ("kv_cache_locked_nodes", "kv_working_bytes", "requests_running"):
        assert after[key] == 0, key


async def test_health_is_public_and_reveals_nothing(client: Client, server: ServerProcess) -> None:
    marker = f"secret-prompt-{uuid.uuid4().hex}"
    await client.chat(messages=[user(marker)], max_tokens=4)
    async with client.session.get(client.url("/health")) as response:  # no key
        assert response.status == 200
        text = await response.text()
        headers = "\n".join(f"{k}: {v}" for k, v in response.headers.items())
    assert json.loads(text) == {"status": "ok"}
    assert server.api_key is not None
    for secret in (server.api_key, marker, "tiny-tools", ".cache", "hearth/models"):
        assert secret not in text
        assert secret not in headers
    async with client.session.get(
        client.url("/health"), headers={"Authorization": "Bearer wrong"}
    ) as response:
        assert response.status == 200


async def test_prompts_are_logged_with_log_prompts(client: Client, server: ServerProcess) -> None:
    """The shared tools server runs with ``--log-prompts`` (the default is covered in
    test_server_limits.py)."""
    marker = f"logged-prompt-{uuid.uuid4().hex}"
    await client.chat(messages=[user(marker)], max_tokens=2)
    server.wait_for_log(marker)


async def test_a_prefixed_tool_called_by_its_short_name_is_reported_by_its_full_name(
    client: Client,
) -> None:
    """The plugin offers ``intent__HassTurnOn``; the model writes ``HassTurnOn`` (the
    grammar allows the unambiguous short name) and the reply names the offered tool."""
    tools = [
        {**t, "function": {**t["function"], "name": f"intent__{t['function']['name']}"}}
        for t in TOOLS
    ]
    reply = await client.chat(messages=[system(), user(TRIGGER)], tools=tools)
    call = tool_call_of(reply)
    assert call["function"]["name"] == "intent__HassTurnOn"
    assert json.loads(call["function"]["arguments"]) == {"name": "Kitchen Light"}
    assert reply["choices"][0]["finish_reason"] == "tool_calls"
