"""Build the demo house in Home Assistant's registries, idempotently.

Floors, areas, entity registry entries (area, aliases) and Assist exposure are made to
match house.yaml on every start: running it twice changes nothing, and an entity removed
from house.yaml leaves the entity registry.
"""

from __future__ import annotations

import logging

from homeassistant.components.homeassistant.exposed_entities import async_expose_entity
from homeassistant.core import HomeAssistant, callback
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers import floor_registry as fr
from homeassistant.util import slugify

from .const import ASSISTANT, DOMAIN
from .model import AreaSpec, EntitySpec, FloorSpec, House

_LOGGER = logging.getLogger(__name__)


@callback
def _ensure_floor(registry: fr.FloorRegistry, spec: FloorSpec) -> str:
    aliases = set(spec.aliases)
    floor = registry.async_get_floor_by_name(spec.name)
    if floor is None:
        floor = registry.async_create(spec.name, aliases=aliases, icon=spec.icon, level=spec.level)
    elif (floor.aliases, floor.icon, floor.level) != (aliases, spec.icon, spec.level):
        floor = registry.async_update(
            floor.floor_id, aliases=aliases, icon=spec.icon, level=spec.level
        )
    return floor.floor_id


@callback
def _ensure_area(registry: ar.AreaRegistry, spec: AreaSpec, floor_id: str | None) -> str:
    aliases = set(spec.aliases)
    area = registry.async_get_area_by_name(spec.name)
    if area is None:
        area = registry.async_create(spec.name, aliases=aliases, floor_id=floor_id, icon=spec.icon)
    elif (area.aliases, area.floor_id, area.icon) != (aliases, floor_id, spec.icon):
        area = registry.async_update(area.id, aliases=aliases, floor_id=floor_id, icon=spec.icon)
    return area.id


@callback
def _ensure_entity(registry: er.EntityRegistry, spec: EntitySpec, area_id: str | None) -> str:
    """Create the registry entry before the entity exists, then set its area and aliases."""
    entry = registry.async_get_or_create(
        spec.platform,
        DOMAIN,
        spec.unique_id,
        suggested_object_id=spec.object_id or slugify(spec.name),
        original_name=spec.name,
    )
    # The computed name first (what the UI shows), then the extra names from house.yaml.
    aliases: list[er.AliasEntry] = [er.COMPUTED_NAME, *spec.aliases]
    if (entry.area_id, entry.aliases) != (area_id, aliases):
        entry = registry.async_update_entity(entry.entity_id, area_id=area_id, aliases=aliases)
    return entry.entity_id


@callback
def _remove_stale_entities(registry: er.EntityRegistry, house: House) -> int:
    wanted = {(str(spec.platform), spec.unique_id) for spec in house.entities}
    stale = [
        entry.entity_id
        for entry in registry.entities.values()
        if entry.platform == DOMAIN and (entry.domain, entry.unique_id) not in wanted
    ]
    for entity_id in stale:
        registry.async_remove(entity_id)
    return len(stale)


@callback
def async_build_house(hass: HomeAssistant, house: House) -> list[str]:
    """Make the registries match the house; return the entity ids exposed to Assist."""
    floor_ids = {spec.name: _ensure_floor(fr.async_get(hass), spec) for spec in house.floors}
    area_ids = {
        spec.name: _ensure_area(ar.async_get(hass), spec, floor_ids.get(spec.floor or ""))
        for spec in house.areas
    }
    registry = er.async_get(hass)
    removed = _remove_stale_entities(registry, house)
    entity_ids = [
        _ensure_entity(registry, spec, area_ids.get(spec.area or "")) for spec in house.entities
    ]
    for entity_id in entity_ids:
        async_expose_entity(hass, ASSISTANT, entity_id, True)
    _LOGGER.info(
        "Demo house: %d floors, %d areas, %d entities exposed to Assist%s",
        len(floor_ids),
        len(area_ids),
        len(entity_ids),
        f" ({removed} stale entities removed)" if removed else "",
    )
    return entity_ids
