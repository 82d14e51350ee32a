"""The guard's rules on where a call acts (turn/guard.py): the things, areas and
floors of the house that the request names, against those the call names.

- **A call that names nothing of what the request names** (or names by its kind: "the
  TV") does not run: HA would pick (the one thermostat for "close the garage"; "set
  the TV volume" set every player's). Its retry must name them.
- **A call by a place the request does not say**: where the request names things,
  areas or floors of the house, a call by an area or floor none of whose words the
  request says (inflected or not) does not run: asked to lock the front door, the
  small model switched on the lights of the office.
- **A call by a name that says another place**: where the request says an area or
  floor, a call by a name that says a word of another place of the house, a word the
  request does not say, does not run ("the speaker in the kitchen" is not the
  "Bedroom Speaker"); its retry must give the place.

Pure, over what ``Guard`` read of the turn.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from ..house.names import HouseNames
from ..language.words import said_in, words
from .reading import ON_OFF
from .refusal import NOT_FOR_REQUEST, TARGETS, Refusal


class Guard(Protocol):
    """What these rules read of the turn (turn/guard.Guard)."""

    @property
    def text(self) -> str: ...
    @property
    def names(self) -> HouseNames: ...
    @property
    def follow_up(self) -> bool: ...
    @property
    def by_kind(self) -> frozenset[str]: ...
    @property
    def asked(self) -> frozenset[str]: ...
    def platforms_of(self, intent: str) -> frozenset[str]: ...


def untargeted(guard: Guard, intent: str, arguments: Mapping[str, Any]) -> Refusal | None:
    """A call of an intent that acts on things of the house, naming no thing, area,
    floor or kind, where the request names some."""
    if guard.follow_up or not _acts_on_things(guard, intent):
        return None
    if any(arguments.get(key) for key in TARGETS):
        return None
    mentioned = guard.names.mentioned(guard.text)
    named = sorted(mentioned) or sorted(guard.by_kind)
    if not named:
        return None
    place = "area" if guard.names.areas & set(named) else "floor"
    arg = "name" if guard.names.said_things(guard.text) or not mentioned else place
    why = f"{NOT_FOR_REQUEST}: the request names {', '.join(named)}; the call names none."
    return Refusal(why, (intent,), required=(f"{intent}.{arg}",))


def unsaid_place(guard: Guard, intent: str, arguments: Mapping[str, Any]) -> Refusal | None:
    """A call by an area or floor the request does not say, where it names some of the
    house; or by a name that says another place than the one the request says."""
    if guard.follow_up or not _acts_on_things(guard, intent):
        return None
    named = sorted(guard.names.mentioned(guard.text))
    if not named:
        return None
    places = [arguments.get(key) for key in ("area", "floor")]
    unsaid = [
        place
        for place in places
        if isinstance(place, str) and place.strip() and not _said(guard, words(place))
    ]
    if unsaid:
        why = f"the request names {', '.join(named)}; not {', '.join(unsaid)}"
        return Refusal(f"{NOT_FOR_REQUEST}: {why}.")
    return _other_place(guard, intent, arguments, named)


def _other_place(
    guard: Guard, intent: str, arguments: Mapping[str, Any], named: list[str]
) -> Refusal | None:
    """A call by a name that says a word of a place of the house the request does not
    say, where the request says another place and the call gives none."""
    name = arguments.get("name")
    if not isinstance(name, str) or any(arguments.get(key) for key in ("area", "floor")):
        return None
    for kind, places in (("area", guard.names.areas), ("floor", guard.names.floors)):
        said = [place for place in named if place in places]
        others = [
            place
            for place in places - set(named)
            if (shared := words(place) & words(name)) and not _said(guard, shared)
        ]
        if said and others:
            why = f"the request names {', '.join(said)}; {name} is of {', '.join(sorted(others))}"
            return Refusal(f"{NOT_FOR_REQUEST}: {why}.", (intent,), required=(f"{intent}.{kind}",))
    return None


def _said(guard: Guard, place_words: frozenset[str] | set[str]) -> bool:
    """Whether the request says one of a place's words (inflected or not)."""
    return any(said_in(word, guard.asked) for word in place_words)


def _acts_on_things(guard: Guard, intent: str) -> bool:
    return intent in ON_OFF or bool(guard.platforms_of(intent))
