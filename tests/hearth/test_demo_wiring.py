"""The demo's wiring of Hearth: the bench's knobs reach the engine entry."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from homeassistant.core import HomeAssistant
from homeassistant.util.yaml import load_yaml
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.hearth.const import CONF_STALL_TIMEOUT, DOMAIN

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT / "config"))  # custom_components.hearth_demo lives in config/

from custom_components.hearth_demo import wiring  # noqa: E402
from custom_components.hearth_demo.schema import HOUSE_SCHEMA, house_from_config  # noqa: E402


def _spec(hearth: dict[str, Any]) -> Any:
    raw = dict(load_yaml(ROOT / "config" / "house.yaml"))
    raw["hearth"] = {**raw.get("hearth", {}), **hearth}
    return house_from_config(HOUSE_SCHEMA(raw), ROOT / "config").hearth


async def test_entry_options_are_set_on_the_engine_entry_and_keep_its_others(
    hass: HomeAssistant,
) -> None:
    """The accuracy bench waits longer for a token than a voice turn (its stall time):
    the option is merged into the entry's, whose other options stay."""
    entry = MockConfigEntry(domain=DOMAIN, options={"context_length": 4096})
    entry.add_to_hass(hass)
    spec = _spec({"entry_options": {CONF_STALL_TIMEOUT: 120}})
    wiring._async_set_entry_options(hass, spec.entry_options)
    assert dict(entry.options) == {"context_length": 4096, CONF_STALL_TIMEOUT: 120}


def test_no_entry_options_by_default() -> None:
    assert _spec({}).entry_options == {}
