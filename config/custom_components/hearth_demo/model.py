"""The demo house as plain data: floors, areas and entity specs (no Home Assistant state)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from homeassistant.const import Platform

from .helpers import HelperSpec


@dataclass(frozen=True, slots=True)
class EntitySpec:
    """One demo entity: its platform, name, aliases and initial state options."""

    platform: Platform
    unique_id: str
    name: str
    area: str | None
    aliases: tuple[str, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    object_id: str | None = None  # the entity id's object part (fixtures fix it)


@dataclass(frozen=True, slots=True)
class AreaSpec:
    """An area on a floor."""

    name: str
    floor: str | None
    aliases: tuple[str, ...] = ()
    icon: str | None = None


@dataclass(frozen=True, slots=True)
class FloorSpec:
    """A floor of the house."""

    name: str
    level: int
    aliases: tuple[str, ...] = ()
    icon: str | None = None


@dataclass(frozen=True, slots=True)
class AccessSpec:
    """The demo user and where its password and token are written (paths in config/)."""

    username: str
    display_name: str
    password_file: Path
    token_file: Path


@dataclass(frozen=True, slots=True)
class HearthSpec:
    """How to wire the Hearth integration in."""

    enabled: bool
    engine_url: str
    set_pipeline: bool
    prefer_local: bool = True
    agent_options: Mapping[str, Any] = field(default_factory=dict)  # set on the agent
    entry_options: Mapping[str, Any] = field(default_factory=dict)  # set on the engine entry


@dataclass(frozen=True, slots=True)
class House:
    """Everything the demo integration builds."""

    floors: tuple[FloorSpec, ...]
    areas: tuple[AreaSpec, ...]
    entities: tuple[EntitySpec, ...]
    access: AccessSpec
    hearth: HearthSpec
    timer_devices: tuple[str, ...] = ()  # device ids that take timers (fixture devices)
    left_out: tuple[str, ...] = ()  # fixture entities not built: "<entity id>: <why>"
    helpers: tuple[HelperSpec, ...] = ()  # a fixture's input_* and scripts

    def entities_of(self, platform: Platform) -> list[EntitySpec]:
        """Return the entity specs of one platform, in file order."""
        return [spec for spec in self.entities if spec.platform == platform]
