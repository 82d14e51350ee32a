"""A stalled engine: the turn ends after the stall time with a translated sentence, the
agent's error sensor counts the stall, and the log says it once.

The engine is a real process, stopped with SIGSTOP (it accepts connections, as the
kernel does for it, and answers nothing): what a hung engine looks like from HA.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable

import pytest
from homeassistant.core import HomeAssistant
from homeassistant.helpers import entity_registry as er

from custom_components.hearth.const import CONF_STALL_TIMEOUT, DOMAIN

from .common import EngineProcess, async_setup_entry, converse, make_entry, speech

STALL_S = 2.0  # shortened for the test (the default is DEFAULT_STALL_TIMEOUT)
STALLED = {
    "en": "Sorry, the Hearth engine stopped answering. Try again in a moment.",
    "de": "Entschuldigung, die Hearth-Engine antwortet nicht mehr. Versuche es gleich noch einmal.",
}


@pytest.mark.parametrize("language", ["en", "de"])
async def test_a_stalled_engine_is_a_spoken_sentence_within_the_stall_time(
    hass: HomeAssistant,
    house: None,
    private_engine_factory: Callable[..., EngineProcess],
    entity_registry_enabled_by_default: None,
    caplog: pytest.LogCaptureFixture,
    language: str,
) -> None:
    hass.config.language = language
    engine = private_engine_factory(model="tiny")  # no tool calls are needed here
    entry = make_entry(engine.url, entry_options={CONF_STALL_TIMEOUT: STALL_S})
    await async_setup_entry(hass, entry)
    assert entry.runtime_data.backend.chat.stall == STALL_S  # the entry option is read
    assert engine.proc is not None
    os.kill(engine.proc.pid, signal.SIGSTOP)
    try:
        results = []
        for _ in range(2):
            started = time.monotonic()
            results.append(await converse(hass, "hello"))
            waited = time.monotonic() - started
            # Bounded by the stall time (plus slack for a busy machine), not minutes.
            assert STALL_S <= waited < STALL_S + 20
    finally:
        os.kill(engine.proc.pid, signal.SIGCONT)
    for result in results:
        assert result.response.response_type.value == "error"
        assert speech(result) == STALLED[language]
    subentry_id = next(iter(entry.subentries))
    errors_id = er.async_get(hass).async_get_entity_id("sensor", DOMAIN, f"{subentry_id}_errors")
    assert errors_id is not None
    errors = hass.states.get(errors_id)
    assert errors is not None
    assert errors.attributes["stalls"] == 2
    assert "stalled" in errors.attributes["last_error"]
    warnings = [
        record
        for record in caplog.records
        if record.name.startswith("custom_components.hearth")
        and record.levelno >= logging.WARNING
        and "stalled" in record.getMessage()
    ]
    assert len(warnings) == 1  # the first failing turn; the second is a debug line
