"""Helper entities of a dataset home (input_boolean, input_number, input_select,
input_text, input_button, script), made by Home Assistant's own integrations.

The demo has no platform for these domains: each is set up once, from the fixture, as
its YAML configuration would (entity ids keep the fixture's object ids), then placed in
its area and exposed to Assist like the demo's entities. Their states are reset through
their own actions (``input_boolean.turn_on``...); a script or a button has no state to
set. A domain that something else already set up cannot take the fixture's entities:
they are left out with a reason, as an unbuildable entity is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from homeassistant.components.homeassistant.exposed_entities import async_expose_entity
from homeassistant.core import HomeAssistant
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import entity_registry as er
from homeassistant.setup import async_setup_component

from .const import ASSISTANT
from .fixture_states import is_on

HELPER_DOMAINS = frozenset(
    {"input_boolean", "input_number", "input_select", "input_text", "input_button", "script"}
)


@dataclass(frozen=True, slots=True)
class HelperSpec:
    """One helper entity as its fixture writes it."""

    domain: str
    object_id: str
    name: str
    area: str | None
    state: Any = None
    attributes: Mapping[str, Any] = field(default_factory=dict)

    @property
    def entity_id(self) -> str:
        return f"{self.domain}.{self.object_id}"


def _number(value: Any, default: float) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def helper_config(spec: HelperSpec) -> dict[str, Any]:
    """The item of the domain's YAML configuration for ``spec``."""
    attrs, state = spec.attributes, spec.state
    if spec.domain == "script":
        return {"alias": spec.name, "sequence": []}
    config: dict[str, Any] = {"name": spec.name}
    if spec.domain == "input_boolean":
        config["initial"] = is_on(state)
    elif spec.domain == "input_number":
        low, high = _number(attrs.get("min"), 0), _number(attrs.get("max"), 100)
        config |= {"min": low, "max": high, "step": _number(attrs.get("step"), 1)}
        config["initial"] = min(max(_number(state, low), low), high)
    elif spec.domain == "input_select":
        options = [str(o) for o in attrs.get("options") or []] or [str(state or "")]
        config |= {"options": options, "initial": str(state) if state in options else options[0]}
    elif spec.domain == "input_text":
        config["initial"] = "" if state is None else str(state)
    return config


async def async_setup_helpers(hass: HomeAssistant, helpers: list[HelperSpec]) -> list[str]:
    """Set up each helper domain with the fixture's entities; place and expose them.

    Returns ``"<entity id>: <why>"`` for each helper that could not be made."""
    left_out: list[str] = []
    for domain in sorted({spec.domain for spec in helpers}):
        mine = [spec for spec in helpers if spec.domain == domain]
        if domain in hass.config.components:
            left_out += [f"{s.entity_id}: {domain} is already set up" for s in mine]
            continue
        config = {spec.object_id: helper_config(spec) for spec in mine}
        if not await async_setup_component(hass, domain, {domain: config}):
            left_out += [f"{s.entity_id}: {domain} did not set up" for s in mine]
    registry, areas = er.async_get(hass), ar.async_get(hass)
    for spec in helpers:
        if hass.states.get(spec.entity_id) is None:
            if not any(line.startswith(f"{spec.entity_id}:") for line in left_out):
                left_out.append(f"{spec.entity_id}: not made by {spec.domain}")
            continue
        area = areas.async_get_area_by_name(spec.area) if spec.area else None
        if area is not None and registry.async_get(spec.entity_id) is not None:
            registry.async_update_entity(spec.entity_id, area_id=area.id)
        async_expose_entity(hass, ASSISTANT, spec.entity_id, True)
    return left_out


async def async_set_helper_state(hass: HomeAssistant, entity_id: str, state: Any) -> None:
    """Put one helper in ``state`` through its own action (scripts, buttons: nothing)."""
    domain = entity_id.split(".", 1)[0]
    if state is None or domain in ("script", "input_button"):
        return
    if domain == "input_boolean":
        service, data = ("turn_on" if is_on(state) else "turn_off"), {}
    elif domain == "input_number":
        service, data = "set_value", {"value": _number(state, 0)}
    elif domain == "input_select":
        service, data = "select_option", {"option": str(state)}
    else:  # input_text
        service, data = "set_value", {"value": str(state)}
    await hass.services.async_call(domain, service, {"entity_id": entity_id, **data}, blocking=True)
