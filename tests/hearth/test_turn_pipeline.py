"""A turn reads its request once (turn/understand.py): a real turn through Home
Assistant's conversation API, against a real engine (tiny-tools), splits the request's
text into words once, however many stages read them (the hint, the policy, the guard,
the name guard, the kind names)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any
from unittest.mock import patch

from homeassistant.components.homeassistant.exposed_entities import async_expose_entity
from homeassistant.core import HomeAssistant
from homeassistant.setup import async_setup_component

from custom_components.hearth.backend.chat import ChatClient
from custom_components.hearth.const import CONF_EXAMPLES
from custom_components.hearth.language import words as words_module
from custom_components.hearth.language.intents_data import async_language_data

from .common import (
    KITCHEN_LIGHT,
    EngineProcess,
    async_setup_entry,
    converse,
    hearth_traces,
    make_entry,
    speech,
)

REQUEST = "turn on the kitchen light"


@contextmanager
def _splits(text: str) -> Iterator[list[str]]:
    """Every call of the word splitter (language/words.py ``words``) on ``text``, in
    every module of the integration that holds it."""
    calls: list[str] = []
    original = words_module.words

    def counted(value: str) -> set[str]:
        if value == text:
            calls.append(value)
        return original(value)

    holders = [
        module
        for name, module in list(sys.modules.items())
        if name.startswith("custom_components.hearth")
        and getattr(module, "words", None) is original
    ]
    with ExitStack() as stack:
        for module in holders:
            stack.enter_context(patch.object(module, "words", counted))
        yield calls


async def test_a_turn_splits_its_request_into_words_once(
    hass: HomeAssistant, house: None, engine: EngineProcess
) -> None:
    """With examples on, the turn's hint reads the request's words; its call (rewritten
    to name the porch lamp, as a model that picked another thing would) goes through
    the guard and the name guard, which read them too, and is refused: one split."""
    assert await async_setup_component(hass, "conversation", {})
    await async_language_data(hass, "en")
    hass.states.async_set("light.porch", "off", {"friendly_name": "Porch Lamp"})
    async_expose_entity(hass, "conversation", "light.porch", True)
    await async_setup_entry(hass, make_entry(engine.url, **{CONF_EXAMPLES: True}))
    original = ChatClient.async_chat_stream
    bodies: list[dict[str, Any]] = []

    async def porch_instead(client: ChatClient, body: Any) -> Any:
        bodies.append(json.loads(json.dumps(body)))
        async for chunk in original(client, body):
            for choice in chunk.get("choices") or ():
                for call in (choice.get("delta") or {}).get("tool_calls") or ():
                    arguments = (call.get("function") or {}).get("arguments")
                    if len(bodies) == 1 and arguments:
                        call["function"]["arguments"] = arguments.replace(
                            "Kitchen Light", "Porch Lamp"
                        )
            yield chunk

    with patch.object(ChatClient, "async_chat_stream", porch_instead), _splits(REQUEST) as calls:
        result = await converse(hass, REQUEST)

    assert calls == [REQUEST]
    # Every stage ran: the hint, and the refusal of the call the model made.
    assert hearth_traces()[-1]["hint"]
    assert json.loads(bodies[1]["messages"][-1]["content"])["error"] == "NotRequested"
    assert hass.states.get(KITCHEN_LIGHT).state == "off"
    assert speech(result)
