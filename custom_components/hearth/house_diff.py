"""What changed in the house since its prefix was pinned, told as sentences.

A re-pin waits for the house to be quiet (the debounce) and then for the engine to
prefill it, and requests meanwhile keep the pinned prefix (a cold prefill of the whole
house per request would stall every turn). Its static context is then out of date, and
a diff of lines cannot say so: an area move changes no line's text but the one under
the entity ("areas: Kitchen" may well exist elsewhere), and a rename leaves the old
name in the prefix. So each prefix keeps a snapshot of the house it describes, and a
request sent with an older prefix states the difference: "Lamp is now in area Study.",
"Lamp was renamed to Desk Lamp.", "Fan no longer exists.".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from homeassistant.components import conversation
from homeassistant.components.homeassistant.llm import async_get_exposed_entities
from homeassistant.core import HomeAssistant
from homeassistant.util import yaml as yaml_util


@dataclass(frozen=True, slots=True)
class HouseEntity:
    """One exposed entity as the static context describes it."""

    name: str  # the name the house uses for it (its state's name)
    names: str  # all its names, as the static context lists them
    domain: str
    area: str | None
    areas: str = ""  # its area's names (the area, then its aliases), as listed

    @property
    def aliases(self) -> str:
        """Its names other than ``name``, as listed."""
        return ", ".join(part for part in self.names.split(", ") if part != self.name)


@dataclass(frozen=True)
class HouseSnapshot:
    """The exposed entities of HA's static context (by entity id), plus their YAML."""

    entities: Mapping[str, HouseEntity]
    yaml: str

    @cached_property
    def yaml_lines(self) -> frozenset[str]:
        """The lines of the static context's entity list."""
        return frozenset(self.yaml.splitlines())


def capture(hass: HomeAssistant) -> HouseSnapshot:
    """The house as the Assist API's static context shows it now (HA's own function)."""
    exposed = async_get_exposed_entities(hass, conversation.DOMAIN, include_state=False)
    entities: dict[str, HouseEntity] = {}
    for entity_id, info in exposed.items():
        state = hass.states.get(entity_id)
        names = str(info.get("names", ""))
        areas = str(info.get("areas", ""))
        entities[entity_id] = HouseEntity(
            name=state.name if state is not None else names,
            names=names,
            domain=str(info.get("domain", "")),
            area=areas.split(", ", 1)[0] if areas else None,
            areas=areas,
        )
    yaml = yaml_util.dump(list(exposed.values())) if exposed else ""
    return HouseSnapshot(entities=entities, yaml=yaml)


def describe_changes(old: HouseSnapshot, new: HouseSnapshot) -> list[str]:
    """Sentences that turn ``old`` into ``new`` for the model (sorted by name)."""
    changes: list[tuple[str, str]] = []
    for entity_id, before in old.entities.items():
        after = new.entities.get(entity_id)
        if after is None:
            changes.append((before.name, f"{before.name} no longer exists."))
            continue
        if after.name != before.name:
            changes.append((after.name, f"{before.name} was renamed to {after.name}."))
            if after.aliases != before.aliases:
                changes.append((after.name, f"{after.name} is now also called: {after.names}."))
        elif after.names != before.names:
            changes.append((after.name, f"{after.name} is now also called: {after.names}."))
        if after.area != before.area:
            changes.append(
                (
                    after.name,
                    f"{after.name} is now in area {after.area}."
                    if after.area
                    else f"{after.name} is no longer in an area.",
                )
            )
    for entity_id, after in new.entities.items():
        if entity_id not in old.entities:
            where = f" in area {after.area}" if after.area else ""
            changes.append((after.name, f"{after.name} ({after.domain}) was added{where}."))
    return [sentence for _name, sentence in sorted(changes, key=lambda item: item[0].lower())]


def fully_described(old: HouseSnapshot, new: HouseSnapshot) -> bool:
    """Whether ``describe_changes`` tells every difference of the static context.

    It tells names, aliases, areas, additions and removals; an area that only gained
    or lost an alias (every entity in it lists the area's names) it does not.
    """
    for entity_id, before in old.entities.items():
        after = new.entities.get(entity_id)
        if after is None:
            continue
        if after.domain != before.domain:
            return False
        if after.area == before.area and after.areas != before.areas:
            return False
    return True
