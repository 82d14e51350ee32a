"""Demo thermostats (one target temperature), in the home's unit or the fixture's own.

A thermostat's numbers are in its ``unit`` (a fixture's ``temperature_unit``: °C, °F or
K), else in Home Assistant's unit system (°F in a US-customary home), so a home
written in °F reads back as it was written. Its range is 7-30 °C in that unit.
"""

from __future__ import annotations

from typing import Any

from homeassistant.components.climate import (
    ATTR_HVAC_MODE,
    ClimateEntity,
    ClimateEntityFeature,
    HVACAction,
    HVACMode,
)
from homeassistant.const import ATTR_TEMPERATURE, Platform, UnitOfTemperature
from homeassistant.util.unit_conversion import TemperatureConverter

from .entity import DemoEntity, demo_platform


class DemoThermostat(DemoEntity, ClimateEntity):
    """A thermostat; the room temperature stays where house.yaml puts it."""

    _attr_supported_features = (
        ClimateEntityFeature.TARGET_TEMPERATURE
        | ClimateEntityFeature.TURN_ON
        | ClimateEntityFeature.TURN_OFF
    )
    _attr_target_temperature_step = 0.5
    _unit: str | None = None

    @property
    def temperature_unit(self) -> str:
        """The fixture's unit, else the home's (°C before Home Assistant is known)."""
        if self._unit:
            return self._unit
        return self.hass.config.units.temperature_unit if self.hass else UnitOfTemperature.CELSIUS

    @property
    def min_temp(self) -> float:
        return self._in_unit(7.0)

    @property
    def max_temp(self) -> float:
        return self._in_unit(30.0)

    def _in_unit(self, celsius: float) -> float:
        value = TemperatureConverter.convert(
            celsius, UnitOfTemperature.CELSIUS, self.temperature_unit
        )
        return round(value, 1)

    def apply_options(self, options: dict[str, Any]) -> None:
        """State from house.yaml or a fixture."""
        self._unit = options.get("unit")
        self._attr_hvac_modes = [HVACMode.OFF, HVACMode.HEAT, HVACMode.COOL, HVACMode.AUTO]
        self._attr_target_temperature = options["target"]
        self._attr_current_temperature = options["current"]
        self._attr_hvac_mode = HVACMode(options["mode"])
        self._last_on_mode = (
            self._attr_hvac_mode if self._attr_hvac_mode != HVACMode.OFF else HVACMode.HEAT
        )

    @property
    def hvac_action(self) -> HVACAction:
        """Heating or cooling while the room is off target."""
        current, target = self.current_temperature, self.target_temperature
        if self.hvac_mode == HVACMode.OFF:
            return HVACAction.OFF
        if current is None or target is None:
            return HVACAction.IDLE
        if self.hvac_mode in (HVACMode.HEAT, HVACMode.AUTO) and current < target:
            return HVACAction.HEATING
        if self.hvac_mode in (HVACMode.COOL, HVACMode.AUTO) and current > target:
            return HVACAction.COOLING
        return HVACAction.IDLE

    async def async_set_temperature(self, **kwargs: Any) -> None:
        """Set the target (and the mode, when given)."""
        if (mode := kwargs.get(ATTR_HVAC_MODE)) is not None:
            self._set_mode(HVACMode(mode))
        if (temperature := kwargs.get(ATTR_TEMPERATURE)) is not None:
            self._attr_target_temperature = float(temperature)
        self.async_write_ha_state()

    async def async_set_hvac_mode(self, hvac_mode: HVACMode) -> None:
        """Set the mode."""
        self._set_mode(hvac_mode)
        self.async_write_ha_state()

    async def async_turn_on(self) -> None:
        """Back to the last mode that was not off."""
        await self.async_set_hvac_mode(self._last_on_mode)

    async def async_turn_off(self) -> None:
        """Off."""
        await self.async_set_hvac_mode(HVACMode.OFF)

    def _set_mode(self, mode: HVACMode) -> None:
        self._attr_hvac_mode = mode
        if mode != HVACMode.OFF:
            self._last_on_mode = mode


async_setup_platform = demo_platform(Platform.CLIMATE, DemoThermostat)
