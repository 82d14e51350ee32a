"""A failed turn is spoken in the user's language, through real Home Assistant and a
real engine that was stopped after set-up: our own strings where the integration has
them (English, German, French, Polish, Spanish, Italian, Dutch, Portuguese, Russian,
Swedish), and Home Assistant's own Assist sentence for Greek and Czech
(home-assistant-intents)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from home_assistant_intents import get_intents
from homeassistant.components import conversation
from homeassistant.core import Context, HomeAssistant

from .common import EngineProcess, async_setup_entry, make_entry, speech

OURS = {
    "en": "Sorry, I cannot reach the Hearth engine. Check that it is running.",
    "de": "Entschuldigung, ich erreiche die Hearth-Engine nicht. Prüfe, ob sie läuft.",
    "fr": "Désolé, je n’arrive pas à joindre le moteur Hearth. Vérifiez qu’il fonctionne.",
    "pl": "Przepraszam, nie mogę połączyć się z silnikiem Hearth. Sprawdź, czy działa.",
    "es": "Lo siento, no puedo conectar con el motor de Hearth. Comprueba que esté en marcha.",
    "it": "Scusa, non riesco a raggiungere il motore di Hearth. Controlla che sia in funzione.",
    "nl": "Sorry, ik kan de Hearth-engine niet bereiken. Controleer of die draait.",
    "pt": "Desculpe, não consigo contactar o motor do Hearth. Verifique se está em execução.",
    "ru": "Извините, не удаётся подключиться к движку Hearth. Проверьте, что он запущен.",
    "sv": "Tyvärr når jag inte Hearth-motorn. Kontrollera att den körs.",
}


@pytest.mark.parametrize("language", [*OURS, "el", "cs"])
async def test_an_unreachable_engine_is_spoken_in_the_users_language(
    hass: HomeAssistant,
    house: None,
    private_engine_factory: Callable[..., EngineProcess],
    language: str,
) -> None:
    engine = private_engine_factory(model="tiny")  # no tool calls are needed here
    await async_setup_entry(hass, make_entry(engine.url))
    engine.stop()
    result = await conversation.async_converse(
        hass, "hello", None, Context(), language=language, agent_id="conversation.hearth"
    )
    assert result.response.response_type.value == "error"
    expected = OURS.get(language) or get_intents(language)["responses"]["errors"]["handle_error"]
    assert speech(result) == expected
    assert language == "en" or speech(result) != OURS["en"]  # never English
