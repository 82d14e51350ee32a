"""Voice satellites get HA's prompt and tools for their device class, from a pin.

A satellite that registered for timer events (as ESPHome and Wyoming satellites do,
through ``intent.async_register_timer_handler``) is offered HA's timer tools and is not
told it cannot start timers; its area line rides in the context message. The model's
tool call is scripted (``ScriptedToolCall``): tiny-tools only knows ``HassTurnOn``. The
request still runs in the real engine, so its cache figures are real, and HA runs the
real timer intent.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any
from unittest.mock import patch

from homeassistant.components.intent import TimerEventType, TimerInfo, async_register_timer_handler
from homeassistant.core import HomeAssistant
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers import llm
from homeassistant.helpers.aiohttp_client import async_get_clientsession
from homeassistant.setup import async_setup_component
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.hearth.backend.api import HearthClient, RequestUsage
from custom_components.hearth.backend.chat import ChatClient, async_create_chat_client
from custom_components.hearth.const import CONF_EXAMPLES
from custom_components.hearth.house.device_class import DeviceClass, device_lines
from custom_components.hearth.house.listing import replace_yaml
from custom_components.hearth.pins.model import pin_name
from custom_components.hearth.prefix.render import async_render_prefix, canonical_llm_context
from custom_components.hearth.tool_names import model_tool_names, with_shown_names

from .common import (
    EngineProcess,
    agent_options,
    async_setup_entry,
    converse,
    hearth_traces,
    make_entry,
)

NO_TIMERS_LINE = "This device is not able to start timers."
START_TIMER = "HassStartTimer"  # shown bare (prefix.model_tool_names)


class ScriptedToolCall:
    """The first reply of the engine becomes a scripted tool call.

    The request still goes to the engine and its stream is read to the end (usage,
    finish), only the model's own content and calls are replaced.
    """

    def __init__(self, name: str, arguments: dict[str, Any]) -> None:
        self.call = {"name": name, "arguments": json.dumps(arguments)}
        self.bodies: list[dict[str, Any]] = []
        self._original = ChatClient.async_chat_stream

    def __enter__(self) -> ScriptedToolCall:
        spy = self

        async def wrapper(client: ChatClient, body: Any) -> AsyncIterator[dict[str, Any]]:
            spy.bodies.append(json.loads(json.dumps(body)))
            scripted = len(spy.bodies) == 1
            async for chunk in spy._original(client, body):
                yield {**chunk, "choices": []} if scripted else chunk
            if scripted:
                delta = {"tool_calls": [{"index": 0, "id": "call_timer", "function": spy.call}]}
                yield {"choices": [{"index": 0, "delta": delta, "finish_reason": "tool_calls"}]}

        self._patch = patch.object(ChatClient, "async_chat_stream", wrapper)
        self._patch.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._patch.stop()


Events = list[tuple[TimerEventType, TimerInfo]]


async def _timer_satellite(hass: HomeAssistant, events: Events) -> str:
    """A device in the Kitchen that registered for timer events (like a satellite)."""
    assert await async_setup_component(hass, "intent", {})
    satellites = MockConfigEntry(domain="test")
    satellites.add_to_hass(hass)
    devices = dr.async_get(hass)
    device = devices.async_get_or_create(
        config_entry_id=satellites.entry_id, identifiers={("test", "kitchen_satellite")}
    )
    kitchen = ar.async_get(hass).async_get_area_by_name("Kitchen")
    devices.async_update_device(device.id, area_id=kitchen.id)
    async_register_timer_handler(hass, device.id, lambda kind, info: events.append((kind, info)))
    return device.id


async def test_timer_satellite_starts_a_timer_from_its_pin(
    hass: HomeAssistant, house: None, engine: EngineProcess
) -> None:
    """The satellite's request starts with its class's pin (>= 95 % reused), offers the
    timer tools, and the scripted HassStartTimer call starts a real timer on it."""
    events: Events = []
    device_id = await _timer_satellite(hass, events)
    entry = make_entry(engine.url)
    await async_setup_entry(hass, entry)
    subentry_id = next(iter(entry.subentries))
    name = pin_name(subentry_id, DeviceClass.TIMERS)
    assert name in engine.pins()  # pinned at start: the house has a timer device
    pinned = entry.runtime_data.prefixes.agent(subentry_id, DeviceClass.TIMERS).pinned

    with ScriptedToolCall(START_TIMER, {"minutes": 5}) as script:
        await converse(hass, "set a timer for five minutes", device_id=device_id)

    assert [kind for kind, _info in events] == [TimerEventType.STARTED]
    assert events[0][1].device_id == device_id
    assert events[0][1].seconds == 300
    first = script.bodies[0]
    offered = [tool["function"]["name"] for tool in first["tools"]]
    assert START_TIMER in offered
    assert first["tools"] == list(pinned.tools)
    assert first["messages"][0] == pinned.messages[0]
    assert NO_TIMERS_LINE not in pinned.system
    assert "You are in area" not in pinned.system
    context = first["messages"][1]["content"]
    assert "You are in area Kitchen" in context
    assert NO_TIMERS_LINE not in context

    turn = hearth_traces()[-1]
    assert turn["pin"] == name
    request = turn["requests"][0]
    assert request["pin"] == name
    assert request["cached_tokens"] >= 0.95 * request["prompt_tokens"]


async def test_no_device_keeps_its_own_pin(
    hass: HomeAssistant, house: None, engine: EngineProcess
) -> None:
    """A request without a device still gets HA's no-device lines and no timer tools."""
    await _timer_satellite(hass, [])
    entry = make_entry(engine.url)
    await async_setup_entry(hass, entry)
    await converse(hass, "hello")
    turn = hearth_traces()[-1]
    assert turn["pin"] == turn["requests"][0]["pin"] == pin_name(next(iter(entry.subentries)))
    pinned = entry.runtime_data.prefixes.agent(next(iter(entry.subentries))).pinned
    assert NO_TIMERS_LINE in pinned.class_lines  # closes the prefix (house/device_class.py)
    assert NO_TIMERS_LINE not in pinned.system
    assert START_TIMER not in [tool["function"]["name"] for tool in pinned.tools]


def _plain_satellite(hass: HomeAssistant, area: str) -> str:
    """A device with an Assist satellite entity in ``area`` that cannot start timers."""
    satellites = MockConfigEntry(domain="test")
    satellites.add_to_hass(hass)
    devices = dr.async_get(hass)
    device = devices.async_get_or_create(
        config_entry_id=satellites.entry_id, identifiers={("test", "plain_satellite")}
    )
    found = ar.async_get(hass).async_get_area_by_name(area)
    assert found is not None
    devices.async_update_device(device.id, area_id=found.id)
    er.async_get(hass).async_get_or_create(
        "assist_satellite", "test", "plain_satellite", device_id=device.id
    )
    return device.id


async def test_class_prefixes_share_the_house_and_close_with_their_own_lines(
    hass: HomeAssistant, house: None, engine: EngineProcess
) -> None:
    """With a timer satellite and a plain one, the three classes' prefixes have the same
    system message; HA's lines in which they differ close each prefix; nothing HA says
    is lost (each render is the prefix's lines plus the device's area line); and in the
    engine the second of two classes with the same tools prefills only its last lines."""
    assert await async_setup_component(hass, "conversation", {})
    timer_device = await _timer_satellite(hass, [])
    plain_device = _plain_satellite(hass, "Living Room")
    options = agent_options()
    none = await async_render_prefix(hass, options)
    plain = await async_render_prefix(hass, options, DeviceClass.NO_TIMERS, plain_device)
    timers = await async_render_prefix(hass, options, DeviceClass.TIMERS, timer_device)

    assert none.system == plain.system == timers.system
    assert NO_TIMERS_LINE not in none.system
    assert NO_TIMERS_LINE in none.class_lines and NO_TIMERS_LINE in plain.class_lines
    assert none.class_lines != plain.class_lines  # no device: asked to name an area
    assert timers.class_lines == ""
    assert none.tools == plain.tools and none.messages[:-1] == plain.messages[:-1]
    alone = await llm.async_get_api(hass, "assist", canonical_llm_context(hass))
    for prefix, device_id in ((none, None), (plain, plain_device), (timers, timer_device)):
        api = await llm.async_get_api(hass, "assist", canonical_llm_context(hass, device_id))
        shown = model_tool_names(tool.name for tool in api.tools)
        assert prefix.house is not None  # HA's YAML of the house is pinned as its listing
        listed = replace_yaml(api.api_prompt, prefix.house.yaml, prefix.house.listing)
        said = set(with_shown_names(listed, shown).split("\n"))
        area = device_lines(api.api_prompt, alone.api_prompt)
        assert all("You are in area" in line for line in area)
        kept = {*prefix.stable_text.split("\n"), *area}
        assert said <= kept  # every line HA renders for the device: pinned or in context
        others = {*none.class_lines.split("\n"), *plain.class_lines.split("\n")} - said
        assert not others & kept  # and no other class's line

    client = HearthClient(async_get_clientsession(hass), engine.url, None)
    marker = f"Measure {uuid.uuid4().hex}.\n"  # nothing cached by earlier tests
    for name, prefix in (("measure.none", none), ("measure.plain", plain)):
        body = prefix.pin_body()
        body["messages"][0] = {"role": "system", "content": marker + prefix.system}
        await client.async_put_prefix(name, body)
    pins = engine.pins()
    first, second = pins["measure.none"], pins["measure.plain"]
    print("class pin", second["tokens"], "tokens, prefilled", second["prefilled_tokens"])
    assert first["prefilled_tokens"] >= 0.9 * first["tokens"]  # the template's start is shared
    assert second["prefilled_tokens"] <= 0.05 * second["tokens"]


async def _reuse(client: ChatClient, system: str, tools: list[Any], context: str) -> float:
    """The share of a request's prompt (after ``system`` and ``tools``) served from the cache."""
    usage: RequestUsage | None = None
    messages = [{"role": "system", "content": system}]
    if context:
        messages.append({"role": "system", "content": context})
    messages.append({"role": "user", "content": "set a timer for five minutes"})
    body = {"messages": messages, "tools": tools, "max_tokens": 1, "stream": True}
    body["stream_options"] = {"include_usage": True}
    async for chunk in client.async_chat_stream(body):
        if chunk.get("usage"):
            usage = RequestUsage.from_usage(chunk["usage"])
    assert usage is not None
    print(f"prompt {usage.prompt_tokens} cached {usage.cached_tokens}")  # shown with -s
    return usage.cached_tokens / usage.prompt_tokens


async def test_class_pins_reuse_more_than_device_tools_in_the_suffix(
    hass: HomeAssistant, house: None, engine: EngineProcess
) -> None:
    """The measurement behind the choice of one pin per device class.

    (a) one pin per class; (b) one shared pin without any device-dependent line or
    tool, the timer tools appended after it and the lines in the context. Each
    layout's pins start with their own marker line so they share nothing in the cache.
    """
    assert await async_setup_component(hass, "conversation", {})
    device_id = await _timer_satellite(hass, [])
    options = agent_options()
    none = await async_render_prefix(hass, options)
    timers = await async_render_prefix(hass, options, DeviceClass.TIMERS, device_id)
    api = await llm.async_get_api(hass, "assist", canonical_llm_context(hass, device_id))
    alone = await llm.async_get_api(hass, "assist", canonical_llm_context(hass))
    (area_line,) = device_lines(api.api_prompt, alone.api_prompt)
    # The no-device lines a device in an area does not get (HA's "ask for the area").
    no_device_lines = device_lines(alone.api_prompt, api.api_prompt)
    no_device_lines = [line for line in no_device_lines if line != NO_TIMERS_LINE]
    shared = "\n".join(
        line
        for line in none.system.splitlines()
        if line not in no_device_lines and line != NO_TIMERS_LINE
    )
    timer_tools = [tool for tool in timers.tools if tool not in none.tools]
    assert timer_tools
    client = HearthClient(async_get_clientsession(hass), engine.url, None)

    a_timers, a_none = "Layout A.\n" + timers.system, "Layout A.\n" + none.system
    b_shared = "Layout B.\n" + shared
    for pin, system, tools in (
        ("measure.a.timers", a_timers, timers.tools),
        ("measure.a.none", a_none, none.tools),
        ("measure.b", b_shared, none.tools),
    ):
        body = {"messages": [{"role": "system", "content": system}], "tools": list(tools)}
        await client.async_put_prefix(pin, body)
    chat = await async_create_chat_client(hass, engine.url, None, None)

    b_no_device_context = "\n".join([*no_device_lines, NO_TIMERS_LINE])
    reuse = {
        "a_timer_device": await _reuse(chat, a_timers, list(timers.tools), area_line),
        "a_no_device": await _reuse(chat, a_none, list(none.tools), ""),
        "b_timer_device": await _reuse(chat, b_shared, [*none.tools, *timer_tools], area_line),
        "b_no_device": await _reuse(chat, b_shared, list(none.tools), b_no_device_context),
    }
    print("reuse", {key: round(value, 4) for key, value in reuse.items()})
    assert reuse["a_timer_device"] >= 0.95
    assert reuse["a_timer_device"] > reuse["b_timer_device"]
    assert reuse["a_no_device"] >= reuse["b_no_device"]


async def test_new_class_is_pinned_at_its_first_request(
    hass: HomeAssistant, house: None, engine: EngineProcess
) -> None:
    """A device HA did not know as a satellite: its first request goes without a pin (the
    trace says so), and pins its class for the next ones. (In an area: a class whose
    devices are in none renders as no device does, the same tokens as that pin.)"""
    entry = make_entry(engine.url)
    await async_setup_entry(hass, entry)
    satellites = MockConfigEntry(domain="test")
    satellites.add_to_hass(hass)
    kitchen = ar.async_get(hass).async_get_area_by_name("Kitchen")
    assert kitchen is not None
    device = dr.async_get(hass).async_get_or_create(
        config_entry_id=satellites.entry_id, identifiers={("test", "phone")}
    )
    dr.async_get(hass).async_update_device(device.id, area_id=kitchen.id)
    await hass.async_block_till_done(wait_background_tasks=True)
    name = pin_name(next(iter(entry.subentries)), DeviceClass.NO_TIMERS)
    assert name not in engine.pins()

    await converse(hass, "hello", device_id=device.id)
    assert hearth_traces()[-1]["pin"] is None
    await hass.async_block_till_done(wait_background_tasks=True)
    assert name in engine.pins()
    await converse(hass, "hello", device_id=device.id)
    turn = hearth_traces()[-1]
    assert turn["pin"] == turn["requests"][0]["pin"] == name


async def test_a_timer_satellite_pin_shows_a_timer_example(
    hass: HomeAssistant, house: None
) -> None:
    """The timer class's prefix offers HassStartTimer, so its worked examples show one."""
    assert await async_setup_component(hass, "conversation", {})
    device_id = await _timer_satellite(hass, [])
    options = agent_options(**{CONF_EXAMPLES: True})
    none = await async_render_prefix(hass, options)
    timers = await async_render_prefix(hass, options, DeviceClass.TIMERS, device_id)

    def called(prefix: Any) -> list[str]:
        return [
            call["function"]["name"]
            for message in prefix.examples
            for call in message.get("tool_calls", ())
        ]

    assert START_TIMER in called(timers)
    assert START_TIMER not in called(none)
