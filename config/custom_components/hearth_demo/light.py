"""Demo lights: on/off, dimmable, or colour (hs + colour temperature)."""

from __future__ import annotations

from typing import Any

from homeassistant.components.light import (
    ATTR_BRIGHTNESS,
    ATTR_COLOR_TEMP_KELVIN,
    ATTR_HS_COLOR,
    ColorMode,
    LightEntity,
)
from homeassistant.const import Platform

from .entity import DemoEntity, demo_platform

WARM_WHITE_K = 2700


class DemoLight(DemoEntity, LightEntity):
    """A light that does what it is told."""

    _attr_min_color_temp_kelvin = 2000
    _attr_max_color_temp_kelvin = 6500

    def apply_options(self, options: dict[str, Any]) -> None:
        """State from house.yaml or a fixture."""
        self._attr_is_on = options["is_on"]
        if options["color"]:
            self._attr_supported_color_modes = {ColorMode.COLOR_TEMP, ColorMode.HS}
            self._attr_color_mode = ColorMode.COLOR_TEMP
            self._attr_color_temp_kelvin = WARM_WHITE_K
            self._attr_hs_color = (30.0, 60.0)
        elif options["dimmable"]:
            self._attr_supported_color_modes = {ColorMode.BRIGHTNESS}
            self._attr_color_mode = ColorMode.BRIGHTNESS
        else:
            self._attr_supported_color_modes = {ColorMode.ONOFF}
            self._attr_color_mode = ColorMode.ONOFF
        self._attr_brightness = None
        if self._attr_color_mode == ColorMode.ONOFF:
            return
        if "raw_brightness" in options:  # a fixture's own value, None included
            self._attr_brightness = options["raw_brightness"]
        else:
            self._attr_brightness = round(options["brightness"] * 255 / 100)

    async def async_turn_on(self, **kwargs: Any) -> None:
        """Turn on, with brightness or colour when given (else the brightness it had)."""
        self._attr_is_on = True
        if ATTR_BRIGHTNESS in kwargs and self._attr_color_mode != ColorMode.ONOFF:
            self._attr_brightness = kwargs[ATTR_BRIGHTNESS]
        if ATTR_HS_COLOR in kwargs and ColorMode.HS in self.supported_color_modes:
            self._attr_hs_color = kwargs[ATTR_HS_COLOR]
            self._attr_color_mode = ColorMode.HS
        if ATTR_COLOR_TEMP_KELVIN in kwargs and ColorMode.COLOR_TEMP in self.supported_color_modes:
            self._attr_color_temp_kelvin = kwargs[ATTR_COLOR_TEMP_KELVIN]
            self._attr_color_mode = ColorMode.COLOR_TEMP
        self.async_write_ha_state()

    async def async_turn_off(self, **kwargs: Any) -> None:
        """Turn off."""
        self._attr_is_on = False
        self.async_write_ha_state()


async_setup_platform = demo_platform(Platform.LIGHT, DemoLight)
