"""Base class and platform set-up shared by the demo entities."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from homeassistant.const import Platform
from homeassistant.core import HomeAssistant
from homeassistant.helpers.entity import Entity
from homeassistant.helpers.entity_platform import AddEntitiesCallback
from homeassistant.helpers.typing import DiscoveryInfoType

from .const import DATA_ENTITIES, DATA_HOUSE
from .model import EntitySpec


class DemoEntity(Entity):
    """An entity of the demo house: state lives in memory, updates are pushed."""

    _attr_should_poll = False

    def __init__(self, spec: EntitySpec) -> None:
        """Name and unique id come from house.yaml (or a fixture); then its state."""
        self._attr_unique_id = spec.unique_id
        self._attr_name = spec.name
        self.apply_options(spec.options)

    def apply_options(self, options: dict[str, Any]) -> None:
        """Take the state the (validated) platform options describe."""
        raise NotImplementedError

    async def async_added_to_hass(self) -> None:
        """Findable by entity id, so `hearth_demo.set_states` can reset it."""
        entities = self.hass.data.setdefault(DATA_ENTITIES, {})
        entities[self.entity_id] = self
        self.async_on_remove(lambda: entities.pop(self.entity_id, None))


def add_demo_entities(
    hass: HomeAssistant,
    platform: Platform,
    factory: Callable[[EntitySpec], Entity],
    async_add_entities: AddEntitiesCallback,
    discovery_info: DiscoveryInfoType | None,
) -> None:
    """Add the entities of one platform; only the demo integration's discovery loads it."""
    if discovery_info is None:
        return
    async_add_entities(factory(spec) for spec in hass.data[DATA_HOUSE].entities_of(platform))
