"""No blocking I/O in the event loop (issue 48, item 8).

Home Assistant detects blocking calls in its loop (``homeassistant/block_async_io.py``)
and reports them as a bug against the integration; in tests it leaves them unguarded
(``skip_for_tests``). Here its own guard is put back on the loop's thread, strict: a
blocking call made from the integration raises HA's ``RuntimeError``, and each one is
also recorded, so a call that some ``except`` swallowed fails the test too.

Home Assistant's language data and hassil's caches start cold (as after a restart), then
a real entry on the real engine (tiny-tools) takes turns that read the data the way a
user's requests do: number words ("forty percent": hassil's number rules,
``unicode_rbnf``'s XML), a question, examples pinned with the house.
"""

from __future__ import annotations

import builtins
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hassil import numbers, string_matcher
from homeassistant import block_async_io
from homeassistant.core import HomeAssistant
from homeassistant.setup import async_setup_component
from homeassistant.util.loop import protect_loop

from custom_components.hearth.const import CONF_EXAMPLES
from custom_components.hearth.language import intents_data
from custom_components.hearth.language.sentences import recognize, slot_lists

from .common import KITCHEN_LIGHT, EngineProcess, async_setup_entry, converse, make_entry


@pytest.fixture
def blocking_calls_raise() -> Iterator[list[str]]:
    """HA's blocking-call guard on the loop's thread, strict; yields what it caught."""
    caught: list[str] = []
    loop_thread = threading.get_ident()

    def guarded(call: Any) -> Callable[..., Any]:
        protected = protect_loop(
            call.original_func,
            loop_thread_id=loop_thread,
            strict=True,
            strict_core=False,  # HA's own calls only warn, as in production
            check_allowed=call.check_allowed,
        )

        def checked(*args: Any, **kwargs: Any) -> Any:
            try:
                return protected(*args, **kwargs)
            except RuntimeError as err:
                if "Caught blocking call" in str(err):
                    caught.append(str(err).splitlines()[0])
                raise

        return checked

    calls = block_async_io._BLOCKING_CALLS  # HA's own list of them
    assert any(call.original_func is builtins.open for call in calls)
    for call in calls:
        setattr(call.object, call.function, guarded(call))
    try:
        yield caught
    finally:
        for call in calls:
            setattr(call.object, call.function, call.original_func)


@pytest.fixture
def cold_language_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """No language loaded yet, and hassil's number rules and tries not read yet."""
    monkeypatch.setattr(intents_data, "_LOADED", intents_data._Loaded())
    monkeypatch.setattr(numbers, "_ENGINE_CACHE", {})
    monkeypatch.setattr(string_matcher, "_RANGE_TRIE_CACHE", defaultdict(dict))


async def test_the_guard_catches_a_blocking_read_by_the_integration(
    hass: HomeAssistant, blocking_calls_raise: list[str], cold_language_data: None
) -> None:
    """The guard works: with the number rules not read (as before the load read them),
    the integration's matcher makes hassil open their XML in the loop. HA's guard
    raises."""
    data = await intents_data.async_language_data(hass, "en")
    assert data is not None and "en" in numbers._ENGINE_CACHE  # read, off the loop
    numbers._ENGINE_CACHE.clear()
    lists = slot_lists([("Kitchen Light", "light")])
    with pytest.raises(RuntimeError, match="Caught blocking call to open"):
        recognize(data, "set the kitchen light to forty percent", lists)
    assert blocking_calls_raise
    assert blocking_calls_raise[0].startswith("Caught blocking call to open")
    assert "custom integration 'hearth'" in blocking_calls_raise[0]


async def test_turns_read_the_language_data_without_blocking_the_loop(
    hass: HomeAssistant,
    house: None,
    engine: EngineProcess,
    blocking_calls_raise: list[str],
    cold_language_data: None,
) -> None:
    """Set-up and turns that read numbers in words, ask, and pin examples open no file
    in the loop: the language loads in the executor, once, with its number rules."""
    assert await async_setup_component(hass, "conversation", {})
    entry = make_entry(engine.url, **{CONF_EXAMPLES: True})
    await async_setup_entry(hass, entry)
    for text in (
        "set the kitchen light to forty percent",
        "did I leave the kitchen light on?",  # HA reads "is … on" itself (ha_answer)
        "start a timer for ten minutes",
    ):
        await converse(hass, text)
    assert blocking_calls_raise == []
    loaded = intents_data.cached_language_data(hass.config.language)
    assert loaded is not None and hass.states.get(KITCHEN_LIGHT) is not None
    assert hass.config.language in numbers._ENGINE_CACHE  # read, off the loop
