"""Types only: the typed config entry, its runtime data and a turn's usage.

The coordinator and the pin manager take a plain ``ConfigEntry`` and never import
this module, so imports go one way (``data`` names them for type checking only) and
there is no cycle coordinator -> data -> pins -> coordinator (integration_blueprint's
habit; ``tests/hearth/test_structure.py`` checks it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from homeassistant.config_entries import ConfigEntry

from .backend.api import HearthClient, RequestUsage

if TYPE_CHECKING:
    from .backend.base import Backend
    from .backend.coordinator import HearthCoordinator
    from .pins.manager import PrefixManager

type HearthConfigEntry = ConfigEntry[HearthData]


@dataclass(frozen=True, slots=True)
class TurnUsage:
    """Engine usage of one conversation turn (one or more requests in the tool loop)."""

    agent_id: str
    requests: tuple[RequestUsage, ...]

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens of all requests of the turn."""
        return sum(r.prompt_tokens for r in self.requests)

    @property
    def cached_tokens(self) -> int | None:
        """Prompt tokens the engine served from its cache (None: it does not say)."""
        counts = [r.cached_tokens for r in self.requests]
        return None if None in counts else sum(c for c in counts if c is not None)

    @property
    def completion_tokens(self) -> int:
        """Generated tokens of all requests of the turn."""
        return sum(r.completion_tokens for r in self.requests)

    @property
    def ttft_ms(self) -> float | None:
        """Time to the first token of the turn (its first request): what the user waits."""
        return self.requests[0].ttft_ms if self.requests else None

    def as_dict(self) -> dict[str, Any]:
        """Summary plus every request (for the conversation trace and diagnostics)."""
        return {
            "agent_id": self.agent_id,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "ttft_ms": self.ttft_ms,
            "requests": [r.as_dict() for r in self.requests],
        }


@dataclass(slots=True)
class AgentStats:
    """What one agent's turns came to since the entry loaded (its sensors)."""

    requests: int = 0  # user turns the agent handled
    errors: int = 0  # turns that ended in an engine error
    stalls: int = 0  # of those, turns the engine stopped answering (the stall time)
    last_error: str | None = None
    last_turn: TurnUsage | None = None


@dataclass(slots=True)
class HearthData:
    """Everything a loaded engine entry holds (``entry.runtime_data``)."""

    client: HearthClient
    coordinator: HearthCoordinator
    prefixes: PrefixManager
    # What the entry was loaded with: a change to it needs a reload, while a change
    # to an agent's options only needs that agent's prefix re-rendered.
    loaded_data: Mapping[str, Any]
    loaded_subentries: frozenset[tuple[str, str, str]]
    subentry_options: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    last_turn: TurnUsage | None = None
    agents: dict[str, AgentStats] = field(default_factory=dict)  # by subentry id
    engine_device_id: str | None = None  # the engine's device: agents' ``via_device_id``

    @property
    def backend(self) -> Backend:
        """What the server can do, and how to reach it (``backend/base.py``)."""
        return self.coordinator.backend
