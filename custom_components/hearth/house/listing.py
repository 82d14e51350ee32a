"""The house as the pinned prompt lists it: by area and domain, each fact said once.

Home Assistant's static context (the Assist API prompt) lists every exposed entity as a
YAML mapping that repeats its keys and its area's names::

    - names: Kitchen Lights, counter lights
      domain: light
      areas: Kitchen, cookhouse

The listing says the same facts once per area and per domain, in about half the tokens::

    Kitchen (cookhouse):
    - light: Kitchen Lights (counter lights); Pendant
    - switch: Coffee Maker

Every name, alias, domain and area is kept, and nothing about states: the listing is as
stable as HA's own (sorted, deterministic), so it changes only when the house does. It
replaces HA's YAML in the pinned system prompt and in each request's system prompt, so
that a request's lines are the pin's lines (``prompt.volatile_lines``).

A house too big for the model's context is *fitted*: ``fit`` leaves out what a voice
user needs least (read-only sensors before things that act, the last areas first).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Protocol

NO_AREA = "Not in an area"  # the heading of the things without an area


class Listed(Protocol):
    """What the listing reads of an entity (``house_diff.HouseEntity``)."""

    @property
    def names(self) -> str: ...
    @property
    def domain(self) -> str: ...
    @property
    def areas(self) -> str: ...
    @property
    def acts(self) -> bool: ...


def _fold(text: str) -> str:
    return text.casefold()


def _area_key(entity: Listed) -> tuple[bool, str, str]:
    """Areas by name, the things without one last."""
    return (not entity.areas, _fold(entity.areas), entity.areas)


def _heading(areas: str) -> str:
    """``Kitchen, cookhouse`` → ``Kitchen (cookhouse):``; no area → ``NO_AREA:``."""
    if not areas:
        return f"{NO_AREA}:"
    name, _, aliases = areas.partition(", ")
    return f"{name} ({aliases}):" if aliases else f"{name}:"


def _said(entity: Listed) -> str:
    """HA's names of it: ``Lamp, desk light`` → ``Lamp (desk light)``."""
    name, _, aliases = entity.names.partition(", ")
    return f"{name} ({aliases})" if aliases else name


def render_listing(entities: Iterable[Listed]) -> str:
    """The listing of ``entities`` (empty for none), ending with a newline like HA's YAML."""
    lines: list[str] = []
    ordered = sorted(entities, key=lambda e: (*_area_key(e), e.domain, _fold(e.names), e.names))
    for areas, in_area in groupby(ordered, key=lambda e: e.areas):
        lines.append(_heading(areas))
        for domain, things in groupby(in_area, key=lambda e: e.domain):
            lines.append(f"- {domain}: " + "; ".join(_said(thing) for thing in things))
    return "".join(f"{line}\n" for line in lines)


def drop_order(entities: Iterable[Listed]) -> list[Listed]:
    """The entities in the order ``fit`` leaves them out: read-only things (sensors)
    before things that act, and within each, the areas that sort last first (so that
    whole areas go, and a voice user can tell what is left), no area before any."""
    ordered = sorted(entities, key=lambda e: (*_area_key(e), e.domain, _fold(e.names), e.names))
    ordered.reverse()
    return sorted(ordered, key=lambda e: e.acts)  # stable: read-only first


@dataclass(frozen=True, slots=True)
class Fitted[E: Listed]:
    """The entities a listing keeps, and those it leaves out."""

    kept: tuple[E, ...]
    left_out: tuple[E, ...]
    listing: str


def fit[E: Listed](entities: Sequence[E], size: Callable[[str], bool]) -> Fitted[E]:
    """The most entities whose listing ``size`` accepts, leaving out in ``drop_order``.

    ``size(listing)`` says whether a listing fits; it must accept a shorter listing
    whenever it accepts a longer one (a binary search over how many are left out).
    """
    order: list[E] = drop_order(entities)  # type: ignore[assignment]

    def keep(count: int) -> tuple[E, ...]:
        gone = {id(e) for e in order[:count]}
        return tuple(e for e in entities if id(e) not in gone)

    full = render_listing(entities)
    if size(full):
        return Fitted(tuple(entities), (), full)
    low, high = 1, len(order)  # the fewest left out that fits lies in [low, high]
    while low < high:
        middle = (low + high) // 2
        if size(render_listing(keep(middle))):
            high = middle
        else:
            low = middle + 1
    kept = keep(low)
    kept_ids = {id(e) for e in kept}
    left_out = tuple(e for e in entities if id(e) not in kept_ids)
    return Fitted(kept, left_out, render_listing(kept))


def replace_yaml(prompt: str, yaml: str, listing: str) -> str:
    """``prompt`` (HA's API or system prompt) with its static context's YAML ``yaml``
    replaced by ``listing``; where ``yaml`` is not found exactly once, the first block
    of YAML entity mappings (``- names: ...`` and the lines indented under it) is
    replaced, and a prompt without one is returned as it is."""
    if yaml and prompt.count(yaml) == 1:
        return prompt.replace(yaml, listing, 1)
    lines = prompt.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.startswith("- names: ")), None)
    if start is None:
        return prompt
    end = start + 1
    while end < len(lines) and lines[end].startswith(("- ", "  ")):
        end += 1
    return "".join([*lines[:start], listing, *lines[end:]])
