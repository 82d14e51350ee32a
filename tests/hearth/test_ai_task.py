"""AI Task: ``ai_task.generate_data`` through a real engine, the subentry flow, errors.

The engine's test model has random weights, so what it writes means nothing; under a
``json_schema`` response format its grammar still guarantees JSON that fits the schema,
and that is what these tests check.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from homeassistant.components import ai_task
from homeassistant.components.ai_task.const import DEFAULT_SYSTEM_PROMPT as AI_TASK_SYSTEM_PROMPT
from homeassistant.components.ai_task.services import _validate_structure_fields
from homeassistant.components.conversation import trace as conversation_trace
from homeassistant.config_entries import SOURCE_USER, ConfigSubentryData
from homeassistant.const import CONF_NAME, CONF_URL
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.exceptions import HomeAssistantError
from homeassistant.setup import async_setup_component
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.hearth.ai_task import response_format
from custom_components.hearth.const import (
    CONF_MAX_TOKENS,
    CONF_TEMPERATURE,
    DOMAIN,
    RECOMMENDED_AI_TASK_OPTIONS,
    SUBENTRY_AI_TASK,
    SUBENTRY_CONVERSATION,
)
from custom_components.hearth.pins.model import pin_name

from .common import (
    ChatSpy,
    EngineProcess,
    agent_options,
    async_setup_entry,
    hearth_traces,
    make_entry,
)

TASK_ENTITY = "ai_task.hearth_ai_task"

# What an automation writes under ``structure:`` (ai_task.generate_data's YAML form).
# Selects and booleans only: their JSON is short by construction, so even a random
# model finishes it well within the token limit.
STRUCTURE: dict[str, Any] = {
    "mood": {
        "description": "How the house feels",
        "required": True,
        "selector": {"select": {"options": ["calm", "busy", "asleep"]}},
    },
    "lights_on": {"required": True, "selector": {"boolean": {}}},
    "room": {"selector": {"select": {"options": ["kitchen", "living_room"]}}},
}
# An entity selector's schema has "format": "entity_id", which the engine's compiler
# refuses: the integration turns it into a pattern.
ENTITY_STRUCTURE: dict[str, Any] = {
    **STRUCTURE,
    "light": {"required": True, "selector": {"entity": {"domain": "light"}}},
}


def _entry(url: str, **task_options: Any) -> MockConfigEntry:
    """A Hearth entry with its default agent ("Hearth") and one AI Task."""
    return MockConfigEntry(
        domain=DOMAIN,
        title="Hearth",
        data={CONF_URL: url},
        unique_id=url,
        subentries_data=[
            ConfigSubentryData(
                data=agent_options(),
                subentry_type=SUBENTRY_CONVERSATION,
                title="Hearth",
                unique_id=None,
            ),
            ConfigSubentryData(
                data={**RECOMMENDED_AI_TASK_OPTIONS, **task_options},
                subentry_type=SUBENTRY_AI_TASK,
                title="Hearth AI Task",
                unique_id=None,
            ),
        ],
    )


async def _generate(hass: HomeAssistant, **data: Any) -> dict[str, Any]:
    """Call ``ai_task.generate_data`` as an automation does."""
    response = await hass.services.async_call(
        ai_task.DOMAIN,
        "generate_data",
        {"task_name": "House summary", "entity_id": TASK_ENTITY, **data},
        blocking=True,
        return_response=True,
    )
    assert response is not None
    return dict(response)


@pytest.fixture
async def task_entry(hass: HomeAssistant, house: None, engine: EngineProcess) -> MockConfigEntry:
    """A loaded entry on the shared engine with an AI Task."""
    entry = _entry(engine.url)
    await async_setup_entry(hass, entry)
    return entry


async def test_structured_data_fits_the_structure(
    hass: HomeAssistant, task_entry: MockConfigEntry
) -> None:
    """An automation's generate_data with a structure (run by a real script, as the YAML
    is written): a strict json_schema response format; the data fits the structure."""
    action = {
        "action": "ai_task.generate_data",
        "data": {
            "task_name": "House summary",
            "entity_id": TASK_ENTITY,
            "instructions": "Summarize the house.",
            "structure": STRUCTURE,
        },
        "response_variable": "summary",
    }
    sequence = [action, {"stop": "done", "response_variable": "summary"}]
    assert await async_setup_component(
        hass, "script", {"script": {"summarize": {"sequence": sequence}}}
    )
    with ChatSpy() as spy:
        response = await hass.services.async_call(
            "script", "summarize", blocking=True, return_response=True
        )
    assert response is not None

    (body,) = spy.bodies
    fmt = body["response_format"]
    assert fmt["type"] == "json_schema"
    assert fmt["json_schema"]["name"] == "house_summary"
    assert fmt["json_schema"]["strict"] is True
    schema = fmt["json_schema"]["schema"]
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert sorted(schema["required"]) == ["lights_on", "mood"]
    assert schema["properties"]["mood"]["enum"] == ["asleep", "busy", "calm"]

    data = response["data"]
    assert isinstance(data, dict)
    _validate_structure_fields(STRUCTURE)(data)  # raises if the data does not fit
    assert {"mood", "lights_on"} <= data.keys()
    assert data["mood"] in ("calm", "busy", "asleep")
    assert isinstance(data["lights_on"], bool)
    assert data.get("room", "kitchen") in ("kitchen", "living_room")
    assert response["conversation_id"]


async def test_text_without_structure(hass: HomeAssistant, task_entry: MockConfigEntry) -> None:
    """Without a structure the task returns the reply's text, unconstrained."""
    with ChatSpy() as spy:
        response = await _generate(hass, instructions="Write a haiku about the kitchen.")

    (body,) = spy.bodies
    assert "response_format" not in body
    assert body["max_tokens"] == RECOMMENDED_AI_TASK_OPTIONS[CONF_MAX_TOKENS]
    assert isinstance(response["data"], str)
    assert response["data"] == spy.replies[0]


async def test_prefix_is_stable_and_first(
    hass: HomeAssistant, task_entry: MockConfigEntry, engine: EngineProcess
) -> None:
    """Every task starts with the same prefix (HA's AI Task instructions), pinned for the
    subentry; the time of HA's prompt and the instructions follow it, so the engine
    reuses the prefix, and the trace names the pin the requests really hit."""
    with ChatSpy() as spy:
        await _generate(hass, instructions="First task.")
        with conversation_trace.async_conversation_trace():  # HA traces no task itself
            await _generate(hass, instructions="Second task.", structure=STRUCTURE)

    first, second = spy.bodies
    prefix = {"role": "system", "content": AI_TASK_SYSTEM_PROMPT}
    assert first["messages"][0] == prefix
    assert second["messages"][0] == prefix
    assert "tools" not in first
    context = first["messages"][1]
    assert context["role"] == "system"
    assert AI_TASK_SYSTEM_PROMPT not in context["content"]
    assert first["messages"][-1] == {"role": "user", "content": "First task."}
    assert second["messages"][-1] == {"role": "user", "content": "Second task."}
    # The engine served the second task's prefix from its cache; the turn is recorded.
    turn = task_entry.runtime_data.last_turn
    assert turn is not None
    assert turn.agent_id == TASK_ENTITY
    assert turn.cached_tokens > 0
    task_id = next(
        sid for sid, sub in task_entry.subentries.items() if sub.subentry_type == SUBENTRY_AI_TASK
    )
    name = pin_name(task_id)
    assert name in engine.pins()
    assert [r.pin for r in turn.requests] == [name]
    assert hearth_traces()[-1]["pin"] == name


async def test_reply_cut_short_is_a_clear_error(
    hass: HomeAssistant, house: None, engine: EngineProcess
) -> None:
    """A structured reply cut off by the token limit is refused with a translated error
    (and the entity selector's schema compiles: the engine does not refuse it)."""
    await async_setup_entry(hass, _entry(engine.url, **{CONF_MAX_TOKENS: 2}))

    with ChatSpy() as spy, pytest.raises(HomeAssistantError) as err:
        await _generate(hass, instructions="Summarize the house.", structure=ENTITY_STRUCTURE)

    assert err.value.translation_domain == DOMAIN
    assert err.value.translation_key == "invalid_structured_reply"
    assert "does not fit the requested structure" in str(err.value)
    (reply,) = spy.replies
    assert reply.startswith("{")  # the engine answered, under the grammar


async def test_engine_down_is_a_translated_error(
    hass: HomeAssistant, house: None, private_engine_factory: Any
) -> None:
    """The engine stops after set-up: the task fails with the 'cannot reach' message."""
    engine = private_engine_factory()
    await async_setup_entry(hass, _entry(engine.url))
    engine.stop()

    with pytest.raises(HomeAssistantError) as err:
        await _generate(hass, instructions="Summarize the house.", structure=STRUCTURE)

    assert err.value.translation_domain == DOMAIN
    assert err.value.translation_key == "cannot_connect"
    assert "Cannot reach the Hearth engine" in str(err.value)


async def test_attachments_are_refused(hass: HomeAssistant, task_entry: MockConfigEntry) -> None:
    """The engine reads text only: the entity does not offer attachments."""
    state = hass.states.get(TASK_ENTITY)
    assert state is not None
    features = ai_task.AITaskEntityFeature(state.attributes["supported_features"])
    assert features == ai_task.AITaskEntityFeature.GENERATE_DATA

    with ChatSpy() as spy, pytest.raises(HomeAssistantError, match="not support attachments"):
        await _generate(
            hass,
            instructions="Describe the photo.",
            attachments=[
                {
                    "media_content_id": "media-source://media_source/local/a.jpg",
                    "media_content_type": "image/jpeg",
                }
            ],
        )
    assert spy.bodies == []


async def test_ai_task_subentry_flow(
    hass: HomeAssistant, house: None, engine: EngineProcess
) -> None:
    """Add an AI Task to an engine entry, then reconfigure it."""
    entry = make_entry(engine.url)
    await async_setup_entry(hass, entry)
    assert hass.states.get(TASK_ENTITY) is None

    result = await hass.config_entries.subentries.async_init(
        (entry.entry_id, SUBENTRY_AI_TASK), context={"source": SOURCE_USER}
    )
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "set_options"
    result = await hass.config_entries.subentries.async_configure(
        result["flow_id"],
        {CONF_NAME: "Hearth AI Task", CONF_TEMPERATURE: 0.3, CONF_MAX_TOKENS: 512.0},
    )
    await hass.async_block_till_done(wait_background_tasks=True)
    assert result["type"] is FlowResultType.CREATE_ENTRY
    subentry = next(s for s in entry.subentries.values() if s.subentry_type == SUBENTRY_AI_TASK)
    assert subentry.title == "Hearth AI Task"
    assert dict(subentry.data) == {CONF_TEMPERATURE: 0.3, CONF_MAX_TOKENS: 512}
    assert hass.states.get(TASK_ENTITY) is not None
    assert hass.states.get("conversation.hearth") is not None
    # The AI Task's prefix (HA's AI Task instructions) is pinned like an agent's.
    assert f"hearth.{subentry.subentry_id}" in engine.pins()

    result = await entry.start_subentry_reconfigure_flow(hass, subentry.subentry_id)
    assert result["step_id"] == "set_options"
    result = await hass.config_entries.subentries.async_configure(
        result["flow_id"], {CONF_TEMPERATURE: 0.0, CONF_MAX_TOKENS: 64.0}
    )
    await hass.async_block_till_done(wait_background_tasks=True)
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "reconfigure_successful"
    assert dict(entry.subentries[subentry.subentry_id].data) == {
        CONF_TEMPERATURE: 0.0,
        CONF_MAX_TOKENS: 64,
    }
    with ChatSpy() as spy:
        await _generate(hass, instructions="Say hello.")
    assert spy.bodies[0]["max_tokens"] == 64


def test_response_format_drops_unknown_formats() -> None:
    """Selector formats the engine cannot compile are dropped; standard ones stay."""
    structure = _validate_structure_fields(
        {
            "light": {"selector": {"entity": {}}},
            "language": {"selector": {"language": {}}},
            "day": {"selector": {"date": {}}},
            "at": {"selector": {"datetime": {}}},
        }
    )
    fmt = response_format("Ünïcode task!", structure, None)
    assert fmt["json_schema"]["name"] == "unicode_task"
    properties = fmt["json_schema"]["schema"]["properties"]
    assert "format" not in properties["light"]
    assert re.fullmatch(properties["light"]["pattern"].strip("^$"), "light.kitchen_light")
    assert not re.fullmatch(properties["light"]["pattern"].strip("^$"), "light.kitchen__light")
    assert "format" not in properties["language"]
    assert "pattern" not in properties["language"]
    assert properties["day"]["format"] == "date"
    assert properties["at"]["format"] == "date-time"


async def test_failing_tasks_log_once_and_recover(
    hass: HomeAssistant,
    house: None,
    private_engine_factory: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Tasks that keep failing log one warning (not one per task); when the engine is
    back, the next task works and says so once."""
    engine = private_engine_factory()
    await async_setup_entry(hass, _entry(engine.url))
    engine.stop()
    caplog.clear()
    for _ in range(2):
        with pytest.raises(HomeAssistantError, match="Cannot reach the Hearth engine"):
            await _generate(hass, instructions="Summarize the house.")
    failed = [r for r in caplog.records if "request failed" in r.getMessage()]
    assert [r.levelname for r in failed] == ["WARNING", "DEBUG"]

    engine.start()
    for _ in range(2):
        response = await _generate(hass, instructions="Summarize the house.")
        assert isinstance(response["data"], str)
    back = [r for r in caplog.records if "work again" in r.getMessage()]
    assert [r.levelname for r in back] == ["INFO"]
