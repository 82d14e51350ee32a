"""Device capability classes: what the speaking device changes in HA's prompt and tools.

Home Assistant's Assist API gives a request from a device (a voice satellite) other
text and tools than one without (``homeassistant/components/intent/llm.py``):

- an *area line*: "You are in area X ..." for a device in an area, otherwise "... ask
  the user to specify an area ...". It differs from one device to the next;
- "This device is not able to start timers." unless the device registered a timer
  handler (``intent.async_device_supports_timers``), and only such a device gets the
  timer tools (``HassStartTimer``, ...).

So each agent pins one prefix per *class* (no device, a device without timers, a device
with timers), rendered as HA renders it for a device of that class, with the area line
taken out: it is the only device-specific line, and it travels in the request's context
message. Every device of a class then sends the same prefix tokens, and gets exactly
the lines and tools HA would give it.
"""

from __future__ import annotations

import re
from enum import StrEnum

from homeassistant.components.intent.timers import async_device_supports_timers
from homeassistant.core import HomeAssistant
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers import entity_registry as er

# HA's area lines (intent/llm.py). The API prompt is not translated: English only.
_AREA_LINES = (
    re.compile(r"^You are in area .+ should target this area\.$"),
    re.compile(r"^When a user asks to turn on all devices of a specific type, ask the user to"),
)
_SATELLITE_DOMAIN = "assist_satellite"


class DeviceClass(StrEnum):
    """What a request's device changes in HA's prompt and tools."""

    NONE = "none"  # no device: text chat, automations, AI tasks
    NO_TIMERS = "no_timers"  # a device that cannot start timers
    TIMERS = "timers"  # a device registered for timer events: timer tools offered


def device_class(hass: HomeAssistant, device_id: str | None) -> DeviceClass:
    """The class of a request's device (as HA's intent LLM platform tells them apart)."""
    if device_id is None:
        return DeviceClass.NONE
    if async_device_supports_timers(hass, device_id):
        return DeviceClass.TIMERS
    return DeviceClass.NO_TIMERS


def is_area_line(line: str) -> bool:
    """Whether ``line`` is HA's line about the speaking device's area."""
    return any(pattern.match(line) for pattern in _AREA_LINES)


def without_area_lines(text: str) -> str:
    """``text`` without the device's area line (kept in the context message instead)."""
    return "\n".join(line for line in text.split("\n") if not is_area_line(line))


def representative(hass: HomeAssistant, cls: DeviceClass, preferred: str | None) -> str | None:
    """A device id of class ``cls`` to render its prefix with (None: none exists).

    ``preferred`` (the device last seen speaking in that class) wins while it still
    has that class; otherwise, for the pins rendered at start, the first device with an
    Assist satellite (or, for timers, any timer device), by id for a stable choice.
    """
    if cls is DeviceClass.NONE:
        return None
    if (
        preferred is not None
        and dr.async_get(hass).async_get(preferred) is not None
        and device_class(hass, preferred) is cls
    ):
        return preferred
    for device_id in sorted(_candidates(hass, cls)):
        if device_class(hass, device_id) is cls:
            return device_id
    return None


def classes_in_use(hass: HomeAssistant) -> set[DeviceClass]:
    """The classes worth pinning at start: no device, plus those of the house's satellites."""
    found = {DeviceClass.NONE}
    for cls in (DeviceClass.NO_TIMERS, DeviceClass.TIMERS):
        if representative(hass, cls, None) is not None:
            found.add(cls)
    return found


def _candidates(hass: HomeAssistant, cls: DeviceClass) -> set[str]:
    """Devices that speak: those with an Assist satellite entity (for timers, any
    device that registered timer events, e.g. a test or a custom satellite)."""
    found = {
        entry.device_id
        for entry in er.async_get(hass).entities.values()
        if entry.domain == _SATELLITE_DOMAIN and entry.device_id is not None
    }
    if cls is DeviceClass.TIMERS:
        found |= {
            device.id
            for device in dr.async_get(hass).devices
            if async_device_supports_timers(hass, device.id)
        }
    return found
