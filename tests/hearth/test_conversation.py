"""Conversation turns through Home Assistant against a real engine (tiny-tools).

``tiny-tools`` answers ``Hello from Hearth.`` to anything but ``turn on the kitchen
light``, which it answers with a ``HassTurnOn`` tool call; after the tool result it
says ``Done, the light is on.``. Nothing is mocked: ``ChatSpy`` only records the
request bodies on their way to the engine.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any
from unittest.mock import patch

from freezegun.api import FrozenDateTimeFactory
from homeassistant.components.conversation import trace as conversation_trace
from homeassistant.components.homeassistant.exposed_entities import async_expose_entity
from homeassistant.core import HomeAssistant
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers import intent, llm
from homeassistant.setup import async_setup_component
from homeassistant.util import dt as dt_util
from pytest_homeassistant_custom_component.common import MockConfigEntry, async_fire_time_changed

from custom_components.hearth.backend.chat import ChatClient
from custom_components.hearth.const import CONF_MAX_TOKENS, CONF_TOOL_FIRST
from custom_components.hearth.house.device_class import DeviceClass
from custom_components.hearth.pins.model import pin_name
from custom_components.hearth.prefix.render import async_render_prefix
from custom_components.hearth.prefix.value import HousePrefix

from .common import (
    KITCHEN_LIGHT,
    KITCHEN_SWITCH,
    ChatSpy,
    EngineProcess,
    agent_options,
    async_setup_entry,
    converse,
    hearth_traces,
    make_entry,
    speech,
)

REPLY = "Hello from Hearth."
DONE = "Done, the light is on."
TIME_PROMPT = (
    "You are Hearth, the voice of {{ ha_name }}.\nThe time is {{ now().strftime('%H:%M:%S') }}.\n"
)


def _agent(entry: MockConfigEntry) -> str:
    return next(iter(entry.subentries))


async def test_turns_reuse_the_cache(hass: HomeAssistant, entry: MockConfigEntry) -> None:
    """Turn 1 hits the pinned house prefix; turn 2 reuses all of turn 1 (>= 90 %)."""
    name = pin_name(_agent(entry))
    pinned_tokens = entry.runtime_data.prefixes.agent(_agent(entry)).tokens
    assert pinned_tokens
    assert pinned_tokens > 1000

    first = await converse(hass, "hello")
    assert speech(first) == REPLY
    turn1 = hearth_traces()[-1]
    assert turn1["requests"][0]["pin"] == name
    assert turn1["cached_tokens"] >= pinned_tokens
    assert turn1["ttft_ms"] > 0

    second = await converse(hass, "what time is it", first.conversation_id)
    assert speech(second) == REPLY
    assert second.conversation_id == first.conversation_id
    turn2 = hearth_traces()[-1]
    assert turn2["cached_tokens"] >= 0.9 * turn2["prompt_tokens"]
    # Not only the house prefix: all of turn 1 (prompt and reply) came from the cache.
    assert turn2["cached_tokens"] >= turn1["prompt_tokens"]

    state = hass.states.get("sensor.hearth_engine_last_ttft")
    assert state is not None
    assert float(state.state) == round(turn2["ttft_ms"], 3)
    assert state.attributes["prompt_tokens"] == turn2["prompt_tokens"]
    assert state.attributes["cached_tokens"] == turn2["cached_tokens"]


async def test_history_is_resent_verbatim(hass: HomeAssistant, entry: MockConfigEntry) -> None:
    """Turn 2's request starts with turn 1's request and the reply as generated.

    (With a context message before the user text, tiny-tools' reply is not reliably
    its scripted one, so the reply text is taken from the stream, not assumed.)
    """
    with ChatSpy() as spy:
        first = await converse(hass, "hello", extra_system_prompt="The user is Anne.")
        await converse(hass, "hello again", first.conversation_id)
    turn1, turn2 = spy.bodies
    sent = turn1["messages"]
    assert sent[1] == {"role": "system", "content": "The user is Anne."}
    assert turn2["messages"][: len(sent)] == sent
    assert turn2["messages"][len(sent)]["content"] == spy.replies[0] == speech(first)
    assert turn2["messages"][-1] == {"role": "user", "content": "hello again"}
    # HA keeps the extra prompt for the conversation: it is context, never prefix.
    assert turn2["messages"][-2] == {"role": "system", "content": "The user is Anne."}
    assert turn1["tools"] == turn2["tools"]


async def test_tool_loop_turns_on_the_light(hass: HomeAssistant, entry: MockConfigEntry) -> None:
    """The model calls HassTurnOn; HA runs the intent; the light really turns on; the
    turn says what HA reports, in HA's own words (not the model's "Done, ...")."""
    assert hass.states.get(KITCHEN_LIGHT).state == "off"
    with ChatSpy() as spy:
        result = await converse(hass, "turn on the kitchen light")

    assert speech(result) == "Turned on the light"
    assert hass.states.get(KITCHEN_LIGHT).state == "on"
    assert hass.states.get(KITCHEN_SWITCH).state == "on"
    assert result.response.response_type is intent.IntentResponseType.ACTION_DONE
    assert [target.id for target in result.response.success_results] == [KITCHEN_LIGHT]

    # One request: the call. After the action, the turn says HA's result.
    (body,) = spy.bodies
    assert body["tool_choice"] not in (None, "auto")  # a command acts (turn/policy.py)
    assert spy.replies == [""]

    events = conversation_trace.async_get_traces()[-1].as_dict()["events"]
    calls = [e["data"] for e in events if e["event_type"] == "tool_call"]
    assert calls == [{"tool_name": "intent__HassTurnOn", "tool_args": {"name": "Kitchen Light"}}]
    turn = hearth_traces()[-1]
    assert len(turn["requests"]) == 1
    assert turn["command"] and turn["named"] == ["kitchen", "kitchen light"]

    # The next turn re-sends the call, its result and the spoken reply.
    with ChatSpy() as spy:
        await converse(hass, "hello", result.conversation_id)
    sent = spy.bodies[0]["messages"]
    at = next(i for i, message in enumerate(sent) if message.get("tool_calls"))
    call_message, tool_message, said = sent[at : at + 3]
    assert call_message["tool_calls"][0]["function"] == {
        # The model is shown, and calls, the bare name; HA's own name runs (above).
        "name": "HassTurnOn",
        "arguments": '{"name": "Kitchen Light"}',
    }
    assert tool_message["role"] == "tool"
    assert json.loads(tool_message["content"])["data"]["success"][0]["id"] == KITCHEN_LIGHT
    assert said == {"role": "assistant", "content": "Turned on the light"}


async def test_prefix_is_identical_across_time_and_satellites(
    hass: HomeAssistant, house: None, engine: EngineProcess
) -> None:
    """Time, satellite area and extra prompt go to the context message, never the prefix.

    The instructions read the time, and the Assist API prompt names the speaking
    satellite's area: HA puts both into its system prompt; the integration must
    move them out of the pinned prefix. Satellites without timers share their class's
    pin, which says what HA says to them ("not able to start timers") and not what it
    says only without a device ("ask the user to specify an area").
    """
    config_entry = make_entry(engine.url, prompt=TIME_PROMPT)
    await async_setup_entry(hass, config_entry)
    devices = dr.async_get(hass)
    areas = ar.async_get(hass)
    satellites = MockConfigEntry(domain="test")
    satellites.add_to_hass(hass)
    kitchen = devices.async_get_or_create(
        config_entry_id=satellites.entry_id, identifiers={("test", "kitchen")}
    )
    devices.async_update_device(kitchen.id, area_id=areas.async_get_area_by_name("Kitchen").id)
    living = devices.async_get_or_create(
        config_entry_id=satellites.entry_id, identifiers={("test", "living")}
    )
    devices.async_update_device(living.id, area_id=areas.async_get_area_by_name("Living Room").id)
    entities = er.async_get(hass)
    for device in (kitchen, living):  # Assist satellites: their class is pinned up front
        entities.async_get_or_create(
            "assist_satellite", "test", device.id, device_id=device.id, config_entry=satellites
        )
    async_fire_time_changed(hass, dt_util.utcnow() + timedelta(seconds=60))  # the new pin
    await hass.async_block_till_done(wait_background_tasks=True)
    name = pin_name(_agent(config_entry), DeviceClass.NO_TIMERS)
    assert name in engine.pins()

    with ChatSpy() as spy:
        await converse(hass, "hello", device_id=kitchen.id, extra_system_prompt="The user is Anne.")
        await asyncio.sleep(1.1)  # the time in the instructions changes
        await converse(hass, "hello", device_id=living.id)
    body_a, body_b = spy.bodies[0], spy.bodies[-1]
    prefix_a = json.dumps([body_a["messages"][0], body_a["tools"]]).encode()
    prefix_b = json.dumps([body_b["messages"][0], body_b["tools"]]).encode()
    assert prefix_a == prefix_b
    pinned = config_entry.runtime_data.prefixes.agent(_agent(config_entry), DeviceClass.NO_TIMERS)
    assert pinned is not None and pinned.pinned is not None
    assert prefix_a == json.dumps([pinned.pinned.messages[0], list(pinned.pinned.tools)]).encode()
    for volatile in ("You are in area", "The time is", "Anne", "specify an area"):
        assert volatile not in pinned.pinned.system
    assert "This device is not able to start timers." in pinned.pinned.system
    no_device = await entry_prefix(hass, config_entry)  # its own line closes its prefix
    assert "ask the user to specify an area" in no_device.class_lines
    assert no_device.system == pinned.pinned.system  # the house is shared

    context_a, context_b = body_a["messages"][1]["content"], body_b["messages"][1]["content"]
    assert "You are in area Kitchen" in context_a
    assert "The user is Anne." in context_a
    assert "You are in area Living Room" in context_b
    assert "Anne" not in context_b
    time_a = next(line for line in context_a.splitlines() if line.startswith("The time is"))
    time_b = next(line for line in context_b.splitlines() if line.startswith("The time is"))
    assert time_a != time_b
    # Both requests hit the class's pin.
    assert [turn["requests"][0]["pin"] for turn in hearth_traces()[-2:]] == [name, name]
    assert [turn["pin"] for turn in hearth_traces()[-2:]] == [name, name]


async def test_tool_first_makes_the_first_request_call_a_tool(
    hass: HomeAssistant, house: None, engine: EngineProcess
) -> None:
    """With "Start each turn with a tool call", "hello" (which tiny-tools answers in
    words) must start with a call: the engine's grammar forces one. No later request
    is forced to call, so the turn still ends in words (HA's, after an action)."""
    config_entry = make_entry(engine.url, **{CONF_TOOL_FIRST: True})
    await async_setup_entry(hass, config_entry)
    with ChatSpy() as spy:
        result = await converse(hass, "hello")
    first, *rest = spy.bodies
    assert first["tool_choice"] == "required"
    assert all(body.get("tool_choice") in {None, "none"} for body in rest)
    # The first reply is a call (run, or, naming a thing "hello" does not say, refused
    # with a result the model reads: turn/prepare.py); the next request carries it.
    (*_, called) = [m for m in rest[0]["messages"] if m.get("tool_calls")]
    assert called["tool_calls"][0]["function"]["name"] in {
        t["function"]["name"] for t in first["tools"]
    }
    assert speech(result)


async def test_without_tool_first_the_model_may_answer_in_words(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    with ChatSpy() as spy:
        result = await converse(hass, "hello")
    (body,) = spy.bodies
    assert "tool_choice" not in body
    assert speech(result) == REPLY


async def entry_prefix(hass: HomeAssistant, config_entry: MockConfigEntry) -> HousePrefix:
    """The prefix the entry's agent pins."""
    return await config_entry.runtime_data.prefixes.async_render(_agent(config_entry))


async def test_prefix_render_ignores_time(
    hass: HomeAssistant, house: None, freezer: FrozenDateTimeFactory
) -> None:
    """Rendered twice at different times: identical bytes (time-reading instructions
    are left out, the static instructions stay in)."""
    assert await async_setup_component(hass, "conversation", {})
    timed = agent_options(prompt=TIME_PROMPT)
    static = agent_options()
    freezer.move_to("2026-11-29 08:00:00")
    timed_1, static_1 = (
        await async_render_prefix(hass, timed),
        await async_render_prefix(hass, static),
    )
    freezer.move_to("2026-11-29 21:17:43")
    timed_2, static_2 = (
        await async_render_prefix(hass, timed),
        await async_render_prefix(hass, static),
    )
    assert timed_1.data == timed_2.data
    assert static_1.data == static_2.data
    assert "The time is" not in timed_1.system
    assert static_1.system.startswith(llm.DEFAULT_INSTRUCTIONS_PROMPT)
    names = [tool["function"]["name"] for tool in static_1.tools]
    assert names == sorted(names)
    # Bare names (prefix.model_tool_names): "intent__HassTurnOn" is shown as HassTurnOn.
    assert "HassTurnOn" in names and "intent__HassTurnOn" not in names


async def test_engine_error_is_a_spoken_error(
    hass: HomeAssistant, house: None, engine: EngineProcess
) -> None:
    """A request the engine refuses (context length) becomes a translated error that
    says what helps: here the max tokens per reply, larger than the model's whole
    context (the conversation is one line long; turn/context_fit.py)."""
    config_entry = make_entry(engine.url, **{CONF_MAX_TOKENS: 40000})  # > 32k context
    await async_setup_entry(hass, config_entry)
    result = await converse(hass, "hello")
    assert result.response.response_type is intent.IntentResponseType.ERROR
    assert speech(result) == (
        "Sorry, the agent's max tokens per reply fill the model's whole context. "
        "Lower that setting in the agent's options."
    )


async def test_requests_carry_the_house_names_for_the_grammar(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    """Tool calls may only name what the house has: exposed entities (with aliases),
    areas, floors and domains go to the engine's grammar, scoped to the entity tools
    (a timer's name stays free). Unexposed entities are not among them."""
    er.async_get(hass).async_update_entity(KITCHEN_LIGHT, aliases={"Cooker Light"})
    async_fire_time_changed(hass, dt_util.utcnow() + timedelta(seconds=60))  # the re-pin
    await hass.async_block_till_done(wait_background_tasks=True)
    with ChatSpy() as spy:
        await converse(hass, "hello")
    extension = spy.bodies[0]["hearth"]
    values = extension["argument_values"]
    assert values["name"] == ["Cooker Light", "Kitchen Light"]  # not "Power" (unexposed)
    assert values["area"] == ["Kitchen", "Living Room"]
    assert values["domain"] == ["light"]
    # One-domain intents name only that domain's entities (here: the lights).
    assert values["HassLightSet.name"] == ["Cooker Light", "Kitchen Light"]
    assert not [key for key in values if key.startswith(("HassListAddItem", "HassVacuum"))]
    tools = extension["argument_tools"]
    assert "HassTurnOn" in tools
    assert not [name for name in tools if "Timer" in name]
    offered = {tool["function"]["name"] for tool in spy.bodies[0]["tools"]}
    assert set(tools) <= offered


async def test_a_call_on_a_thing_the_request_did_not_name_is_not_run(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    """Asked about the kitchen light, a call that turns on the porch lamp is not run:
    the model reads why, and Assist says it did not understand. Said later in the same
    conversation ("and the other one"), it runs. tiny-tools always names the kitchen
    light, so its call is rewritten here to stand for a model that picked another thing
    (the engine and Home Assistant are real)."""
    hass.states.async_set("light.porch", "off", {"friendly_name": "Porch Lamp"})
    async_expose_entity(hass, "conversation", "light.porch", True)
    original = ChatClient.async_chat_stream
    bodies: list[dict[str, Any]] = []

    async def porch_instead(client: ChatClient, body: Any) -> Any:
        bodies.append(json.loads(json.dumps(body)))
        first = len(bodies) == 1 or body["messages"][-1]["role"] == "user"
        async for chunk in original(client, body):
            for choice in chunk.get("choices") or ():
                for call in (choice.get("delta") or {}).get("tool_calls") or ():
                    arguments = (call.get("function") or {}).get("arguments")
                    if first and arguments:
                        call["function"]["arguments"] = arguments.replace(
                            "Kitchen Light", "Porch Lamp"
                        )
            yield chunk

    with patch.object(ChatClient, "async_chat_stream", porch_instead):
        result = await converse(hass, "turn on the kitchen light")
        events = conversation_trace.async_get_traces()[-1].as_dict()["events"]
        assert [e for e in events if e["event_type"] == "tool_call"] == []  # not run
        assert hass.states.get(KITCHEN_LIGHT).state == "off"
        tool_message = bodies[1]["messages"][-1]
        assert json.loads(tool_message["content"])["error"] == "NotRequested"
        assert speech(result) == "Sorry, I couldn't understand that"
        # A later turn may refer back to what an earlier one said: not judged.
        later = await converse(hass, "turn on the kitchen light too", result.conversation_id)
    # (a state without a light platform: HA reports the call, the state stays)
    assert [t.name for t in later.response.success_results] == ["Porch Lamp"]


async def test_a_first_turn_may_name_only_what_shares_a_word_with_it(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    """The grammar offers a spoken first turn's calls only the names the refusal above
    lets through: "the lamp" may be the porch lamp, not the kitchen light. A later turn
    may refer back ("turn that one off too"): every name."""
    hass.states.async_set("light.porch", "off", {"friendly_name": "Porch Lamp"})
    async_expose_entity(hass, "conversation", "light.porch", True)
    with ChatSpy() as spy:
        first = await converse(hass, "turn on the lamp")
        await converse(hass, "and that one too", first.conversation_id)
    values = [body["hearth"]["argument_values"] for body in spy.bodies]
    assert values[0]["HassTurnOn.name"] == ["Porch Lamp"]
    assert values[0]["HassTurnOff.name"] == ["Porch Lamp"]
    later = values[-1]
    assert later.get("HassTurnOn.name", later["name"]) == ["Kitchen Light", "Porch Lamp"]


async def test_invalid_tool_arguments_are_a_tool_error_the_model_reads(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    """A call whose arguments are not JSON is not run with no arguments: the model gets
    a tool result saying so, and the loop goes on to its next request."""
    original = ChatClient.async_chat_stream
    bodies: list[dict[str, Any]] = []

    async def broken_first_call(client: ChatClient, body: Any) -> Any:
        bodies.append(json.loads(json.dumps(body)))
        async for chunk in original(client, body):
            if len(bodies) == 1:  # the engine's call, its JSON cut short
                for choice in chunk.get("choices") or ():
                    for call in (choice.get("delta") or {}).get("tool_calls") or ():
                        if args := (call.get("function") or {}).get("arguments"):
                            call["function"]["arguments"] = args[:-1]
            yield chunk

    with patch.object(ChatClient, "async_chat_stream", broken_first_call):
        await converse(hass, "turn on the kitchen light")

    assert hass.states.get(KITCHEN_LIGHT).state == "off"  # nothing ran
    events = conversation_trace.async_get_traces()[-1].as_dict()["events"]
    assert [e for e in events if e["event_type"] == "tool_call"] == []
    assert len(bodies) == 2  # the loop went on
    call_message, tool_message = bodies[1]["messages"][-2:]
    assert call_message["tool_calls"][0]["function"]["arguments"] == '{"name": "Kitchen Light"'
    assert tool_message["role"] == "tool"
    assert tool_message["tool_call_id"] == call_message["tool_calls"][0]["id"]
    result = json.loads(tool_message["content"])
    assert result["error"] == "InvalidToolArguments"
    assert "not valid JSON" in result["error_text"]
