"""The turn policy through real Home Assistant and a real engine (tiny-tools): shared
names resolve to one thing, speech says what HA did, questions read the house only when
they name it, and a failed call is never spoken as done.

tiny-tools calls ``HassTurnOn {"name": "Kitchen Light"}`` for any "turn on the kitchen
...", and says "Done, the light is on." after any tool result (common.py).
"""

from __future__ import annotations

from homeassistant.components.conversation import trace as conversation_trace
from homeassistant.components.homeassistant.exposed_entities import async_expose_entity
from homeassistant.core import HomeAssistant
from homeassistant.setup import async_setup_component
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.hearth.const import CONF_READ_FIRST

from .common import (
    KITCHEN_LIGHT,
    ChatSpy,
    EngineProcess,
    async_setup_entry,
    converse,
    hearth_traces,
    make_entry,
    speech,
)


def tool_calls() -> list[dict[str, object]]:
    events = conversation_trace.async_get_traces()[-1].as_dict()["events"]
    return [e["data"] for e in events if e["event_type"] == "tool_call"]


async def test_a_name_a_switch_shares_with_the_light_resolves_to_the_light(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    """Two exposed things named "Kitchen Light": HA alone rejects the call ("Multiple
    entities share the name"); the call carries the light's domain and acts."""
    hass.states.async_set("switch.kitchen_light", "off", {"friendly_name": "Kitchen Light"})
    async_expose_entity(hass, "conversation", "switch.kitchen_light", True)
    result = await converse(hass, "turn on the kitchen light")
    assert hass.states.get(KITCHEN_LIGHT).state == "on"
    assert tool_calls() == [
        {
            "tool_name": "intent__HassTurnOn",
            "tool_args": {"name": "Kitchen Light", "domain": ["light"]},
        }
    ]
    assert speech(result) == "Turned on the light"


async def test_a_wrong_target_is_said_as_what_it_was(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    """Asked for the kitchen fan, the model switched on the Kitchen Light: the reply
    says that, not "Done."."""
    result = await converse(hass, "turn on the kitchen fan")
    assert hass.states.get(KITCHEN_LIGHT).state == "on"
    assert speech(result) == "Turned on the light: Kitchen Light."


async def test_a_failed_call_is_said_as_ha_says_it_never_done(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    """Two lights of one name and nothing to tell them apart: HA refuses the call;
    what the model says next is not spoken (it asks nothing): HA's error sentence is."""
    hass.states.async_set("light.kitchen_light_2", "off", {"friendly_name": "Kitchen Light"})
    async_expose_entity(hass, "conversation", "light.kitchen_light_2", True)
    with ChatSpy() as spy:
        result = await converse(hass, "turn on the kitchen light")
    assert hass.states.get(KITCHEN_LIGHT).state == "off"
    result_message = spy.bodies[1]["messages"][-1]
    assert result_message["role"] == "tool"
    assert "Multiple entities share the name" in result_message["content"]
    model_said = spy.replies[-1]  # whatever the model says next ("Hello from Hearth.") ...
    said = speech(result)
    assert said == "Sorry, there are multiple devices called Kitchen Light"  # ... HA's is said
    assert model_said and model_said != said
    assert len(spy.bodies) <= 3


async def test_only_a_question_about_the_house_reads_it_first(
    hass: HomeAssistant, house: None, engine: EngineProcess
) -> None:
    """ "Tell me a joke?" names nothing of the house: it is not sent the house's live
    context; "did I leave the kitchen light on?" reads it first (HA answers its own
    sentences, "is the kitchen light on?", itself: turn/ha_answer.py)."""
    assert await async_setup_component(hass, "conversation", {})
    await async_setup_entry(hass, make_entry(engine.url, **{CONF_READ_FIRST: True}))
    with ChatSpy() as spy:
        await converse(hass, "tell me a joke?")
        await converse(hass, "did I leave the kitchen light on?")
    joke, house = spy.bodies[0], spy.bodies[1]
    assert joke["tool_choice"]["allowed_tools"]["mode"] == "auto"  # not forced to read
    assert house["tool_choice"]["function"]["name"].endswith("GetLiveContext")
    assert [t["read_first"] for t in hearth_traces()[-2:]] == [False, True]


async def test_chat_naming_nothing_is_not_forced_to_act(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    with ChatSpy() as spy:
        result = await converse(hass, "hello")
    (body,) = spy.bodies
    assert "tool_choice" not in body
    assert speech(result) == "Hello from Hearth."
    assert hass.states.get(KITCHEN_LIGHT).state == "off"
