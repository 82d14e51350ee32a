"""Which registry and state events can change a rendered house prefix.

Filters for the bus listeners of ``pins/manager.py``: a change that cannot change the static
context or the tools (a light merely turning on, a new device without entities yet)
never schedules a re-pin.
"""

from __future__ import annotations

from homeassistant.core import EventStateChangedData, callback
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers import entity_registry as er

# Registry changes that can change the static context or the tools.
ENTITY_CHANGES = frozenset(
    {
        "aliases",
        "area_id",
        "device_id",
        "disabled_by",
        "entity_id",
        "hidden_by",
        "name",
        "original_name",
    }
)
DEVICE_CHANGES = frozenset({"area_id", "disabled_by", "name", "name_by_user"})


@callback
def entity_registry_filter(event_data: er.EventEntityRegistryUpdatedData) -> bool:
    """An entity was created or removed, or changed what the static context shows."""
    if event_data["action"] != "update":
        return True  # created or removed
    return not ENTITY_CHANGES.isdisjoint(event_data["changes"])


@callback
def device_registry_filter(event_data: dr.EventDeviceRegistryUpdatedData) -> bool:
    """A device was removed, or changed what its entities show (area, name)."""
    if event_data["action"] == "remove":
        return True
    if event_data["action"] != "update":
        return False  # a new device has no entities yet
    return not DEVICE_CHANGES.isdisjoint(event_data["changes"])


@callback
def state_changed_filter(event_data: EventStateChangedData) -> bool:
    """An entity appeared, disappeared or was renamed; never a plain state change."""
    old, new = event_data["old_state"], event_data["new_state"]
    return old is None or new is None or old.name != new.name
