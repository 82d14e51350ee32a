"""Pure functions: the volatile split, history, tool names, error keys."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from homeassistant.components import conversation
from homeassistant.helpers import llm

from custom_components.hearth.backend.api import (
    HearthAuthError,
    HearthConnectionError,
    HearthResponseError,
)
from custom_components.hearth.errors import ContextOverflow, error_key
from custom_components.hearth.prefix.render import canonical_schema, format_tool
from custom_components.hearth.prefix.value import HousePrefix
from custom_components.hearth.tool_names import model_tool_names, with_shown_names
from custom_components.hearth.turn.prompt import HearthNative, build_messages, volatile_context
from custom_components.hearth.turn.stream import parse_tool_args, resolve_tool_name

PREFIX = HousePrefix(system="Be brief.\nStatic Context:\n- names: Lamp", tools=())


def test_volatile_context_moves_what_the_prefix_lacks() -> None:
    system_prompt = (
        "Be brief.\n\nStatic Context:\n- names: Lamp\n"
        "You are in area Kitchen.\nCurrent time is 10:00:00.\n\nThe user is Anne."
    )
    assert volatile_context(system_prompt, PREFIX.system) == (
        "You are in area Kitchen.\nCurrent time is 10:00:00.\nThe user is Anne."
    )
    assert volatile_context(PREFIX.system, PREFIX.system) == ""


def _native(context: str | None, content: str, **extra: Any) -> conversation.AssistantContent:
    message = {"role": "assistant", "content": content, **extra}
    return conversation.AssistantContent(
        agent_id="conversation.hearth",
        content=content,
        native=HearthNative(context=context, message=message),
    )


def test_build_messages_keeps_each_turn_as_sent() -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "HassTurnOn", "arguments": '{"name": "Lamp"}'},
    }
    content: list[conversation.Content] = [
        conversation.SystemContent(content="HA's own system prompt (replaced)"),
        conversation.UserContent(content="turn on the lamp"),
        _native("ctx 1", "", tool_calls=[call]),
        conversation.ToolResultContent(
            agent_id="conversation.hearth",
            tool_call_id="call_1",
            tool_name="intent__HassTurnOn",
            result=llm.ToolResult(data={"success": True}),
        ),
        _native(None, "Done."),
        conversation.UserContent(content="thanks"),
        conversation.AssistantContent(agent_id="conversation.home_assistant", content="Sure."),
        conversation.UserContent(content="hello"),
    ]
    assert build_messages(PREFIX, content, "ctx 3", max_history=10) == [
        {"role": "system", "content": PREFIX.system},
        {"role": "system", "content": "ctx 1"},
        {"role": "user", "content": "turn on the lamp"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"success":true}'},
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "thanks"},  # answered by another agent: no context
        {"role": "assistant", "content": "Sure."},
        {"role": "system", "content": "ctx 3"},
        {"role": "user", "content": "hello"},
    ]
    # Whole turns are dropped, oldest first.
    assert build_messages(PREFIX, content, "ctx 3", max_history=1)[1:] == [
        {"role": "user", "content": "thanks"},
        {"role": "assistant", "content": "Sure."},
        {"role": "system", "content": "ctx 3"},
        {"role": "user", "content": "hello"},
    ]
    assert build_messages(PREFIX, content, "", max_history=0)[1:] == [
        {"role": "user", "content": "hello"}
    ]


def test_tool_schemas_do_not_depend_on_set_order() -> None:
    """Regression: HA builds some enums from sets, whose order changes per process
    (string hash randomization), so an HA restart changed the prefix and re-pinned it."""
    import probatio

    def tool(steps: list[str]) -> llm.Tool:
        class Volume(llm.Tool):
            name = "HassSetVolumeRelative"
            description = "Change the volume"
            parameters = probatio.Schema(
                {
                    probatio.Required("volume_step"): probatio.In(steps),
                    probatio.Optional("name"): str,
                }
            )

            async def async_call(self, *args: Any) -> Any:
                raise NotImplementedError

        return Volume()

    one = format_tool(tool(["up", "down"]), None)
    other = format_tool(tool(["down", "up"]), None)
    assert one == other
    assert one["function"]["parameters"]["properties"]["volume_step"]["enum"] == ["down", "up"]
    nested = {"anyOf": [{"enum": ["b", "a", 1]}, {"required": ["y", "x"]}], "items": ["z", "a"]}
    assert canonical_schema(nested) == {
        "anyOf": [{"enum": [1, "a", "b"]}, {"required": ["x", "y"]}],
        "items": ["z", "a"],  # not a set: order kept
    }


def test_resolve_tool_name() -> None:
    tools = ["intent__HassTurnOn", "intent__HassTurnOff", "a__Get", "b__Get"]
    assert resolve_tool_name("intent__HassTurnOn", tools) == "intent__HassTurnOn"
    assert resolve_tool_name("HassTurnOn", tools) == "intent__HassTurnOn"
    assert resolve_tool_name("Get", tools) == "Get"  # ambiguous: HA reports it
    assert resolve_tool_name("Nope", tools) == "Nope"


def test_the_model_sees_bare_tool_names_where_they_are_unique() -> None:
    names = ["intent__HassTurnOn", "climate__HassClimateSetTemperature", "a__Get", "b__Get"]
    shown = model_tool_names(names)
    assert shown == {
        "intent__HassTurnOn": "HassTurnOn",
        "climate__HassClimateSetTemperature": "HassClimateSetTemperature",
        "a__Get": "a__Get",  # two "Get": both keep HA's names
        "b__Get": "b__Get",
    }
    # Every shown name maps back to the tool HA runs.
    assert all(resolve_tool_name(shown[name], names) == name for name in names)
    assert model_tool_names(["odd__"]) == {"odd__": "odd__"}  # no empty name
    # HA's prompt names the tools as the model sees them.
    said = "Use intent__HassTurnOn to lock; a__Get stays; xintent__HassTurnOn too."
    assert with_shown_names(said, shown) == (
        "Use HassTurnOn to lock; a__Get stays; xintent__HassTurnOn too."
    )


def test_parse_tool_args() -> None:
    assert parse_tool_args('{"name": "Lamp", "area": "", "floor": null}') == {"name": "Lamp"}
    assert parse_tool_args("") == {}
    # Not a JSON object: None, and the call gets a tool error instead of running with {}.
    assert parse_tool_args("not json") is None
    assert parse_tool_args("[1, 2]") is None


_REQUEST = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")


def _status(cls: type[openai.APIStatusError], status: int, code: str) -> openai.APIStatusError:
    """An SDK status error as the SDK builds it from an OpenAI-style error body."""
    body = {"message": code, "type": "error", "code": code}
    return cls(code, response=httpx.Response(status, request=_REQUEST), body=body)


# Bodies of a request over the context (the ``error`` object): llama.cpp's server
# (format_error_response), vLLM's and SGLang's ErrorResponse.
LLAMA_CPP_OVERFLOW = {
    "code": 400,
    "message": "the request exceeds the available context size, try increasing it",
    "type": "exceed_context_size_error",
    "n_prompt_tokens": 5000,
    "n_ctx": 4096,
}
VLLM_OVERFLOW = {
    "message": "This model's maximum context length is 8192 tokens. However, you requested "
    "9000 tokens (8744 in the messages, 256 in the completion). Please reduce the length "
    "of the messages or completion.",
    "type": "BadRequestError",
    "param": None,
    "code": 400,
}
SGLANG_OVERFLOW = {
    "object": "error",
    "message": "The input (9000 tokens) is longer than the model's context length (8192 tokens).",
    "type": "BadRequestError",
    "param": None,
    "code": 400,
}


def _overflow(body: dict[str, Any]) -> openai.APIStatusError:
    """A 400 as the SDK builds it from ``body`` (its message quotes the whole body)."""
    response = httpx.Response(400, request=_REQUEST)
    return openai.BadRequestError(f"Error code: 400 - {body}", response=response, body=body)


@pytest.mark.parametrize(
    ("error", "key"),
    [
        (HearthConnectionError("down"), "cannot_connect"),
        (HearthAuthError(401, "invalid_api_key", "no"), "invalid_auth"),
        (HearthResponseError(422, "context_length_exceeded", "long"), "context_length_exceeded"),
        (HearthResponseError(503, "overloaded", "busy"), "engine_busy"),
        (HearthResponseError(500, "engine_error", "boom"), "engine_error"),
        # The openai SDK's errors (chat): the same keys.
        (openai.APIConnectionError(request=_REQUEST), "cannot_connect"),
        (openai.APITimeoutError(request=_REQUEST), "cannot_connect"),
        (_status(openai.AuthenticationError, 401, "invalid_api_key"), "invalid_auth"),
        (
            _status(openai.BadRequestError, 400, "context_length_exceeded"),
            "context_length_exceeded",
        ),
        (_status(openai.RateLimitError, 429, "rate_limit"), "engine_busy"),
        (_status(openai.InternalServerError, 503, "overloaded"), "engine_busy"),
        (_status(openai.InternalServerError, 500, "engine_error"), "engine_error"),
        # Sent inside a stream (no status): its code still counts.
        (
            openai.APIError("long", _REQUEST, body={"code": "context_length_exceeded"}),
            "context_length_exceeded",
        ),
        (openai.APIError("boom", _REQUEST, body={"code": "engine_error"}), "engine_error"),
        # Over the context, as the other servers say it (their own error bodies).
        (_overflow(LLAMA_CPP_OVERFLOW), "context_length_exceeded"),
        (openai.APIError("long", _REQUEST, body=LLAMA_CPP_OVERFLOW), "context_length_exceeded"),
        (_overflow(VLLM_OVERFLOW), "context_length_exceeded"),
        (_overflow(SGLANG_OVERFLOW), "context_length_exceeded"),
        (_overflow({**VLLM_OVERFLOW, "message": "Invalid 'tools' format"}), "engine_error"),
        # What a turn found could not fit even with everything left out (turn/context_fit.py).
        (ContextOverflow("house_too_big", _overflow(VLLM_OVERFLOW)), "house_too_big"),
    ],
)
def test_error_keys(error: Exception, key: str) -> None:
    assert error_key(error) == key  # type: ignore[arg-type]
