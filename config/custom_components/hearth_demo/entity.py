"""Base class and platform set-up shared by the demo entities."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from homeassistant.const import Platform
from homeassistant.core import HomeAssistant
from homeassistant.helpers.entity import Entity
from homeassistant.helpers.entity_platform import AddEntitiesCallback
from homeassistant.helpers.typing import ConfigType, DiscoveryInfoType

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


SetupPlatform = Callable[
    [HomeAssistant, ConfigType, AddEntitiesCallback, DiscoveryInfoType | None], Awaitable[None]
]


def demo_platform(platform: Platform, factory: Callable[[EntitySpec], Entity]) -> SetupPlatform:
    """The ``async_setup_platform`` of a demo platform module: the house's entities of
    ``platform``, made by ``factory``. Only the demo integration's discovery loads them."""

    async def async_setup_platform(
        hass: HomeAssistant,
        config: ConfigType,
        async_add_entities: AddEntitiesCallback,
        discovery_info: DiscoveryInfoType | None = None,
    ) -> None:
        if discovery_info is None:
            return
        house = hass.data[DATA_HOUSE]
        async_add_entities(factory(spec) for spec in house.entities_of(platform))

    return async_setup_platform
