"""A wrong action is worse than none, through real Home Assistant (issue 48).

The house is the demo integration's (config/custom_components/hearth_demo): a lock, a
garage door, a valve, a vacuum and a speaker that obey Assist's intents as real ones
do. The model is scripted: a stand-in OpenAI-compatible server (test_other_servers.py's
``FakeServer``, the one mock: a model that makes a given mistake cannot be had from
the tiny test model) answers each request with the next call of its script, then with
"Done.". Home Assistant, its intents and the integration are real. Each case is a
mistake a small model made on unseen homes: the call is not run, nothing changes, and
the reply says so (or what HA did after a retry), never "Done.".
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, NamedTuple
from unittest.mock import patch

import pytest
import yaml
from aiohttp import web
from homeassistant.components import conversation
from homeassistant.components.conversation import trace as conversation_trace
from homeassistant.core import Context, HomeAssistant
from homeassistant.setup import async_setup_component

from custom_components.hearth.backend.openai_compat import OpenAIBackend
from custom_components.hearth.tool_names import bare_name
from custom_components.hearth.turn.refusal import NOT_FOR_REQUEST

from .common import async_setup_entry, make_entry, speech
from .test_other_servers import VLLM_METRICS, FakeServer

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT / "config"))  # custom_components.hearth_demo lives in config/

NAMES = {
    "en": ("Back Door", "Garage Door", "Water Valve", "Robot", "Speaker"),
    "de": ("Hintertür", "Garagentor", "Wasserventil", "Saugroboter", "Lautsprecher"),
}
NOT_RUN = {
    "en": "I did not do that: it did not fit what you asked. Could you say it another way?",
    "de": "Das habe ich nicht getan: es passte nicht zu deiner Bitte. Kannst du es anders sagen?",
}


def fixture(language: str) -> dict[str, Any]:
    lock, garage, valve, robot, speaker = NAMES[language]
    return {
        "areas": [{"name": "Hall", "id": "hall"}],
        "entities": [
            {"name": lock, "id": "lock.back_door", "area": "hall", "state": "locked"},
            {
                "name": garage,
                "id": "cover.garage_door",
                "area": "hall",
                "state": True,
                "attributes": {"device_class": "cover.CoverDeviceClass.GARAGE"},
            },
            {
                "name": valve,
                "id": "valve.water_valve",
                "area": "hall",
                "attributes": {"current_position": 0, "reports_position": True},
            },
            {"name": robot, "id": "vacuum.robot", "area": "hall", "state": "docked"},
            {
                "name": speaker,
                "id": "media_player.speaker",
                "area": "hall",
                "state": "playing",
                "attributes": {"volume_level": 0.5, "media_track": 1},
            },
        ],
    }


class ScriptedModel(FakeServer):
    """Answers request n with the n-th call of ``script`` (then with "Done.")."""

    def __init__(self) -> None:
        super().__init__("vllm", VLLM_METRICS)
        self.script: list[tuple[str, dict[str, Any]]] = []

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.call = None
        if self.script:
            name, arguments = self.script.pop(0)
            function = {"name": name, "arguments": json.dumps(arguments)}
            self.call = {"id": f"call_{len(self.bodies)}", "type": "function", "function": function}
        return await super()._chat(request)


@pytest.fixture
async def model(socket_enabled: None) -> AsyncIterator[ScriptedModel]:
    server = ScriptedModel()
    await server.start()
    yield server
    await server.stop()


async def home(
    hass: HomeAssistant,
    tmp_path: Path,
    language: str,
    model: ScriptedModel,
    extra: list[dict[str, Any]] | None = None,
    *,
    garage: bool = False,
) -> None:
    """The demo house in ``language`` (with ``extra`` entities; ``garage``: its garage
    door in an area Garage) and a Hearth agent on the scripted model."""
    hass.config.language = language
    house = fixture(language)
    house["entities"] += extra or []
    if garage:
        house["areas"].append({"name": "Garage", "id": "garage"})
        house["entities"][1]["area"] = "garage"
    path = tmp_path / "_fixtures.yaml"
    path.write_text(yaml.safe_dump(house, allow_unicode=True))
    config = {"hearth": {"enabled": False}, "fixtures": str(path)}
    assert await async_setup_component(hass, "homeassistant", {})
    with (
        patch("custom_components.hearth_demo.async_ensure_access"),
        patch.object(logging.getLogger("custom_components.hearth_demo"), "warning"),
    ):
        assert await async_setup_component(hass, "hearth_demo", {"hearth_demo": config})
        await hass.async_block_till_done()
    for component in ("intent", "conversation", "cover", "valve", "lock", "vacuum",
                      "media_player", "light"):  # fmt: skip
        assert await async_setup_component(hass, component, {})
    await async_setup_entry(hass, make_entry(model.url))


async def ask(hass: HomeAssistant, text: str, language: str) -> conversation.ConversationResult:
    return await conversation.async_converse(
        hass, text, None, Context(), language=language, agent_id="conversation.hearth"
    )


class Case(NamedTuple):
    """A request, the scripted model's call (its intent, and the index in ``NAMES`` of
    the thing it names), and a thing with the state it must have after the turn."""

    language: str
    text: str
    call: tuple[str, int]
    entity_id: str
    state: str


async def scripted(
    hass: HomeAssistant, tmp_path: Path, model: ScriptedModel, case: Case
) -> conversation.ConversationResult:
    """The case's request, said to the demo house with the model scripted to make
    the case's call."""
    await home(hass, tmp_path, case.language, model)
    intent, which = case.call
    model.script = [(intent, {"name": NAMES[case.language][which]})]
    result = await ask(hass, case.text, case.language)
    await hass.async_block_till_done()
    return result


def run_calls() -> list[str]:
    """The tools Home Assistant ran in the last turn."""
    events = conversation_trace.async_get_traces()[-1].as_dict()["events"]
    calls = [e["data"]["tool_name"] for e in events if e["event_type"] == "tool_call"]
    return [bare_name(c) for c in calls]


def tool_results(model: ScriptedModel) -> list[str]:
    """What the model was told of its calls (the tool messages of its last request)."""
    return [str(m["content"]) for m in model.bodies[-1]["messages"] if m["role"] == "tool"]


def state(hass: HomeAssistant, entity_id: str) -> str:
    found = hass.states.get(entity_id)
    assert found is not None
    return found.state


@pytest.mark.parametrize(
    "case",
    [
        Case("en", "lock the back door", ("HassTurnOff", 0), "lock.back_door", "locked"),
        Case("de", "schließ die Hintertür ab", ("HassTurnOff", 0), "lock.back_door", "locked"),
        Case("en", "open the garage door", ("HassTurnOff", 1), "cover.garage_door", "open"),
        Case("de", "öffne das Garagentor", ("HassTurnOff", 1), "cover.garage_door", "open"),
        Case("en", "close the water valve", ("HassTurnOn", 2), "valve.water_valve", "closed"),
        Case("de", "schließe das Wasserventil", ("HassTurnOn", 2), "valve.water_valve", "closed"),
        Case("en", "start the robot", ("HassVacuumReturnToBase", 3), "vacuum.robot", "docked"),
        Case("en", "close the garage door", ("HassMediaPause", 4), "media_player.speaker",
         "playing"),
    ],
)  # fmt: skip
async def test_a_call_against_the_request_is_not_run_and_not_said_done(
    hass: HomeAssistant, tmp_path: Path, model: ScriptedModel, case: Case
) -> None:
    """The opposite direction (lock, cover, valve, vacuum) or an intent for another
    kind of thing: the call is not run, the thing stays as it was, and Assist asks
    the user to say it another way, in the user's language."""
    result = await scripted(hass, tmp_path, model, case)
    intent = case.call[0]
    assert state(hass, case.entity_id) == case.state
    assert intent not in " ".join(run_calls())
    (refusal,) = tool_results(model)
    assert NOT_FOR_REQUEST in refusal
    assert speech(result) == NOT_RUN[case.language]


async def test_a_timer_call_for_a_request_that_names_no_timer_is_not_run(
    hass: HomeAssistant, tmp_path: Path, model: ScriptedModel
) -> None:
    """Asked to skip a track, the model cancelled every timer: not run; the reply
    is a question, not the model's "Done."."""
    await home(hass, tmp_path, "en", model)
    model.script = [("HassCancelAllTimers", {})]
    result = await ask(hass, "skip this track", "en")
    assert run_calls() == []
    assert speech(result) == NOT_RUN["en"]


async def test_on_off_on_a_vacuum_is_refused_and_the_retry_with_its_intent_runs(
    hass: HomeAssistant, tmp_path: Path, model: ScriptedModel
) -> None:
    """HassTurnOn on a vacuum cannot act (HA fails: no turn_on): the model reads the
    vacuum's own tools in the refusal, calls HassVacuumStart, and HA's answer is said."""
    await home(hass, tmp_path, "en", model)
    model.script = [("HassTurnOn", {"name": "Robot"}), ("HassVacuumStart", {"name": "Robot"})]
    result = await ask(hass, "start the robot", "en")
    await hass.async_block_till_done()
    refusal = tool_results(model)[0]
    assert NOT_FOR_REQUEST in refusal and "HassVacuumStart" in refusal
    assert run_calls() == ["HassVacuumStart"]
    assert state(hass, "vacuum.robot") == "cleaning"
    assert speech(result) not in {"Done.", NOT_RUN["en"]}


async def test_a_refused_direction_is_retried_with_only_the_intent_the_request_reads_as(
    hass: HomeAssistant, tmp_path: Path, model: ScriptedModel
) -> None:
    """Asked to unlock, the model locked: refused; on a server that narrows tools (as
    Hearth's engine does; the scripted model stands in for a model that makes this
    mistake, and says it narrows), the next request may call only the unlock intent,
    whose call runs and is said as HA reports it."""
    await home(hass, tmp_path, "en", model)
    model.script = [("HassTurnOn", {"name": "Back Door"}), ("HassTurnOff", {"name": "Back Door"})]
    with patch.object(OpenAIBackend, "narrows_tools", True):
        result = await ask(hass, "unlock the back door", "en")
    await hass.async_block_till_done()
    retry = model.bodies[-1]["tool_choice"]  # the last request: the retry
    assert retry["allowed_tools"]["mode"] == "required"
    assert [bare_name(t["function"]["name"]) for t in retry["allowed_tools"]["tools"]] == [
        "HassTurnOff"
    ]
    assert run_calls() == ["HassTurnOff"]
    assert state(hass, "lock.back_door") == "unlocked"
    assert speech(result) not in {"Done.", NOT_RUN["en"]}


def _hearth_field(_backend: OpenAIBackend, values: dict[str, Any] | None) -> dict[str, Any]:
    """The ``hearth`` field Hearth's engine reads, sent to the scripted server, which
    records it (it stands in for the engine's grammar)."""
    return {"hearth": dict(values)} if values else {}


async def ask_as_hearth(hass: HomeAssistant, text: str) -> conversation.ConversationResult:
    """``ask`` in English, the scripted server standing in for Hearth's engine: it says
    it narrows tools, and is sent (and records) the ``hearth`` field."""
    with (
        patch.object(OpenAIBackend, "narrows_tools", True),
        patch.object(OpenAIBackend, "request_extensions", _hearth_field),
    ):
        return await ask(hass, text, "en")


async def test_a_refused_value_is_retried_with_only_the_value_the_request_reads(
    hass: HomeAssistant, tmp_path: Path, model: ScriptedModel
) -> None:
    """Asked to turn the speaker down, the model turned it up: refused; the retry may
    call only the relative volume, and its grammar (the ``hearth`` field Hearth's
    engine reads; the scripted server stands in and records it) takes only ``down``
    for ``volume_step``. HA runs the retry and the speaker is quieter."""
    await home(hass, tmp_path, "en", model)
    volume = "HassSetVolumeRelative"
    model.script = [
        (volume, {"name": "Speaker", "volume_step": "up"}),
        (volume, {"name": "Speaker", "volume_step": "down"}),
    ]
    before = hass.states.get("media_player.speaker").attributes["volume_level"]
    result = await ask_as_hearth(hass, "turn the speaker down")
    await hass.async_block_till_done()
    retry = model.bodies[-1]
    assert retry["hearth"]["argument_values"][f"{volume}.volume_step"] == ["down"]
    assert "up" in tool_results(model)[0] and NOT_FOR_REQUEST in tool_results(model)[0]
    assert run_calls() == [volume]
    assert hass.states.get("media_player.speaker").attributes["volume_level"] < before
    assert speech(result) not in {"Done.", NOT_RUN["en"]}


async def test_a_call_that_names_nothing_is_retried_naming_what_the_request_names(
    hass: HomeAssistant, tmp_path: Path, model: ScriptedModel
) -> None:
    """Asked to set the speaker's volume, the model named nothing (HA would pick the
    players itself): refused; the retry may call only the same intent, and must give
    a name, which the grammar narrows to what the request names."""
    await home(hass, tmp_path, "en", model)
    volume = "HassSetVolume"
    model.script = [
        (volume, {"volume_level": 30}),
        (volume, {"name": "Speaker", "volume_level": 30}),
    ]
    result = await ask_as_hearth(hass, "set the speaker volume to 30 percent")
    await hass.async_block_till_done()
    retry = model.bodies[-1]
    assert [
        bare_name(t["function"]["name"]) for t in retry["tool_choice"]["allowed_tools"]["tools"]
    ] == [volume]
    assert f"{volume}.name" in retry["hearth"]["required_arguments"]
    assert run_calls() == [volume]
    assert hass.states.get("media_player.speaker").attributes["volume_level"] == 0.3
    assert speech(result) not in {"Done.", NOT_RUN["en"]}


async def test_an_action_ha_reports_only_by_its_matched_states_is_not_said_undone(
    hass: HomeAssistant, tmp_path: Path, model: ScriptedModel
) -> None:
    """HA's relative-volume handler reports the players it turned down only as its
    response's matched states, not as success targets: the reply is never "Nothing
    was changed" while the volume moved."""
    await home(hass, tmp_path, "en", model)
    model.script = [("HassSetVolumeRelative", {"name": "Speaker", "volume_step": "down"})]
    before = hass.states.get("media_player.speaker").attributes["volume_level"]
    result = await ask(hass, "turn the speaker down", "en")
    await hass.async_block_till_done()
    assert run_calls() == ["HassSetVolumeRelative"]
    assert hass.states.get("media_player.speaker").attributes["volume_level"] < before
    assert speech(result) not in {"Nothing was changed.", "Done.", NOT_RUN["en"]}


async def test_a_shared_name_means_the_kind_the_requests_command_words_say(
    hass: HomeAssistant, tmp_path: Path, model: ScriptedModel
) -> None:
    """A garage door opener's cover and light share a name. "Close the garage" by that
    name closes the cover: the off intent's cover templates say "close", its light
    templates do not; the light is left on."""
    light = {"name": "Garage Door", "id": "light.garage_door", "area": "garage", "state": "on"}
    await home(hass, tmp_path, "en", model, extra=[light], garage=True)
    model.script = [("HassTurnOff", {"name": "Garage Door"})]
    await ask(hass, "close the garage", "en")
    await hass.async_block_till_done()
    assert run_calls() == ["HassTurnOff"]
    assert state(hass, "cover.garage_door") == "closed"
    assert state(hass, "light.garage_door") == "on"


async def test_a_call_that_fits_runs(
    hass: HomeAssistant, tmp_path: Path, model: ScriptedModel
) -> None:
    """The guard refuses only what contradicts the request: unlocking when asked to."""
    await home(hass, tmp_path, "de", model)
    model.script = [("HassTurnOff", {"name": "Hintertür"})]
    await ask(hass, "schließ die Hintertür auf", "de")
    await hass.async_block_till_done()
    assert state(hass, "lock.back_door") == "unlocked"


@pytest.mark.parametrize(
    "case",
    [
        # Not HA's own sentences (those HA answers itself: turn/ha_answer.py).
        Case("en", "did I lock the back door?", ("HassTurnOff", 0), "lock.back_door", "locked"),
        Case("de", "Hab ich die Hintertür abgeschlossen?", ("HassTurnOff", 0), "lock.back_door",
         "locked"),
        Case("en", "is the speaker playing?", ("HassMediaPause", 4), "media_player.speaker",
         "playing"),
    ],
)  # fmt: skip
async def test_a_question_never_acts(
    hass: HomeAssistant, tmp_path: Path, model: ScriptedModel, case: Case
) -> None:
    """Asked whether the door is locked, a small model unlocked it: a question is
    read, never acted on, whatever the call (here one that even fits the thing)."""
    await scripted(hass, tmp_path, model, case)
    assert state(hass, case.entity_id) == case.state
    assert case.call[0] not in run_calls()
    assert any(NOT_FOR_REQUEST in result for result in tool_results(model))


@pytest.mark.parametrize(
    "case",
    [
        Case("en", "start the vacuum", ("HassVacuumStart", 3), "vacuum.robot", "cleaning"),
        Case("de", "starte den Staubsauger", ("HassVacuumStart", 3), "vacuum.robot", "cleaning"),
        Case("en", "pause the music", ("HassMediaPause", 4), "media_player.speaker", "paused"),
    ],
)  # fmt: skip
async def test_the_only_thing_of_its_kind_is_named_by_its_kind(
    hass: HomeAssistant, tmp_path: Path, model: ScriptedModel, case: Case
) -> None:
    """The house's one vacuum is "the vacuum" (HA's own name for the kind, in the
    user's language), its one player is what "pause the music" pauses: the call that
    names it by its own name runs (the name guard refused it as naming nothing said)."""
    await scripted(hass, tmp_path, model, case)
    assert run_calls() == [case.call[0]], tool_results(model)
    assert state(hass, case.entity_id) == case.state


async def test_an_answer_never_speaks_attribute_keys_or_entity_ids(
    hass: HomeAssistant, tmp_path: Path, model: ScriptedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model copied the live context's text into its answer: said as words."""
    from . import test_other_servers

    await home(hass, tmp_path, "en", model)
    monkeypatch.setattr(
        test_other_servers, "REPLY", "Yes, lock.back_door is locked (device_class: door)."
    )
    result = await ask(hass, "did I lock the back door?", "en")
    assert speech(result) == "Yes, back door is locked (device class door)."
