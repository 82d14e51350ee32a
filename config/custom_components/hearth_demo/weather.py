"""Demo weather: a condition (the state) and today's readings, as a fixture gives them."""

from __future__ import annotations

from typing import Any

from homeassistant.components.weather import WeatherEntity
from homeassistant.const import Platform, UnitOfPressure, UnitOfSpeed, UnitOfTemperature

from .entity import DemoEntity, demo_platform


class DemoWeather(DemoEntity, WeatherEntity):
    """Current conditions only (no forecasts): what a question about the weather reads."""

    _attr_native_temperature_unit = UnitOfTemperature.CELSIUS
    _attr_native_wind_speed_unit = UnitOfSpeed.KILOMETERS_PER_HOUR
    _attr_native_pressure_unit = UnitOfPressure.HPA

    def apply_options(self, options: dict[str, Any]) -> None:
        """The condition and readings (None: not reported)."""
        self._attr_condition = options["condition"]
        self._attr_native_temperature = options["temperature"]
        self._attr_humidity = options["humidity"]
        self._attr_native_wind_speed = options["wind_speed"]
        self._attr_native_pressure = options["pressure"]
        if unit := options.get("temperature_unit"):
            self._attr_native_temperature_unit = unit


async_setup_platform = demo_platform(Platform.WEATHER, DemoWeather)
