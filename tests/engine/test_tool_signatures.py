"""The tools in Hearth's chat template: one compact signature a line, written by the
template's own Jinja (``templates.TOOL_MACROS``), rendered here by transformers as the
engine renders every prompt. ``test_llama_server.py`` renders the same tools with
llama.cpp's Jinja engine and compares the bytes."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from hearth_engine.chat.formatter import ChatFormatter
from hearth_engine.model.prepare.templates import HERMES_CHATML_TEMPLATE, TOOLS_INTRO
from hearth_engine.model.prepare.tiny import prepare_tiny_model

HOUSEHOLD = Path(__file__).parents[2] / "bench" / "fixtures" / "household.json"
TARGET = {
    "name": {"type": "string"},
    "area": {"type": "string"},
    "floor": {"type": "string"},
    "domain": {"type": "array", "items": {"type": "string"}},
}


def _tool(name: str, description: str | None, parameters: dict[str, Any]) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name, "parameters": parameters}
    if description is not None:
        function["description"] = description
    return {"type": "function", "function": function}


# As Home Assistant's Assist API sends them (the order of keys too).
HA_TOOLS = [
    _tool(
        "GetDateTime",
        "Provides the current date and time.",
        {"type": "object", "properties": {}, "additionalProperties": False},
    ),
    _tool(
        "GetLiveContext",
        "Provides real-time information.",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "Filter entities by name."},
                "domain": {
                    "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
                    "description": "A single domain or a list.",
                },
            },
            "additionalProperties": False,
        },
    ),
    _tool(
        "HassLightSet",
        "Sets the brightness percentage or color of a light",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "domain": {"type": "array", "items": {"type": "string", "enum": ["light"]}},
                "temperature": {"type": "integer", "minimum": 0},
                "brightness": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": 100,
                    "description": "The brightness percentage",
                },
            },
            "additionalProperties": False,
        },
    ),
    _tool(
        "HassMediaPlayerMute",
        "Mutes a media player",
        {
            "type": "object",
            "properties": {"is_volume_muted": {"description": "Whether to mute"}},
            "additionalProperties": False,
        },
    ),
    _tool(
        "HassSetVolumeRelative",
        "Increases or decreases the volume of a media player",
        {
            "type": "object",
            "properties": {
                "volume_step": {
                    "anyOf": [
                        {"type": "string", "enum": ["down", "up"]},
                        {"type": "integer", "minimum": -100, "maximum": 100},
                    ]
                },
                "name": {"type": "string"},
            },
            "required": ["volume_step"],
            "additionalProperties": False,
        },
    ),
    _tool(
        "HassTurnOn",
        "Turns on/opens/presses a device or entity.",
        {
            "type": "object",
            "properties": {
                **TARGET,
                "device_class": {
                    "type": "array",
                    "items": {"type": "string", "enum": ["awning", "blind", "tv"]},
                },
            },
            "additionalProperties": False,
        },
    ),
]
HA_LINES = [
    "GetDateTime() - Provides the current date and time.",
    "GetLiveContext(name?: string, domain?: string | string[]) - Provides real-time "
    "information. // name: Filter entities by name. // domain: A single domain or a list.",
    "HassLightSet(name?: string, domain?: light[], temperature?: integer >=0, "
    "brightness?: integer 0..100) - Sets the brightness percentage or color of a light"
    " // brightness: The brightness percentage",
    "HassMediaPlayerMute(is_volume_muted?: any) - Mutes a media player"
    " // is_volume_muted: Whether to mute",
    "HassSetVolumeRelative(volume_step: down | up | integer -100..100, name?: string)"
    " - Increases or decreases the volume of a media player",
    "HassTurnOn(name?: string, area?: string, floor?: string, domain?: string[], "
    "device_class?: (awning | blind | tv)[]) - Turns on/opens/presses a device or entity.",
]

# What a signature cannot spell, beside what it can: each parameter's schema as JSON where
# its own keywords go beyond the compact form (its description still at the line's end).
EDGE_TOOL = _tool(
    "Edge",
    "Edge cases.",
    {
        "type": "object",
        "properties": {
            "nested": {
                "type": "object",
                "properties": {"x": {"type": "integer"}},
                "description": "A nested object.",
            },
            "when": {"type": "string", "format": "date-time"},
            "word": {"type": "string", "enum": ["one", "two words", "string", "1", "true", "ü"]},
            "level": {"type": "integer", "enum": [1, 2, 3]},
            "mixed": {"enum": ["a", 1, True, None]},
            "maybe": {"type": ["string", "null"]},
            "ratio": {"type": "number", "minimum": 0.5, "maximum": 1.5},
            "low": {"type": "integer", "maximum": 10},
            "levels": {"type": "array", "items": {"type": "integer", "minimum": 1}},
            "pairs": {
                "type": "array",
                "items": {"type": "object", "properties": {"k": {"type": "string"}}},
            },
            "some": {
                "type": "array",
                "items": {"type": "string"},
                "minItems": 1,
                "description": "At least one.",
            },
            "list": {"type": "array"},
            "either": {
                "anyOf": [
                    {"type": "string", "enum": ["down", "up"]},
                    {"type": "integer", "minimum": -100, "maximum": 100},
                ],
                "description": "Which way.",
            },
            "one_of": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
            "option": {
                "anyOf": [
                    {"type": "string", "description": "inner"},
                    {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}},
                ]
            },
            "anything": {},
        },
        "required": ["word", "either"],
    },
)
EDGE_LINE = (
    'Edge(nested?: {"type": "object", "properties": {"x": {"type": "integer"}}}, '
    'when?: {"type": "string", "format": "date-time"}, '
    'word: one | "two words" | "string" | "1" | "true" | "ü", '
    "level?: 1 | 2 | 3, mixed?: a | 1 | true | null, maybe?: string | null, "
    "ratio?: number 0.5..1.5, low?: integer <=10, levels?: (integer >=1)[], "
    'pairs?: {"type": "object", "properties": {"k": {"type": "string"}}}[], '
    'some?: {"type": "array", "items": {"type": "string"}, "minItems": 1}, list?: array, '
    "either: down | up | integer -100..100, "
    'one_of?: {"oneOf": [{"type": "string"}, {"type": "integer"}]}, '
    'option?: {"type": "string", "description": "inner"} | (a | b)[], anything?: any)'
    " - Edge cases. // nested: A nested object. // some: At least one. // either: Which way."
)
# Whole parameter objects the signature cannot spell: their JSON in the parentheses.
OPEN_TOOLS = [
    _tool(
        "Loose",
        "Extra keys allowed.",
        {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": True},
    ),
    _tool(
        "Missing",
        "A required key that is not a property.",
        {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]},
    ),
    _tool("NoDescription", None, {"type": "object", "properties": {"a": {"type": "boolean"}}}),
    _tool("EmptyDescription", "", {}),
]
OPEN_LINES = [
    'Loose({"type": "object", "properties": {"a": {"type": "string"}}, '
    '"additionalProperties": true}) - Extra keys allowed.',
    'Missing({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]})'
    " - A required key that is not a property.",
    "NoDescription(a?: boolean)",
    "EmptyDescription()",
]


@pytest.fixture(scope="module")
def formatter() -> ChatFormatter:
    """The engine's renderer over the tiny tokenizer, with the template under test."""
    tokenizer = AutoTokenizer.from_pretrained(prepare_tiny_model())
    tokenizer.chat_template = HERMES_CHATML_TEMPLATE
    return ChatFormatter(tokenizer)


def tool_lines(formatter: ChatFormatter, tools: list[dict[str, Any]]) -> list[str]:
    text = formatter.render([{"role": "system", "content": "S"}], tools)
    start = text.index(TOOLS_INTRO) + len(TOOLS_INTRO)
    return text[start : text.index("\n</tools>")].split("\n")[1:]


def household_tools() -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = json.loads(HOUSEHOLD.read_text())["agents"]["hearth"]["prefixes"][
        0
    ]["tools"]
    return tools


def test_home_assistant_tools_are_one_signature_a_line(formatter: ChatFormatter) -> None:
    assert tool_lines(formatter, HA_TOOLS) == HA_LINES


def test_what_a_signature_cannot_spell_is_written_as_json(formatter: ChatFormatter) -> None:
    assert tool_lines(formatter, [EDGE_TOOL]) == [EDGE_LINE]
    assert tool_lines(formatter, OPEN_TOOLS) == OPEN_LINES


def test_a_tool_without_the_function_wrapper_or_parameters(formatter: ChatFormatter) -> None:
    bare = {"name": "Bare", "description": "No wrapper.", "parameters": {"properties": {}}}
    assert tool_lines(formatter, [bare, _tool("None", "x", None)]) == [  # type: ignore[arg-type]
        "Bare() - No wrapper.",
        "None() - x",
    ]


def test_nothing_of_the_household_tools_is_lost(formatter: ChatFormatter) -> None:
    """Every name, enum value, bound and description of the demo house's 18 tools is on its
    line, and the lines are far shorter than the JSON they replace."""
    tools = household_tools()
    lines = tool_lines(formatter, tools)
    assert len(lines) == len(tools) == 18
    for tool, line in zip(tools, lines, strict=True):
        fn = tool["function"]
        assert line.startswith(fn["name"] + "(")
        assert fn["description"] in line
        for name, schema in fn["parameters"]["properties"].items():
            optional = "" if name in fn["parameters"].get("required", []) else "?"
            assert f"{name}{optional}: " in line
            if "description" in schema:
                assert f" // {name}: {schema['description']}" in line
            text = json.dumps(schema)
            for key in ("minimum", "maximum"):
                for value in _values(schema, key):
                    assert str(value) in line, (name, key)
            for values in _values(schema, "enum"):
                assert " | ".join(values) in line, (name, text)
    compact = sum(len(line) + 1 for line in lines)
    as_json = sum(len(json.dumps(tool)) + 1 for tool in tools)
    assert compact < 0.5 * as_json


def _values(schema: Any, key: str) -> list[Any]:
    """Every value of ``key`` anywhere in ``schema``."""
    if isinstance(schema, dict):
        found = [schema[key]] if key in schema else []
        return found + [v for child in schema.values() for v in _values(child, key)]
    if isinstance(schema, list):
        return [v for child in schema for v in _values(child, key)]
    return []


def test_the_same_tools_give_the_same_bytes_in_their_given_order(
    formatter: ChatFormatter,
) -> None:
    tools = [*HA_TOOLS, EDGE_TOOL]
    first = formatter.render([{"role": "system", "content": "S"}], tools)
    again = formatter.render([{"role": "system", "content": "S"}], copy.deepcopy(tools))
    assert first == again
    assert tool_lines(formatter, tools[::-1]) == [EDGE_LINE, *HA_LINES[::-1]]
    turn_on = copy.deepcopy(HA_TOOLS[-1])
    params = turn_on["function"]["parameters"]
    params["properties"] = dict(reversed(params["properties"].items()))
    assert tool_lines(formatter, [turn_on]) == [
        "HassTurnOn(device_class?: (awning | blind | tv)[], domain?: string[], floor?: string,"
        " area?: string, name?: string) - Turns on/opens/presses a device or entity."
    ]


def test_the_pinned_part_is_a_byte_and_token_prefix_of_a_conversation(
    formatter: ChatFormatter,
) -> None:
    tools = household_tools()
    house = [{"role": "system", "content": "You control a house."}]
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "HassTurnOn", "arguments": '{"name": "Kitchen Light"}'},
    }
    conversation = [
        *house,
        {"role": "system", "content": "Time: 10:42"},
        {"role": "user", "content": "turn on the kitchen light"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"success": true}'},
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "thanks"},
    ]
    pinned = formatter.render(house, tools, add_generation_prompt=False)
    whole = formatter.render(conversation, tools)
    assert whole.startswith(pinned)
    assert pinned.endswith("</tool_call><|im_end|>\n")
    prefix = formatter.encode(pinned)
    assert formatter.encode(whole)[: len(prefix)] == prefix
