"""Device capability classes: what the speaking device changes in HA's prompt and tools.

Home Assistant's Assist API gives a request from a device (a voice satellite) other
text and tools than one without (``homeassistant/components/intent/llm.py``):

- an *area line*: "You are in area X ..." for a device in an area, otherwise "... ask
  the user to specify an area ...". It differs from one device to the next;
- "This device is not able to start timers." unless the device registered a timer
  handler (``intent.async_device_supports_timers``), and only such a device gets the
  timer tools (``HassStartTimer``, ...).

So each agent pins one prefix per *class* (no device, a device without timers, a device
with timers), rendered as HA renders it for one device of that class, with the lines
about where that device is taken out: they go to the request's context message, where
every request has its own device's lines. Every device of a class then sends the same
prefix tokens, and gets exactly the lines and tools HA would give it.

HA writes the class's lines near the top of its prompt, before the house. Pinned there,
they would make the classes' prefixes differ from that line on, and each class would
prefill the whole house again. So the lines that differ between the classes in use
close the prefix instead (``split_class_lines``): the classes share every token up to
them (the timer class also has its own tools and worked examples, which differ where the
chat template writes them).

The area lines are found without reading HA's wording (which may change, or be
translated): they are the lines of the device's render that the render for no device
lacks (``device_lines``). A device without an area gets the same line as no
device; so the class is rendered with a device that has an area where one of the class
does (``representative``: picked from the device registry), and that line leaves the
prefix too.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from homeassistant.components.intent.timers import async_device_supports_timers
from homeassistant.core import HomeAssistant
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers import entity_registry as er

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


def device_lines(prompt: str, no_device_prompt: str) -> list[str]:
    """The lines of ``prompt`` (HA's API prompt for a device) that its render for no
    device lacks: where the device is (its area and floor), in HA's own words."""
    common = set(no_device_prompt.split("\n"))
    return [line for line in prompt.split("\n") if line not in common]


def split_class_lines(own: str, no_device: str, others: Iterable[str]) -> tuple[str, str]:
    """An API prompt as (the lines every render has, the lines of its own class).

    ``own`` is HA's render for the class, ``no_device`` the render for no device, and
    ``others`` the renders of the other classes in use (``variant_devices``). The
    device lines of ``own`` (``device_lines``) are in neither part: they go to the
    context message. Nothing here reads HA's wording: renders are compared line by line.
    """
    lines = own.split("\n")
    shared = set(lines).intersection(no_device.split("\n"), *(text.split("\n") for text in others))
    no_device_lines = set(no_device.split("\n"))
    return (
        "\n".join(line for line in lines if line in shared),
        "\n".join(line for line in lines if line not in shared and line in no_device_lines),
    )


def variant_devices(hass: HomeAssistant) -> list[str]:
    """Devices whose renders show every way the house's classes differ in HA's prompt:
    the representative of each class in use, and one device in an area (a device
    without a satellite speaks too, e.g. a phone: its area line replaces the no-device
    line asking for an area)."""
    found = [device_id for device_id in class_devices(hass).values() if device_id is not None]
    in_area = sorted(
        device.id
        for device in dr.async_get(hass).devices
        if dr.async_get_effective_area_id(hass, device) is not None
    )
    if in_area and in_area[0] not in found:
        found.append(in_area[0])
    return found


def representative(hass: HomeAssistant, cls: DeviceClass, preferred: str | None) -> str | None:
    """A device id of class ``cls`` to render its prefix with (None: none exists).

    The same for every request of the class, whichever device speaks: among the devices
    with an Assist satellite (or, for timers, any timer device), one in an area first
    (its area lines then all leave the prefix), by id. ``preferred`` (the device
    speaking) only where the class has no such device.
    """
    if cls is DeviceClass.NONE:
        return None
    registry = dr.async_get(hass)
    found = [
        (not _has_area(hass, registry, device_id), device_id)
        for device_id in _candidates(hass, cls)
        if device_class(hass, device_id) is cls
    ]
    if found:
        return min(found)[1]
    if (
        preferred is not None
        and registry.async_get(preferred) is not None
        and device_class(hass, preferred) is cls
    ):
        return preferred
    return None


def _has_area(hass: HomeAssistant, registry: dr.DeviceRegistry, device_id: str) -> bool:
    """Whether the device is in an area (its own, or its satellite entity's)."""
    device = registry.async_get(device_id)
    return device is not None and dr.async_get_effective_area_id(hass, device) is not None


def class_devices(hass: HomeAssistant) -> dict[DeviceClass, str | None]:
    """The classes in use, each with the device its prefix is rendered for: no device,
    plus the classes of the house's satellites."""
    found: dict[DeviceClass, str | None] = {DeviceClass.NONE: None}
    for cls in (DeviceClass.NO_TIMERS, DeviceClass.TIMERS):
        if (device_id := representative(hass, cls, None)) is not None:
            found[cls] = device_id
    return found


def classes_in_use(hass: HomeAssistant) -> set[DeviceClass]:
    """The classes worth pinning at start: no device, plus those of the house's satellites."""
    return set(class_devices(hass))


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
