"""Timers for dataset devices, so Assist's timer intents work on them.

Home Assistant offers HassStartTimer only for a request from a device that registered a
timer handler (a voice satellite does). Each fixture device registers one; a request
whose test names a ``context_device`` then takes timers like a satellite would.
"""

from __future__ import annotations

import logging

from homeassistant.components.intent import (
    TimerEventType,
    TimerInfo,
    async_register_timer_handler,
)
from homeassistant.core import HomeAssistant, callback

_LOGGER = logging.getLogger(__name__)


@callback
def async_register_timer_devices(hass: HomeAssistant, device_ids: tuple[str, ...]) -> None:
    """Register a handler per device id; timer events are only logged."""

    @callback
    def _handle(event: TimerEventType, timer: TimerInfo) -> None:
        _LOGGER.info("Timer %s on %s: %s", timer.id, timer.device_id, event)

    for device_id in device_ids:
        async_register_timer_handler(hass, device_id, _handle)
