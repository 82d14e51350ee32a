"""Entity state as a dataset fixture writes it, turned into the demo platforms' options.

The home-control datasets (the format of allenporter/home-assistant-datasets) describe
each entity by a ``state`` and Home Assistant ``attributes`` (``brightness`` 0-255,
``current_position``, ``volume_level`` 0-1, enum names such as
``cover.CoverDeviceClass.GARAGE``...). The demo entities take house.yaml-style options;
this module is the one place that maps the first onto the second, for the initial build
and for the ``hearth_demo.set_states`` action that resets a home between requests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from homeassistant.const import Platform

ON_STATES = frozenset({"on", "true", "open", "opening", "home", "playing"})


def enum_value(value: Any) -> str:
    """``cover.CoverDeviceClass.GARAGE`` -> ``garage``; plain strings pass lowercased."""
    return str(value).rsplit(".", 1)[-1].lower()


def features(attributes: Mapping[str, Any]) -> set[str]:
    """Supported feature names (``cover.CoverEntityFeature.SET_POSITION`` -> SET_POSITION)."""
    raw = attributes.get("supported_features") or []
    if not isinstance(raw, list):
        return set()
    return {str(item).rsplit(".", 1)[-1].upper() for item in raw}


def state_text(state: Any) -> str | None:
    """A fixture state as text; YAML booleans (unquoted on/off) become on/off."""
    if state is None:
        return None
    if isinstance(state, bool):
        return "on" if state else "off"
    return str(state).lower()


def is_on(state: Any, default: bool = False) -> bool:
    text = state_text(state)
    return default if text is None else text in ON_STATES


def _light(state: Any, attrs: Mapping[str, Any]) -> dict[str, Any]:
    """A light's brightness is the fixture's own, absent included: turned on without a
    brightness it keeps what it had (the format's lights never make one up)."""
    modes = {enum_value(m) for m in attrs.get("supported_color_modes") or []}
    modes.add(enum_value(attrs.get("color_mode") or "onoff"))
    brightness = attrs.get("brightness")
    return {
        "is_on": is_on(state, default=bool(brightness)),
        "dimmable": bool(modes - {"onoff"}),
        "color": bool(modes & {"hs", "rgb", "rgbw", "rgbww", "xy", "color_temp"}),
        "raw_brightness": None if brightness is None else int(brightness),
    }


def _switch(state: Any, attrs: Mapping[str, Any]) -> dict[str, Any]:
    device_class = enum_value(attrs.get("device_class") or "switch")
    return {"is_on": is_on(state), "device_class": device_class}


def _cover(state: Any, attrs: Mapping[str, Any]) -> dict[str, Any]:
    settable = "SET_POSITION" in features(attrs)
    position = attrs.get("current_position")
    if position is None:
        position = 100 if is_on(state) else 0
    return {
        "device_class": enum_value(attrs.get("device_class") or "blind"),
        "position": int(position),
        "set_position": settable,
    }


def _valve(state: Any, attrs: Mapping[str, Any]) -> dict[str, Any]:
    position = attrs.get("current_position")
    if position is None:
        position = 100 if is_on(state) else 0
    return {
        "position": int(position),
        "set_position": "SET_POSITION" in features(attrs) or bool(attrs.get("reports_position")),
        "device_class": enum_value(attrs.get("device_class") or "water"),
    }


def _climate(state: Any, attrs: Mapping[str, Any]) -> dict[str, Any]:
    mode = state_text(state) or enum_value(attrs.get("hvac_mode") or "heat")
    options: dict[str, Any] = {"mode": mode if mode in ("heat", "cool", "auto") else "off"}
    if (target := attrs.get("target_temperature", attrs.get("temperature"))) is not None:
        options["target"] = float(target)
    if (current := attrs.get("current_temperature")) is not None:
        options["current"] = float(current)
    if unit := attrs.get("temperature_unit", attrs.get("unit_of_measurement")):
        options["unit"] = str(unit)
    return options


def _lock(state: Any, attrs: Mapping[str, Any]) -> dict[str, Any]:
    return {"locked": state_text(state) != "unlocked"}


def _media_player(state: Any, attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The format's player: a numbered track, a volume (half when not given; HA's 0-1,
    or a percentage where it is above 1), mute only once muted, and the features the
    fixture lists (all when it lists none)."""
    text = state_text(state) or "idle"
    muted = attrs.get("is_volume_muted")
    level = float(attrs.get("volume_level", 0.5))
    return {
        "device_class": enum_value(attrs.get("device_class") or "speaker"),
        "state": {"on": "idle", "standby": "off", "buffering": "playing"}.get(text, text),
        "volume": round(level if level > 1 else level * 100),
        "track": int(attrs.get("media_track") or 0),
        "fixture": True,
        "muted": None if muted is None else bool(muted),
        "features": sorted(features(attrs)),
    }


def _fan(state: Any, attrs: Mapping[str, Any]) -> dict[str, Any]:
    """A fan has a speed and swings only where its fixture lists the feature (a fan
    with no features is on or off); turned on it runs at full speed."""
    names = features(attrs)
    percentage = attrs.get("percentage")
    on = is_on(state, default=bool(percentage))
    return {
        "is_on": on,
        "percentage": int(percentage) if percentage is not None else (100 if on else 0),
        "oscillating": bool(attrs.get("oscillating", False)),
        "set_speed": "SET_SPEED" in names,
        "oscillate": "OSCILLATE" in names,
    }


def _vacuum(state: Any, attrs: Mapping[str, Any]) -> dict[str, Any]:
    text = state_text(state) or "docked"
    return {"state": {"off": "idle", "on": "cleaning"}.get(text, text)}


def _todo(state: Any, attrs: Mapping[str, Any]) -> dict[str, Any]:
    items = []
    for item in attrs.get("todo_items") or []:
        if isinstance(item, Mapping):
            status = str(item.get("status", "needs_action"))
            items.append({"summary": str(item.get("summary", "")), "status": status})
        else:
            items.append({"summary": str(item), "status": "needs_action"})
    return {"items": items}


def _sensor(state: Any, attrs: Mapping[str, Any]) -> dict[str, Any]:
    value = attrs.get("native_value", state)
    options: dict[str, Any] = {"value": "" if value is None else value}
    if device_class := attrs.get("device_class"):
        options["device_class"] = enum_value(device_class)
    if unit := attrs.get("native_unit_of_measurement", attrs.get("unit_of_measurement")):
        options["unit"] = str(unit)
    return options


def _binary_sensor(state: Any, attrs: Mapping[str, Any]) -> dict[str, Any]:
    options: dict[str, Any] = {"is_on": is_on(state)}
    if device_class := attrs.get("device_class"):
        options["device_class"] = enum_value(device_class)
    return options


def _weather(state: Any, attrs: Mapping[str, Any]) -> dict[str, Any]:
    def number(key: str) -> float | None:
        value = attrs.get(key)
        return None if value is None else float(value)

    options: dict[str, Any] = {
        "condition": state_text(state),
        "temperature": number("temperature"),
        "humidity": number("humidity"),
        "wind_speed": number("wind_speed"),
        "pressure": number("pressure"),
    }
    if unit := attrs.get("temperature_unit"):
        options["temperature_unit"] = str(unit)
    return options


def _calendar(state: Any, attrs: Mapping[str, Any]) -> dict[str, Any]:
    events = attrs.get("events") or []
    return {
        "events": [
            {"summary": str(e["summary"]), "start": str(e["start"]), "end": str(e["end"])}
            for e in events
        ]
    }


CONVERTERS: dict[Platform, Callable[[Any, Mapping[str, Any]], dict[str, Any]]] = {
    Platform.LIGHT: _light,
    Platform.SWITCH: _switch,
    Platform.COVER: _cover,
    Platform.VALVE: _valve,
    Platform.CLIMATE: _climate,
    Platform.LOCK: _lock,
    Platform.MEDIA_PLAYER: _media_player,
    Platform.FAN: _fan,
    Platform.VACUUM: _vacuum,
    Platform.TODO: _todo,
    Platform.SENSOR: _sensor,
    Platform.BINARY_SENSOR: _binary_sensor,
    Platform.WEATHER: _weather,
    Platform.CALENDAR: _calendar,
}


def options_from_fixture(
    platform: Platform, state: Any, attributes: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The platform options for a fixture entity (not yet validated: see schema.py).

    Raises KeyError for a domain the demo does not implement.
    """
    return CONVERTERS[platform](state, attributes or {})
