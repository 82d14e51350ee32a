"""What a turn says after its tools ran: what Home Assistant reports was done.

A small model that is shown "Done." after every action says "Done." after any result:
after a call that switched on the wrong thing, or nothing. So an action's reply is not
the model's: it is the intent response's own speech where HA gives one, else HA's own
response sentence for that intent in the user's language (``home-assistant-intents``,
the sentence Assist speaks, rendered with the call's slots and its target's state),
else the agent's "done" phrase. Where the targets HA reports are not what the request
named ("open the curtains", and the Garage Door Opener light went on), the reply names
them; targets that failed are said to have failed. An error, or an answer to a
question, is left to the model (``spoken_outcomes`` returns None).

``spoken_outcomes`` is pure; ``async_response_templates`` and ``render_response`` read
the language data and render with Home Assistant's template engine.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from home_assistant_intents import get_intents, get_languages
from homeassistant.components import conversation
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import TemplateError
from homeassistant.helpers import template
from homeassistant.util import language as language_util

from ..house.names import names_entity, normalize, said_inflected, says
from ..tool_names import bare_name

ACTION_DONE = "action_done"
# HA's response keys for the things of one domain in an area or floor.
GROUP_KEYS = {
    ("floor", "light"): "lights_floor", ("area", "light"): "lights_area",
    ("floor", "fan"): "fans_floor", ("area", "fan"): "fans_area",
}  # fmt: skip

PLACES = ("area", "floor")
TARGETING = frozenset({"name", "area", "floor"})  # arguments that name a target
MAX_NAMED = 3  # things named in a reply, at most

Templates = Mapping[str, Mapping[str, str]]  # intent -> response key -> Jinja template


@dataclass(frozen=True, slots=True)
class Outcome:
    """One tool call of the turn and what it returned (a tool result's ``data``)."""

    tool: str
    arguments: Mapping[str, Any]
    result: Mapping[str, Any]
    error: bool = False

    @property
    def intent(self) -> str:
        return bare_name(self.tool)

    @property
    def acted(self) -> bool:
        """Whether HA ran it as an action (an intent response of type action_done)."""
        return not self.error and self.result.get("response_type") == ACTION_DONE

    def targets(self, kind: str, field: str = "success") -> list[Mapping[str, Any]]:
        """HA's ``success`` (or ``failed``) targets of type ``kind`` (entity, area...)."""
        data = self.result.get("data") or {}
        found = data.get(field) if isinstance(data, Mapping) else None
        return [t for t in found or () if isinstance(t, Mapping) and t.get("type") == kind]

    def reached(self) -> bool:
        """Whether HA reports a target acted on, where the call named one (a call by
        name, area or floor that changed nothing is no success; a timer's name and
        area are not things of the house). Some of HA's handlers report their targets
        only as the response's matched states (the relative volume's: the TV was
        turned up, and "nothing was changed" would be false)."""
        if not TARGETING & set(self.arguments) or not names_entity(self.tool):
            return True
        if any(self.targets(kind) for kind in ("entity", *PLACES)):
            return True
        response = getattr(self.result, "original", None)  # llm.IntentResponseDict's
        return bool(getattr(response, "matched_states", None))

    def own_speech(self) -> str | None:
        """The intent response's own speech (localized by HA), if it has one."""
        plain = (self.result.get("speech") or {}).get("plain") or {}
        said = plain.get("speech") if isinstance(plain, Mapping) else None
        return str(said).strip() or None if said else None


def spoken_outcomes(
    outcomes: Sequence[Outcome],
    request: str,
    render: Callable[[Outcome], str | None],
    done: str,
    failed: Callable[[list[str]], str],
    *,
    unchanged: str | None = None,
) -> str | None:
    """The reply to a turn whose last tool calls were ``outcomes``, for the user's
    ``request``: None unless every one of them acted (the model answers errors and
    questions). Each says HA's speech (its own, else ``render``, else ``done``); the
    things it acted on that the request does not name are named after it, and those
    that ``failed`` (a sentence on their names) are said last. A call HA ran that
    reached no target says ``unchanged`` (None: the model answers, as before): never
    the model's own words, which said "Opening" while nothing moved."""
    if not outcomes or not all(outcome.acted for outcome in outcomes):
        return None
    if unchanged is None and not all(outcome.reached() for outcome in outcomes):
        return None
    request_norm = normalize(request)
    parts: list[str] = []
    missed: list[str] = []
    for outcome in outcomes:
        if not outcome.reached():
            if unchanged not in parts:
                parts.append(str(unchanged))
            continue
        speech = outcome.own_speech() or render(outcome) or done
        places = [str(t.get("name", "")) for k in PLACES for t in outcome.targets(k)]
        names = [str(t.get("name", "")) for t in outcome.targets("entity")]
        unnamed = [
            n for n in names if n and not _said(request_norm, n) and not _said(speech.casefold(), n)
        ]
        if unnamed and not any(p and _said(request_norm, p) for p in places):
            listed = list(dict.fromkeys(unnamed))
            more = ", …" if len(listed) > MAX_NAMED else ""
            speech = f"{speech.rstrip('.!。')}: {', '.join(listed[:MAX_NAMED])}{more}."
        if speech not in parts:
            parts.append(speech)
        missed += [str(t.get("name", "")) for t in outcome.targets("entity", "failed")]
    if missed:
        parts.append(failed(list(dict.fromkeys(missed))))
    return " ".join(parts)


def _said(text: str, name: str) -> bool:
    """Whether normalized ``text`` says ``name``, as written or inflected ("wyłącz lampkę
    nocną" says "Lampka nocna")."""
    key = normalize(name)
    return says(text, key) or bool(said_inflected(text, [key], ()))


def response_key(outcome: Outcome, templates: Mapping[str, str], domain: str | None) -> str | None:
    """Which of HA's response sentences for the intent fits what the call did: the
    lights of an area or floor, a device class, the target's domain, else default
    (or the intent's only one)."""
    keys = [key for (kind, of), key in GROUP_KEYS.items() if of == domain and outcome.targets(kind)]
    if domain and outcome.arguments.get("device_class"):
        keys.append(f"{domain}_device_class")
    keys += [domain or "", "default"]
    found = next((key for key in keys if key in templates), None)
    if found is None and len(templates) == 1:
        found = next(iter(templates))  # the intent's one sentence ("item_added")
    return found


def render_response(hass: HomeAssistant, templates: Templates, outcome: Outcome) -> str | None:
    """HA's own sentence for ``outcome`` (as Assist would speak it), or None."""
    found = templates.get(outcome.intent) or {}
    entities = outcome.targets("entity")
    state = hass.states.get(str(entities[0].get("id"))) if entities else None
    key = response_key(outcome, found, state.domain if state else None)
    if key is None:
        return None
    slots: dict[str, Any] = {k: _slot(v) for k, v in outcome.arguments.items()}
    slots |= outcome.result.get("speech_slots") or {}
    if len(entities) == 1:
        slots["name"] = entities[0].get("name")
    for kind in ("area", "floor"):
        if places := outcome.targets(kind):
            slots[kind] = places[0].get("name")
    variables = {
        "slots": slots,
        "state": template.TemplateState(hass, state) if state else None,
        "query": {"matched": [], "unmatched": []},
    }
    return _render(hass, found[key], variables)


def _render(hass: HomeAssistant, text: str, variables: Mapping[str, Any]) -> str | None:
    """A sentence template rendered as HA renders Assist's (whitespace normalized)."""
    try:
        said = template.Template(text, hass).async_render(variables, parse_result=False)
    except TemplateError:
        return None
    return " ".join(str(said).split()) or None


def _slot(value: Any) -> Any:
    """A call's argument as HA's sentences read a slot (one value, not a list)."""
    if isinstance(value, list):
        return value[0] if len(value) == 1 else ", ".join(str(v) for v in value)
    return value


@dataclass(frozen=True, slots=True)
class Responses:
    """HA's sentences in one language: ``intents`` (intent -> response key -> Jinja
    template) and ``errors`` (error key -> template)."""

    intents: Templates
    errors: Mapping[str, str]

    def error(self, hass: HomeAssistant, outcome: Outcome) -> str | None:
        """The sentence Assist says for the error ``outcome`` got (None: not an error)."""
        if not outcome.error:
            return None
        key, slots = error_key(outcome)
        text = self.errors.get(key) or self.errors.get("handle_error")
        return _render(hass, text, slots) if text else None

    def failed(self, hass: HomeAssistant, names: list[str]) -> str:
        """That the things ``names`` failed: HA's "unexpected error" sentence, then them."""
        said = _render(hass, self.errors.get("handle_error") or "", {}) or "Error"
        return f"{said.rstrip('.!。')}: {', '.join(names)}."


# The start of the error a call gets that names a thing the request did not (turn/call.py).
NOT_ASKED = "The request did not name"
# HA's reasons for a failed match (helpers/intent.py, in the tool's error text) -> the
# key of the sentence Assist says for it, and whether it needs the call's name.
ERROR_KEYS = (
    (NOT_ASKED, "no_intent"),  # Hearth's: "Sorry, I couldn't understand that"
    ("Multiple entities share the name", "duplicate_entities"),
    ("No entities matched the name", "no_entity"),
    ("The area does not exist", "no_area"),
    ("The floor does not exist", "no_floor"),
    ("No matching entities are exposed", "no_entity_exposed"),
    ("No entities matched the domain", "no_domain"),
    ("No entities matched the device class", "no_device_class"),
    ("No entities were in the area", "no_entity_in_area"),
    ("No entities were on the floor", "no_entity_in_floor"),
    ("No entities supported the required features", "feature_not_supported"),
    ("No entities were in the required state", "entity_wrong_state"),
    ("Multiple entities matched, but a single target is required", "duplicate_entities"),
)
# The states HA's error text says it required: "... (given name 'Den', states playing)".
_STATES = re.compile(r"\bstates ([^,)\s]+)")


def error_key(outcome: Outcome) -> tuple[str, dict[str, Any]]:
    """The key of Assist's error sentence for ``outcome`` and its slots (``entity``,
    ``area``, ``floor``, ``domain``, ``device_class``, from the call)."""
    arguments = outcome.arguments
    slots = {
        "entity": arguments.get("name"),
        "area": arguments.get("area"),
        "floor": arguments.get("floor"),
        "domain": _slot(arguments.get("domain") or ""),
        "device_class": _slot(arguments.get("device_class") or ""),
    }
    told = str(outcome.result.get("error_text") or "")
    key = next((key for reason, key in ERROR_KEYS if told.startswith(reason)), "handle_error")
    if key in {"no_entity_in_area", "no_entity_in_floor"} and not slots["entity"]:
        key = key.replace("entity", "domain") if slots["domain"] else "handle_error"
    if key == "no_entity_exposed" and not slots["entity"]:
        key = "handle_error"
    if key == "duplicate_entities" and not slots["entity"]:
        key = "duplicate_targets"
    if key == "entity_wrong_state":  # as HA's own agent says it: "no device is playing"
        state = _STATES.search(told)
        key, slots["state"] = (key, state.group(1)) if state else ("handle_error", None)
    return key, slots


@cache
def _load_responses(language: str) -> Responses:
    """HA's sentences for ``language`` (blocking: reads the package's file)."""
    found = language_util.matches(language, get_languages())
    raw = (get_intents(found[0]) if found else None) or {}
    responses = raw.get("responses") or {}
    return Responses(responses.get("intents") or {}, responses.get("errors") or {})


async def async_responses(hass: HomeAssistant, language: str) -> Responses:
    """HA's sentences for ``language`` (empty where it has none)."""
    return await hass.async_add_executor_job(_load_responses, language.lower())


def last_outcomes(content: Sequence[conversation.Content]) -> list[Outcome]:
    """The last tool calls of a chat log and their results (those after its last
    assistant message with calls)."""
    results: list[conversation.ToolResultContent] = []
    for item in reversed(content):
        if isinstance(item, conversation.ToolResultContent):
            results.append(item)
            continue
        if isinstance(item, conversation.AssistantContent) and item.tool_calls:
            calls = {call.id: call for call in item.tool_calls}
            return [
                Outcome(
                    r.tool_name,
                    calls[r.tool_call_id].tool_args if r.tool_call_id in calls else {},
                    r.result.data if isinstance(r.result.data, Mapping) else {},
                    r.result.error,
                )
                for r in reversed(results)
            ]
        break
    return []
