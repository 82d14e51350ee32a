"""Call: whether each of the model's tool calls runs, and with what arguments.

``Calls`` holds what the turn read (turn/understand.py) and decided (turn/decide.py)
that a call is judged by: ``refusal`` says why a call is not run (the guard,
turn/guard.py; in a spoken first turn, a name that shares no word with the request),
``resolve`` gives a call's arguments as Home Assistant should run them
(resolve.resolve_call). The stream (turn/stream.py) asks both of every call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from homeassistant.core import HomeAssistant

from ..house.names import names_entity, normalize, unasked
from ..house.resolve import resolve_call
from ..house.values import scoped_arguments
from ..language.intents_data import cached_language_data
from ..tool_names import bare_name
from .guard import Guard
from .refusal import Refusal
from .result_speech import NOT_ASKED
from .understand import House, Request


@dataclass(frozen=True, slots=True)
class Calls:
    """What a turn's calls are judged by: the ``request`` (and the domains it is
    about, as the policy keeps them), the ``house``'s names, each tool's arguments
    (``accepts``)."""

    request: Request
    house: House
    accepts: Mapping[str, tuple[str, ...]]  # tool (as shown) -> its arguments
    spoken: bool = True  # a conversation (speech); an AI Task's reply is structured data
    guard: Guard | None = None  # whether a call can act on what was asked (turn/guard.py)

    @classmethod
    def of(
        cls,
        hass: HomeAssistant,
        request: Request,
        house: House,
        *,
        tools: tuple[dict[str, Any], ...],
        spoken: bool,
    ) -> Calls:
        """The calls of a turn whose request is ``request``, offered ``tools``."""
        accepts = {
            str(function.get("name", "")): tuple(
                (function.get("parameters") or {}).get("properties") or {}
            )
            for function in (tool.get("function") or {} for tool in tools)
        }
        guard = Guard(
            request.spelled or request.text,
            cached_language_data(request.language),
            house.names,
            request.about,
            house.platforms,
            switchable(hass),
            follow_up=request.follow_up,
            question=request.question,
            said=request.words,
            by_kind=request.by_kind,
            kinds=house.kinds,
        )
        return cls(request, house, accepts, spoken, guard if spoken else None)

    def resolve(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """A call's arguments as Home Assistant should run them (see resolve_call)."""
        key = tool if tool in self.accepts else _shown(tool, self.accepts)
        about = self.request.about
        arguments = scoped_arguments(tool, arguments, about)
        return resolve_call(
            tool,
            arguments,
            self.house.names,
            accepts=self.accepts.get(key, ()),
            platforms=self.house.platforms.get(key),
            about=about,
            request=self.request.text,
        )

    def refusal(self, tool: str, arguments: Mapping[str, Any]) -> Refusal | None:
        """Why a call is not run (None: it is). A call that cannot act on what the
        request asks is never run (turn/guard.py: a timer for "skip this track", the
        unlock for "lock the door", any action on a question). In the first turn of a
        conversation a call may name by ``name`` only a thing that shares a word with the
        request ("turn off the heating" turned off a bathroom light, and said so). The
        model reads why; where the guard read what the request asks for instead
        (``Refusal.instead``), the turn's next request may call only that (turn/run.py);
        else Assist asks the user to say it another way."""
        if self.guard is not None and (why := self.guard.refused(tool, arguments)):
            return why
        name = arguments.get("name")
        if (
            not self.spoken
            or self.request.follow_up
            or not names_entity(tool)
            or not isinstance(name, str)
            or not unasked(name, self.house.names, self.request.words)
            or self._named_by_kind(name)
        ):
            return None
        return Refusal(f"{NOT_ASKED} {name}: call a tool only on what the request names.")

    def _named_by_kind(self, name: str) -> bool:
        """Whether the request names the thing ``name`` names by its kind ("the vacuum"
        for the house's one vacuum; understand.Request.by_kind)."""
        named = {n.entity_id for n in self.house.names.things.get(normalize(name), ())}
        return bool(named & self.request.by_kind)


def _shown(tool: str, accepts: Mapping[str, Any]) -> str:
    """The tool as the model is shown it, for a call by another of its names."""
    return next((name for name in accepts if bare_name(name) == bare_name(tool)), tool)


def switchable(hass: HomeAssistant) -> dict[str, frozenset[str]]:
    """``turn_on`` and ``turn_off`` -> the domains that have that service (a vacuum
    has neither: HA's on/off intents cannot act on it)."""
    services = hass.services.async_services()
    return {
        service: frozenset(d for d, found in services.items() if service in found)
        for service in ("turn_on", "turn_off")
    }
