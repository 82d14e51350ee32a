"""What changed in the house since its prefix was pinned, told as sentences.

A re-pin waits for the house to be quiet (the debounce) and then for the engine to
prefill it, and requests meanwhile keep the pinned prefix (a cold prefill of the whole
house per request would stall every turn). Its static context is then out of date, and
a diff of lines cannot say so: an area move puts a name on another area's line, and
a rename leaves the old name in the prefix. So each prefix keeps a snapshot of the
house it describes, and a request sent with an older prefix states the difference:
"Lamp is now in area Study.", "Lamp was renamed to Desk Lamp.", "Fan no longer exists.".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from homeassistant.components import conversation
from homeassistant.components.homeassistant.llm import async_get_exposed_entities
from homeassistant.core import HomeAssistant, SupportsResponse
from homeassistant.util import yaml as yaml_util

from .listing import fit, render_listing


@dataclass(frozen=True, slots=True)
class HouseEntity:
    """One exposed entity as the static context describes it."""

    name: str  # the name the house uses for it (its state's name)
    names: str  # all its names, as the static context lists them
    domain: str
    area: str | None
    areas: str = ""  # its area's names (the area, then its aliases), as listed
    acts: bool = True  # its domain has an action (a sensor has none): kept first (fit)

    @property
    def aliases(self) -> str:
        """Its names other than ``name``, as listed."""
        return ", ".join(part for part in self.names.split(", ") if part != self.name)


@dataclass(frozen=True)
class HouseSnapshot:
    """The exposed entities of HA's static context (by entity id), and how the prompt
    lists them (``house/listing.py``)."""

    entities: Mapping[str, HouseEntity]
    listing: str
    # HA's YAML of the same entities: what the listing replaces in HA's prompts.
    yaml: str = field(default="", compare=False)
    # The exposed entities the listing leaves out to fit the model's context.
    left_out: frozenset[str] = frozenset()

    @cached_property
    def listing_lines(self) -> frozenset[str]:
        """The lines of the listing."""
        return frozenset(self.listing.splitlines())

    def fitted(self, fits: Callable[[str], bool]) -> HouseSnapshot:
        """This house listed with as many entities as ``fits`` accepts (``fit``)."""
        ids = {id(entity): entity_id for entity_id, entity in self.entities.items()}
        result = fit(list(self.entities.values()), fits)
        left_out = frozenset(ids[id(entity)] for entity in result.left_out)
        return dataclasses.replace(self, listing=result.listing, left_out=left_out)


def capture(hass: HomeAssistant) -> HouseSnapshot:
    """The house as the Assist API's static context shows it now (HA's own function)."""
    exposed = async_get_exposed_entities(hass, conversation.DOMAIN, include_state=False)
    acting: dict[str, bool] = {}
    entities: dict[str, HouseEntity] = {}
    for entity_id, info in exposed.items():
        state = hass.states.get(entity_id)
        names = str(info.get("names", ""))
        areas = str(info.get("areas", ""))
        domain = str(info.get("domain", ""))
        if domain not in acting:
            acting[domain] = _acts(hass, domain)
        entities[entity_id] = HouseEntity(
            name=state.name if state is not None else names,
            names=names,
            domain=domain,
            area=areas.split(", ", 1)[0] if areas else None,
            areas=areas,
            acts=acting[domain],
        )
    yaml = yaml_util.dump(list(exposed.values())) if exposed else ""
    return HouseSnapshot(entities=entities, listing=render_listing(entities.values()), yaml=yaml)


def _acts(hass: HomeAssistant, domain: str) -> bool:
    """Whether ``domain`` has an action that does something (a weather entity's only
    action answers a question; a sensor has none)."""
    return any(
        service.supports_response is not SupportsResponse.ONLY
        for service in hass.services.async_services_for_domain(domain).values()
    )


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
