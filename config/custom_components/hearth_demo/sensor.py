"""Demo sensors with fixed readings (temperature, humidity, power, air quality...)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from homeassistant.components.sensor import SensorDeviceClass, SensorEntity, SensorStateClass
from homeassistant.const import (
    LIGHT_LUX,
    PERCENTAGE,
    Platform,
    UnitOfDensity,
    UnitOfEnergy,
    UnitOfPower,
    UnitOfRatio,
    UnitOfSoundPressure,
    UnitOfTemperature,
    UnitOfVolume,
    UnitOfVolumetricFlux,
)

from .entity import DemoEntity, demo_platform


@dataclass(frozen=True, slots=True)
class SensorKind:
    """How a kind of reading is described to Home Assistant."""

    device_class: SensorDeviceClass
    unit: str
    state_class: SensorStateClass = SensorStateClass.MEASUREMENT
    precision: int = 1


MEASURE = SensorStateClass.MEASUREMENT
TOTAL = SensorStateClass.TOTAL_INCREASING
KINDS: dict[str, SensorKind] = {
    "temperature": SensorKind(SensorDeviceClass.TEMPERATURE, UnitOfTemperature.CELSIUS),
    "humidity": SensorKind(SensorDeviceClass.HUMIDITY, PERCENTAGE, precision=0),
    "power": SensorKind(SensorDeviceClass.POWER, UnitOfPower.WATT, precision=0),
    "energy": SensorKind(SensorDeviceClass.ENERGY, UnitOfEnergy.KILO_WATT_HOUR, TOTAL, 2),
    "co2": SensorKind(SensorDeviceClass.CO2, UnitOfRatio.PARTS_PER_MILLION, precision=0),
    "illuminance": SensorKind(SensorDeviceClass.ILLUMINANCE, LIGHT_LUX, precision=0),
    "pm25": SensorKind(SensorDeviceClass.PM25, UnitOfDensity.MICROGRAMS_PER_CUBIC_METER),
    "battery": SensorKind(SensorDeviceClass.BATTERY, PERCENTAGE, precision=0),
    "precipitation": SensorKind(
        SensorDeviceClass.PRECIPITATION_INTENSITY, UnitOfVolumetricFlux.MILLIMETERS_PER_HOUR
    ),
    "water": SensorKind(SensorDeviceClass.WATER, UnitOfVolume.LITERS, TOTAL, 0),
    "sound": SensorKind(SensorDeviceClass.SOUND_PRESSURE, UnitOfSoundPressure.DECIBEL),
}


class DemoSensor(DemoEntity, SensorEntity):
    """A sensor that reads what house.yaml (a kind) or a fixture (class and unit) says."""

    def apply_options(self, options: dict[str, Any]) -> None:
        """Describe the reading from its kind, or from the fixture's class and unit."""
        value = options["value"]
        if kind_name := options.get("kind"):
            kind = KINDS[kind_name]
            self._attr_device_class = kind.device_class
            self._attr_native_unit_of_measurement = kind.unit
            self._attr_state_class = kind.state_class
            self._attr_suggested_display_precision = kind.precision
            self._attr_native_value = float(value)
            return
        self._attr_device_class = None
        self._attr_native_unit_of_measurement = None
        self._attr_state_class = None
        self._attr_native_value = value if value != "" else None
        if isinstance(value, float):  # only numbers may carry a class and a unit
            with contextlib.suppress(ValueError):
                self._attr_device_class = SensorDeviceClass(options.get("device_class", ""))
            self._attr_native_unit_of_measurement = options.get("unit")
            self._attr_state_class = SensorStateClass.MEASUREMENT


async_setup_platform = demo_platform(Platform.SENSOR, DemoSensor)
