"""Constrained replies through ``serve`` (the tiny random model, float32): tool_choice,
response_format, the house-values extension, bad schemas, streaming."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from .conftest import Client, ServerProcess
from .constrained import HOUSE_NAMES, ROOMS, TOOLS, call_errors, schema_errors

pytest.importorskip("llguidance")

MESSAGES = [
    {"role": "system", "content": "You control the house."},
    {"role": "user", "content": "turn on the kitchen light please"},
]
HOUSE = {"argument_values": {"name": HOUSE_NAMES}}
STATE_SCHEMA = {
    "type": "object",
    "properties": {
        "on": {"type": "boolean"},
        "room": {"type": "string", "enum": ROOMS},
        "level": {"type": "integer", "minimum": 1, "maximum": 9},
    },
    "required": ["on", "room", "level"],
    "additionalProperties": False,
}
STATE_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "state", "schema": STATE_SCHEMA, "strict": True},
}


@pytest.fixture(scope="module")
def server(server_factory: Any) -> ServerProcess:
    return server_factory("--model", "tiny", "--dtype", "float32")


def sampling(seed: int) -> dict[str, Any]:
    return {"seed": seed, "temperature": (0.0, 0.8, 1.2, 1.8)[seed % 4], "max_tokens": 120}


def calls_of(reply: dict[str, Any]) -> list[tuple[str, str]]:
    message = reply["choices"][0]["message"]
    return [
        (c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []
    ]


async def test_required_gives_valid_calls_for_every_seed(client: Client) -> None:
    before = (await client.stats())["constrained_tokens_total"]
    for seed in range(8):
        reply = await client.chat(
            messages=MESSAGES, tools=TOOLS, tool_choice="required", hearth=HOUSE, **sampling(seed)
        )
        choice = reply["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        assert not choice["message"]["content"], choice
        calls = calls_of(reply)
        assert calls, choice
        for name, arguments in calls:
            assert call_errors(name, arguments) == [], (name, arguments)
            value = json.loads(arguments).get("name")
            assert value is None or value in HOUSE_NAMES, arguments
    stats = await client.stats()
    assert stats["constrained_tokens_total"] > before
    assert 0 < stats["mask_ms_per_token"] < 1000


async def test_the_random_model_alone_never_calls_a_valid_tool(client: Client) -> None:
    """The control: with no tools offered, the same prompt never yields a valid call."""
    for seed in range(8):
        reply = await client.chat(messages=MESSAGES, **sampling(seed))
        content = reply["choices"][0]["message"]["content"] or ""
        assert "tool_calls" not in reply["choices"][0]["message"]
        assert '{"name": "HassTurnOn"' not in content and '"HassSetMode"' not in content


async def test_named_tool_choice_calls_exactly_that_tool(client: Client) -> None:
    choice = {"type": "function", "function": {"name": "HassSetMode"}}
    for seed in range(4):
        reply = await client.chat(
            messages=MESSAGES, tools=TOOLS, tool_choice=choice, **sampling(seed)
        )
        calls = calls_of(reply)
        assert [name for name, _ in calls] == ["HassSetMode"], reply
        assert call_errors(*calls[0]) == []
        assert reply["choices"][0]["finish_reason"] == "tool_calls"


def _allowed(mode: str, *names: str) -> dict[str, Any]:
    """OpenAI's ``allowed_tools`` tool_choice."""
    tools = [{"type": "function", "function": {"name": name}} for name in names]
    return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": tools}}


async def test_allowed_tools_call_only_those_tools(client: Client) -> None:
    """``allowed_tools`` ``required``: every seed calls the one allowed tool (the prompt
    still shows both); ``auto``: text, or calls of it alone."""
    for seed in range(6):
        reply = await client.chat(
            messages=MESSAGES,
            tools=TOOLS,
            tool_choice=_allowed("required", "HassSetMode"),
            **sampling(seed),
        )
        calls = calls_of(reply)
        assert calls and {name for name, _ in calls} == {"HassSetMode"}, reply
        assert all(call_errors(*c) == [] for c in calls)
        auto = await client.chat(
            messages=MESSAGES,
            tools=TOOLS,
            tool_choice=_allowed("auto", "HassSetMode"),
            **sampling(seed),
        )
        assert {name for name, _ in calls_of(auto)} <= {"HassSetMode"}, auto


async def test_tool_choice_none_never_calls_or_speaks_markup(client: Client) -> None:
    for seed in range(6):
        reply = await client.chat(
            messages=MESSAGES,
            tools=TOOLS,
            tool_choice="none",
            **{**sampling(seed), "max_tokens": 40},
        )
        message = reply["choices"][0]["message"]
        assert "tool_calls" not in message
        assert "tool_call>" not in (message["content"] or "")
        assert "tool_response>" not in (message["content"] or "")


async def test_auto_replies_are_text_or_valid_calls(client: Client) -> None:
    for seed in range(6):
        reply = await client.chat(
            messages=MESSAGES, tools=TOOLS, hearth=HOUSE, **{**sampling(seed), "max_tokens": 40}
        )
        message = reply["choices"][0]["message"]
        assert "tool_call>" not in (message["content"] or ""), message
        for name, arguments in calls_of(reply):
            assert call_errors(name, arguments) == []


async def test_json_schema_response_format(client: Client) -> None:
    for seed in range(6):
        reply = await client.chat(messages=MESSAGES, response_format=STATE_FORMAT, **sampling(seed))
        choice = reply["choices"][0]
        assert choice["finish_reason"] == "stop", choice
        assert schema_errors(json.loads(choice["message"]["content"]), STATE_SCHEMA) == []


async def test_json_schema_response_format_streams(client: Client) -> None:
    events = await client.stream(messages=MESSAGES, response_format=STATE_FORMAT, **sampling(5))
    content = "".join(
        e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e["choices"]
    )
    assert schema_errors(json.loads(content), STATE_SCHEMA) == []
    assert events[-2]["choices"][0]["finish_reason"] == "stop"


async def test_required_streams_tool_calls(client: Client) -> None:
    events = await client.stream(
        messages=MESSAGES, tools=TOOLS, tool_choice="required", hearth=HOUSE, **sampling(3)
    )
    deltas = [e["choices"][0]["delta"] for e in events[:-1] if e["choices"]]
    assert not "".join(d.get("content") or "" for d in deltas)
    calls: dict[int, list[str]] = {}
    for d in deltas:
        for c in d.get("tool_calls") or []:  # the name first, the arguments later
            name_and_arguments = calls.setdefault(c["index"], ["", ""])
            name_and_arguments[0] += c["function"].get("name", "")
            name_and_arguments[1] += c["function"].get("arguments", "")
    assert calls
    for name, arguments in calls.values():
        assert call_errors(name, arguments) == []
    assert events[-2]["choices"][0]["finish_reason"] == "tool_calls"


async def test_a_constrained_call_streams_its_name_before_its_arguments(
    client: Client,
) -> None:
    """The first tool-call delta carries the index, id and name with empty arguments,
    in an earlier event than the arguments (OpenAI's streaming form); joined, the
    deltas are the call the non-streaming reply gives."""
    body = {"messages": MESSAGES, "tools": TOOLS, "tool_choice": "required", "hearth": HOUSE}
    events = await client.stream(**body, **sampling(0))
    with_calls = [
        (i, c)
        for i, e in enumerate(events[:-1])
        if e["choices"]
        for c in e["choices"][0]["delta"].get("tool_calls") or []
    ]
    first_at, first = with_calls[0]
    assert first["function"]["arguments"] == "" and first["id"] and first["type"] == "function"
    joined: dict[int, dict[str, str]] = {}
    for _at, delta in with_calls:
        call = joined.setdefault(delta["index"], {"id": "", "name": "", "arguments": ""})
        call["id"] = delta.get("id") or call["id"]
        call["name"] += delta.get("function", {}).get("name", "")
        call["arguments"] += delta.get("function", {}).get("arguments", "")
    assert any(at > first_at for at, d in with_calls if d["function"].get("arguments"))
    reply = await client.chat(**body, **sampling(0))
    assert [(c["name"], c["arguments"]) for c in joined.values()] == calls_of(reply)
    assert joined[0]["id"] == first["id"]


async def test_json_object_response_format(client: Client) -> None:
    reply = await client.chat(
        messages=MESSAGES,
        response_format={"type": "json_object"},
        **{**sampling(2), "max_tokens": 60},
    )
    choice = reply["choices"][0]
    if choice["finish_reason"] == "stop":  # a random model may not close it in 60 tokens
        assert isinstance(json.loads(choice["message"]["content"]), dict)
    else:
        assert choice["message"]["content"].startswith("{")


BROKEN_TOOL = {
    "type": "function",
    "function": {
        "name": "Broken",
        "parameters": {"type": "object", "properties": {"a": {"type": "strin"}}},
    },
}


@pytest.mark.parametrize(
    ("extra", "code", "param"),
    [
        ({"tools": [TOOLS[0], BROKEN_TOOL]}, "invalid_schema", "tools.1.function.parameters"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"$ref": "#/no"}},
                }
            },
            "invalid_schema",
            "response_format.json_schema.schema",
        ),
        ({"response_format": {"type": "yaml"}}, "invalid_value", "response_format"),
        ({"response_format": {"type": "json_schema"}}, "invalid_value", "response_format"),
        ({"hearth": {"argument_values": {"name": "Kitchen"}}}, "invalid_value", "hearth"),
        ({"hearth": {"argument_values": {"name": [""]}}}, "invalid_value", "hearth"),
        ({"hearth": {"required_arguments": "area"}}, "invalid_value", "hearth"),
        ({"hearth": {"required_arguments": ["a b"]}}, "invalid_value", "hearth"),
        ({"hearth": {"values": {}}}, "invalid_value", "hearth"),
        ({"hearth": {"argument_tools": "HassTurnOn"}}, "invalid_value", "hearth"),
        ({"hearth": {"argument_tools": [""]}}, "invalid_value", "hearth"),
        ({"hearth": ["name"]}, "invalid_value", "hearth"),
        ({"tools": TOOLS, "tool_choice": _allowed("required", "Nope")}, "invalid_value",
         "tool_choice"),
        ({"tools": TOOLS, "tool_choice": _allowed("sometimes", "HassSetMode")}, "invalid_value",
         "tool_choice.allowed_tools.mode"),
        ({"tools": TOOLS, "tool_choice": _allowed("auto")}, "invalid_value",
         "tool_choice.allowed_tools.tools"),
        ({"tool_choice": _allowed("auto", "HassSetMode")}, "invalid_value", "tool_choice"),
    ],
)  # fmt: skip
async def test_bad_constraints_are_400s(
    client: Client, extra: dict[str, Any], code: str, param: str
) -> None:
    body = {"messages": MESSAGES, "max_tokens": 4, **extra}
    error = await client.error("POST", "/v1/chat/completions", 400, code, json_body=body)
    # A grammar that fails fast is blamed on its tool (``tools.1.function.parameters``);
    # one that runs out of time only on the tools as a whole.
    assert error["param"] == param or error["param"].startswith(f"{param}."), error


async def test_pin_with_bad_tool_schema_is_a_400(client: Client) -> None:
    body = {"messages": MESSAGES[:1], "tools": [BROKEN_TOOL]}
    error = await client.error("PUT", "/v1/prefixes/broken", 400, "invalid_schema", json_body=body)
    assert error["param"] == "tools.0.function.parameters"


async def test_a_pin_with_tools_compiles_the_house_grammar_once(
    client: Client, server: ServerProcess
) -> None:
    tag = uuid.uuid4().hex
    tools = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "description": tag}}]
    house = [{"role": "system", "content": f"House {tag}."}]
    before = server.stderr().count("Grammar compiled")
    await client.put_pin(f"house-{tag[:8]}", messages=house, tools=tools, hearth=HOUSE)
    server.wait_for_log("Grammar compiled", timeout=5)
    assert server.stderr().count("Grammar compiled") == before + 1
    messages = [*house, MESSAGES[1]]
    for seed in range(2):
        reply = await client.chat(messages=messages, tools=tools, hearth=HOUSE, **sampling(seed))
        assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert server.stderr().count("Grammar compiled") == before + 1  # reused, not rebuilt
    # Other house values are another grammar.
    await client.chat(messages=messages, tools=tools, hearth={"argument_values": {"name": ["X"]}})
    assert server.stderr().count("Grammar compiled") == before + 2


async def test_house_values_stay_out_of_the_prompt(client: Client) -> None:
    base = {"messages": MESSAGES, "tools": TOOLS, "max_tokens": 1}
    plain = await client.chat(**base)
    narrowed = await client.chat(**base, hearth={"argument_values": {"name": ["A" * 200] * 50}})
    assert narrowed["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"]


async def test_forced_tokens_count_against_the_reply_not_the_prompt(client: Client) -> None:
    """Regression: the tokens a grammar forces after ``<tool_call>`` (jump-forward) were
    added to the prompt after the default ``max_tokens`` was set from the room left, so a
    request that fits near the context's end was refused with a 422."""

    def body(words: int) -> dict[str, Any]:
        messages = [{"role": "user", "content": "lamp " * words}]
        return {"messages": messages, "tools": TOOLS, "tool_choice": "required"}

    async def prompt_tokens(words: int) -> int:  # max_tokens 1: no room for forced tokens
        return int((await client.chat(**body(words), max_tokens=1))["usage"]["prompt_tokens"])

    base = await prompt_tokens(100)
    per_100 = await prompt_tokens(200) - base
    words = 100 + (32768 - 100 - base) * 100 // per_100  # about 100 tokens of room left
    room = 32768 - await prompt_tokens(words)
    assert 8 < room < 512, room  # the default max_tokens is then the room left
    reply = await client.chat(**body(words))
    assert reply["usage"]["prompt_tokens"] + reply["usage"]["completion_tokens"] <= 32768
    assert reply["choices"][0]["finish_reason"] in ("length", "tool_calls")


async def test_a_call_cut_short_is_neither_a_call_nor_spoken_markup(client: Client) -> None:
    body = {"messages": MESSAGES, "tools": TOOLS, "tool_choice": "required", "max_tokens": 6}
    reply = await client.chat(**body)
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "length"
    assert "tool_calls" not in choice["message"]
    assert not choice["message"]["content"]
    events = await client.stream(**body)
    deltas = [e["choices"][0]["delta"] for e in events[:-1] if e["choices"]]
    assert not "".join(d.get("content") or "" for d in deltas)
    # Streamed, a call whose name was written is announced; its arguments are what it
    # wrote, which is not a JSON object, so no client runs it; the reply ends "length".
    arguments = "".join(
        c["function"].get("arguments", "") for d in deltas for c in d.get("tool_calls") or []
    )
    with pytest.raises(json.JSONDecodeError):
        json.loads(arguments)
    assert events[-2]["choices"][0]["finish_reason"] == "length"


# Grammar limits (issue 26): each bad schema is a 400 naming what it hit, and a failed
# grammar is refused from the failure cache the second time (the server logs which).
def _schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def _tool(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


_BRANCHES = [{"type": "object", "properties": {f"p{j}": {"type": "integer"}}} for j in range(10)]
# allOf over anyOfs multiplies out: 10^4 branches, ~5 s to compile here, then a panic.
_BLOW_UP = {"allOf": [{"anyOf": _BRANCHES} for _ in range(4)]}
_SELF_REF = {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
_BIG = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(10_000)}}


@pytest.mark.parametrize(
    ("extra", "code", "param", "names"),
    [
        ({"response_format": _schema_format(_SELF_REF)}, "invalid_schema",
         "response_format.json_schema.schema", ("no finite value",)),
        ({"response_format": _schema_format({"enum": [f"v{i}" for i in range(50_000)]})},
         "invalid_value", "response_format", ("limit max_schema_bytes = 262144",)),
        ({"tools": [TOOLS[0], _tool("Blow", _BLOW_UP)]}, "invalid_schema", "tools",
         ("limit compile_seconds = 3", "too complex")),
        ({"tools": [_tool(f"T{i}", {}) for i in range(513)]}, "invalid_value", "tools",
         ("limit max_tools = 512",)),
        ({"tools": [TOOLS[0], _tool("Big", _BIG)]}, "invalid_value", "tools",
         ("limit max_schema_bytes = 262144",)),
    ],
    ids=["self_ref", "huge_enum", "any_of_blow_up", "too_many_tools", "oversized_schema"],
)  # fmt: skip
async def test_grammar_limits_are_400s_naming_the_limit(
    client: Client,
    server: ServerProcess,
    extra: dict[str, Any],
    code: str,
    param: str,
    names: tuple[str, ...],
) -> None:
    body = {"messages": MESSAGES, "max_tokens": 4, **extra}
    error = await client.error("POST", "/v1/chat/completions", 400, code, json_body=body)
    # A grammar that fails fast is blamed on its tool (``tools.1.function.parameters``);
    # one that runs out of time only on the tools as a whole.
    assert error["param"] == param or error["param"].startswith(f"{param}."), error
    assert any(name in error["message"] for name in names), error
    refused = server.stderr().count("Grammar refused from the failure cache")
    again = await client.error("POST", "/v1/chat/completions", 400, code, json_body=body)
    assert again == error
    if code == "invalid_schema":  # compiled once, then refused from the cache
        server.wait_for_log("Grammar refused from the failure cache", timeout=5)
        assert server.stderr().count("Grammar refused from the failure cache") == refused + 1
    assert (await client.chat(messages=MESSAGES, tools=TOOLS, max_tokens=2))["choices"]


HOUSEHOLD = Path(__file__).parents[2] / "bench" / "fixtures" / "household.json"


async def test_the_household_tools_still_compile_and_call(client: Client) -> None:
    """HA's 18 tools (captured from a real house) fit every limit: each request compiles,
    and every call that ends is a call of an offered tool. The tiny model's weights are
    random: a free string (a to-do item, a color) may run past ``max_tokens`` on some
    seeds, so four are tried and at least one must finish its call."""
    agent = json.loads(HOUSEHOLD.read_text())["agents"]["hearth"]
    tools = agent["prefixes"][0]["tools"]
    offered = {t["function"]["name"] for t in tools}
    finished = 0
    for seed in range(1, 5):
        reply = await client.chat(
            messages=MESSAGES, tools=tools, tool_choice="required", hearth=HOUSE, **sampling(seed)
        )
        choice = reply["choices"][0]
        if choice["finish_reason"] == "length":
            continue
        calls = calls_of(reply)
        assert calls and all(name in offered for name, _ in calls), choice
        finished += 1
    assert finished, "no seed finished a call within max_tokens"
