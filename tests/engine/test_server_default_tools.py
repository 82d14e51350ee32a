"""The default model behind ``serve``, offered the demo house's 18 Home Assistant tools:
the prompt carries them as compact signatures (far fewer tokens than their JSON), and a
request shaped as the integration sends it (one tool allowed, the house's names) gets a
valid call of that tool through Home Assistant's own schemas (``anyOf``, arrays of
enums, ranges)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from transformers import AutoTokenizer

from hearth_engine.model.prepare.default import prepare_default_model

from .conftest import Client, ServerProcess
from .constrained import call_errors
from .test_tool_signatures import household_tools

pytest.importorskip("llguidance")

SYSTEM = {"role": "system", "content": "You control a smart home: Kitchen Light, Kitchen Radio."}
# What the integration sends with each request: one tool allowed, the house's names.
REQUESTS = {
    "turn on the kitchen light": ("HassTurnOn", "Kitchen Light"),
    "set the kitchen light to 40 percent brightness": ("HassLightSet", "Kitchen Light"),
    "turn the kitchen radio down": ("HassSetVolumeRelative", "Kitchen Radio"),
    "pause the kitchen radio": ("HassMediaPause", "Kitchen Radio"),
}


@pytest.fixture(scope="module")
def server(server_factory: Any) -> ServerProcess:
    return server_factory("--model", "default")


async def test_the_tools_cost_less_than_half_their_json(client: Client) -> None:
    tools = household_tools()
    tokenizer = AutoTokenizer.from_pretrained(prepare_default_model(packed=True))
    as_json = len(tokenizer("".join("\n" + json.dumps(t) for t in tools))["input_ids"])
    reply = await client.chat(
        messages=[SYSTEM, {"role": "user", "content": "hi"}], tools=tools, max_tokens=1
    )
    without = await client.chat(messages=[SYSTEM, {"role": "user", "content": "hi"}], max_tokens=1)
    listed = reply["usage"]["prompt_tokens"] - without["usage"]["prompt_tokens"]
    assert 0 < listed < 0.5 * as_json, (listed, as_json)


@pytest.mark.parametrize("text", REQUESTS)
async def test_a_required_call_is_a_valid_call_of_the_allowed_tool(
    client: Client, text: str
) -> None:
    tools = household_tools()
    tool, name = REQUESTS[text]
    allowed = {"mode": "required", "tools": [{"type": "function", "function": {"name": tool}}]}
    reply = await client.chat(
        messages=[SYSTEM, {"role": "user", "content": text}],
        tools=tools,
        tool_choice={"type": "allowed_tools", "allowed_tools": allowed},
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=120,
        hearth={
            "argument_values": {"name": [name], "area": ["Kitchen"], "floor": ["Ground Floor"]},
            "argument_tools": [tool],
            "required_arguments": ["name"],
        },
    )
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    calls = choice["message"]["tool_calls"]
    assert [call["function"]["name"] for call in calls] == [tool], calls
    arguments = calls[0]["function"]["arguments"]
    assert call_errors(tool, arguments, tools) == [], arguments
    assert json.loads(arguments)["name"] == name
