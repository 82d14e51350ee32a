"""YAML schema of the demo house (house.yaml) and its conversion to the model."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import probatio
from homeassistant.const import CONF_NAME, Platform
from homeassistant.helpers import config_validation as cv
from homeassistant.util import slugify

from .const import (
    DEFAULT_ENGINE_URL,
    DEFAULT_PASSWORD_FILE,
    DEFAULT_TOKEN_FILE,
    DEFAULT_USERNAME,
    DOMAIN,
    ENV_ENGINE_URL,
)
from .fixtures import load_fixture_home
from .helpers import HelperSpec
from .model import AccessSpec, AreaSpec, EntitySpec, FloorSpec, HearthSpec, House
from .sensor import KINDS as SENSOR_KINDS

CONF_ALIASES = "aliases"
CONF_AREAS = "areas"
CONF_FIXTURES = "fixtures"
CONF_FLOORS = "floors"
CONF_ICON = "icon"
CONF_ID = "id"
CONF_LEVEL = "level"

PERCENT = probatio.All(probatio.Coerce(int), probatio.Range(min=0, max=100))
# Any unit Home Assistant takes: a room in °C, °F or K (-40 °C/°F up to 400 K).
TEMPERATURE = probatio.All(probatio.Coerce(float), probatio.Range(min=-40, max=400))
TEMPERATURE_UNITS = ["°C", "°F", "K"]
ALIASES = probatio.All(cv.ensure_list, [cv.string])


def _off_as_text(value: Any) -> Any:
    """YAML 1.1 reads an unquoted `off` as false: take it as the state "off"."""
    return "off" if value is False else value


def one_of(*choices: str) -> probatio.All:
    """A string option, forgiving an unquoted `off`."""
    return probatio.All(_off_as_text, probatio.In(list(choices)))


BASE_FIELDS: dict[Any, Any] = {
    probatio.Required(CONF_NAME): cv.string,
    probatio.Optional(CONF_ID): cv.slug,
    probatio.Optional(CONF_ALIASES, default=[]): ALIASES,
}

# Per platform: the options an entity accepts, with their defaults.
PLATFORM_FIELDS: dict[Platform, dict[Any, Any]] = {
    Platform.LIGHT: {
        probatio.Optional("is_on", default=False): cv.boolean,
        probatio.Optional("brightness", default=80): probatio.All(
            probatio.Coerce(int), probatio.Range(min=1, max=100)
        ),
        probatio.Optional("dimmable", default=True): cv.boolean,
        probatio.Optional("color", default=False): cv.boolean,
        # Home Assistant's own 0-255 scale (fixtures); wins over `brightness`, and
        # None keeps a fixture light without one (it is not made up when turned on).
        probatio.Optional("raw_brightness"): probatio.Any(
            None, probatio.All(probatio.Coerce(int), probatio.Range(min=0, max=255))
        ),
    },
    Platform.SWITCH: {
        probatio.Optional("is_on", default=False): cv.boolean,
        probatio.Optional("device_class", default="switch"): probatio.In(["switch", "outlet"]),
    },
    Platform.COVER: {
        probatio.Optional("device_class", default="blind"): probatio.In(
            ["awning", "blind", "curtain", "door", "garage", "gate", "shade", "shutter", "window"]
        ),
        probatio.Optional("position", default=100): PERCENT,
        # None: by device class (garages, doors and gates only open and close).
        probatio.Optional("set_position", default=None): probatio.Any(None, cv.boolean),
    },
    Platform.CLIMATE: {
        probatio.Optional("target", default=20.0): TEMPERATURE,
        probatio.Optional("current", default=19.5): TEMPERATURE,
        probatio.Optional("mode", default="heat"): one_of("heat", "cool", "auto", "off"),
        # None: Home Assistant's unit system (house.yaml in °C; a fixture in its home's).
        probatio.Optional("unit", default=None): probatio.Any(None, probatio.In(TEMPERATURE_UNITS)),
    },
    Platform.SENSOR: {
        # house.yaml names a kind; fixtures give Home Assistant's device class and unit.
        probatio.Optional("kind"): probatio.In(sorted(SENSOR_KINDS)),
        probatio.Required("value"): probatio.Any(probatio.Coerce(float), cv.string),
        probatio.Optional("device_class"): cv.string,
        probatio.Optional("unit"): cv.string,
    },
    Platform.MEDIA_PLAYER: {
        probatio.Optional("device_class", default="speaker"): probatio.In(
            ["speaker", "tv", "receiver", "projector"]
        ),
        probatio.Optional("state", default="idle"): one_of("off", "idle", "playing", "paused"),
        probatio.Optional("volume", default=30): PERCENT,
        probatio.Optional("sources", default=[]): probatio.All(cv.ensure_list, [cv.string]),
        probatio.Optional("track", default=1): probatio.All(
            probatio.Coerce(int), probatio.Range(min=0)
        ),
        # A fixture's player (the public format): numbered tracks, no titles, muted
        # only once muted, the features the fixture lists (empty: all).
        probatio.Optional("fixture", default=False): cv.boolean,
        probatio.Optional("muted", default=None): probatio.Any(None, cv.boolean),
        probatio.Optional("features", default=[]): [cv.string],
    },
    Platform.LOCK: {
        probatio.Optional("locked", default=True): cv.boolean,
    },
    Platform.FAN: {
        probatio.Optional("is_on", default=False): cv.boolean,
        probatio.Optional("percentage", default=0): PERCENT,
        probatio.Optional("oscillating", default=False): cv.boolean,
        probatio.Optional("set_speed", default=True): cv.boolean,
        probatio.Optional("oscillate", default=False): cv.boolean,
    },
    Platform.VALVE: {
        probatio.Optional("position", default=0): PERCENT,
        probatio.Optional("set_position", default=True): cv.boolean,
        probatio.Optional("device_class", default="water"): probatio.In(["water", "gas"]),
    },
    Platform.VACUUM: {
        probatio.Optional("state", default="docked"): probatio.In(
            ["cleaning", "docked", "idle", "paused", "returning", "error"]
        ),
    },
    Platform.TODO: {
        probatio.Optional("items", default=[]): [
            probatio.Schema(
                {
                    probatio.Required("summary"): cv.string,
                    probatio.Optional("status", default="needs_action"): probatio.In(
                        ["needs_action", "completed"]
                    ),
                }
            )
        ],
    },
    Platform.BINARY_SENSOR: {
        probatio.Optional("is_on", default=False): cv.boolean,
        probatio.Optional("device_class"): cv.string,
    },
    Platform.WEATHER: {
        probatio.Optional("condition", default=None): probatio.Any(None, cv.string),
        **{
            probatio.Optional(key, default=None): probatio.Any(None, probatio.Coerce(float))
            for key in ("temperature", "humidity", "wind_speed", "pressure")
        },
        probatio.Optional("temperature_unit"): probatio.In(TEMPERATURE_UNITS),
    },
    Platform.CALENDAR: {
        probatio.Optional("events", default=[]): [
            probatio.Schema(
                {
                    probatio.Required("summary"): cv.string,
                    probatio.Required("start"): cv.string,
                    probatio.Required("end"): cv.string,
                }
            )
        ],
    },
}


def validate_options(platform: Platform, options: dict[str, Any]) -> dict[str, Any]:
    """A platform's options with their defaults filled in; raises probatio.Invalid."""
    return dict(probatio.Schema(PLATFORM_FIELDS[platform])(options))


def _entity_schema(platform: Platform) -> probatio.All:
    """An entity is a mapping, or just its name when every option has a default."""
    mapping = probatio.Schema({**BASE_FIELDS, **PLATFORM_FIELDS[platform]})

    def _name_to_mapping(value: Any) -> Any:
        return {CONF_NAME: value} if isinstance(value, str) else value

    return probatio.All(_name_to_mapping, mapping)


AREA_SCHEMA = probatio.Schema(
    {
        probatio.Required(CONF_NAME): cv.string,
        probatio.Optional(CONF_ALIASES, default=[]): ALIASES,
        probatio.Optional(CONF_ICON): cv.icon,
        **{
            probatio.Optional(str(platform), default=[]): [_entity_schema(platform)]
            for platform in PLATFORM_FIELDS
        },
    }
)

FLOOR_SCHEMA = probatio.Schema(
    {
        probatio.Required(CONF_NAME): cv.string,
        probatio.Required(CONF_LEVEL): probatio.Coerce(int),
        probatio.Optional(CONF_ALIASES, default=[]): ALIASES,
        probatio.Optional(CONF_ICON): cv.icon,
        probatio.Required(CONF_AREAS): [AREA_SCHEMA],
    }
)

USER_SCHEMA = probatio.Schema(
    {
        probatio.Optional("username", default=DEFAULT_USERNAME): cv.string,
        probatio.Optional(CONF_NAME, default="Demo"): cv.string,
        probatio.Optional("password_file", default=DEFAULT_PASSWORD_FILE): cv.string,
        probatio.Optional("token_file", default=DEFAULT_TOKEN_FILE): cv.string,
    }
)

HEARTH_SCHEMA = probatio.Schema(
    {
        probatio.Optional("enabled", default=True): cv.boolean,
        probatio.Optional("engine_url"): cv.url,
        probatio.Optional("set_pipeline", default=True): cv.boolean,
        # Assist's built-in sentence matcher answers plain commands first (README).
        probatio.Optional("prefer_local", default=True): cv.boolean,
        # Options of the "Hearth" conversation agent set at start (e.g. tool_first): the
        # accuracy bench measures them; the agent's own form validates them.
        probatio.Optional("agent_options", default={}): {
            cv.string: probatio.Any(bool, int, float, str)
        },
        # Options of the engine entry set at start (the accuracy bench's stall time: its
        # answers are judged, not the loaded host's first token).
        probatio.Optional("entry_options", default={}): {
            cv.string: probatio.Any(bool, int, float, str)
        },
    }
)

HOUSE_SCHEMA = probatio.Schema(
    {
        probatio.Optional("user", default={}): USER_SCHEMA,
        probatio.Optional("hearth", default={}): HEARTH_SCHEMA,
        probatio.Optional(CONF_FLOORS, default=[]): [FLOOR_SCHEMA],
        # A dataset home (`_fixtures.yaml`, relative to config/): built alongside the floors.
        probatio.Optional(CONF_FIXTURES): cv.string,
    }
)

CONFIG_SCHEMA = probatio.Schema({DOMAIN: HOUSE_SCHEMA}, extra=probatio.ALLOW_EXTRA)


def _unique(kind: str, names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        key = name.casefold()
        if key in seen:
            raise probatio.Invalid(f"duplicate {kind}: {name}")
        seen.add(key)


def house_from_config(conf: dict[str, Any], config_dir: Path) -> House:
    """Turn the validated `hearth_demo:` mapping into the house model.

    Raises probatio.Invalid for names that would collide in the registries.
    """
    floors: list[FloorSpec] = []
    areas: list[AreaSpec] = []
    entities: list[EntitySpec] = []
    for floor in conf[CONF_FLOORS]:
        floors.append(
            FloorSpec(
                name=floor[CONF_NAME],
                level=floor[CONF_LEVEL],
                aliases=tuple(floor[CONF_ALIASES]),
                icon=floor.get(CONF_ICON),
            )
        )
        for area in floor[CONF_AREAS]:
            areas.append(
                AreaSpec(
                    name=area[CONF_NAME],
                    floor=floor[CONF_NAME],
                    aliases=tuple(area[CONF_ALIASES]),
                    icon=area.get(CONF_ICON),
                )
            )
            for platform in PLATFORM_FIELDS:
                for item in area[str(platform)]:
                    options = dict(item)
                    name = options.pop(CONF_NAME)
                    aliases = tuple(options.pop(CONF_ALIASES))
                    unique_id = options.pop(CONF_ID, None) or slugify(name)
                    entities.append(
                        EntitySpec(platform, unique_id, name, area[CONF_NAME], aliases, options)
                    )

    timer_devices: tuple[str, ...] = ()
    left_out: tuple[str, ...] = ()
    helpers: tuple[HelperSpec, ...] = ()
    if fixture := conf.get(CONF_FIXTURES):
        home = load_fixture_home(config_dir / fixture, validate_options)
        floors += home.floors
        areas += home.areas
        entities += home.entities
        timer_devices = home.devices
        left_out = home.left_out
        helpers = home.helpers

    _unique("floor", [floor.name for floor in floors])
    _unique("area", [area.name for area in areas])
    _unique("entity", [f"{spec.platform}.{spec.unique_id}" for spec in entities])

    user = conf["user"]
    hearth = conf["hearth"]
    return House(
        floors=tuple(floors),
        areas=tuple(areas),
        entities=tuple(entities),
        access=AccessSpec(
            username=user["username"],
            display_name=user[CONF_NAME],
            password_file=config_dir / user["password_file"],
            token_file=config_dir / user["token_file"],
        ),
        hearth=HearthSpec(
            enabled=hearth["enabled"],
            engine_url=hearth.get("engine_url")
            or os.environ.get(ENV_ENGINE_URL, DEFAULT_ENGINE_URL),
            set_pipeline=hearth["set_pipeline"],
            prefer_local=hearth["prefer_local"],
            agent_options=dict(hearth["agent_options"]),
            entry_options=dict(hearth["entry_options"]),
        ),
        timer_devices=timer_devices,
        left_out=left_out,
        helpers=helpers,
    )
