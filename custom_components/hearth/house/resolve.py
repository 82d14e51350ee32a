"""What a call must carry to name exactly one thing: ``resolve_call``.

A shared name gets the ``domain`` (or ``device_class``) of the thing meant, chosen from
what the call and the request say, never a guess between equals, and the area or floor
the request says where things of one kind share it ("Ceiling Fan" in seven rooms). An
area or floor given where a thing of that name was meant (or the other way round) is
moved to the argument HA matches it by. Pure, over house/names.py's ``HouseNames``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..language.words import words
from .names import HouseNames, Named, names_entity, normalize, says

# Domains in the order a shared name most likely means them when nothing else tells:
# the thing a device is (a garage door opener is a cover, a lock a lock) before the
# lights and switches it also exposes.
DOMAIN_ORDER = (
    "lock", "cover", "valve", "climate", "water_heater", "humidifier", "vacuum",
    "lawn_mower", "media_player", "fan", "todo", "alarm_control_panel", "light", "switch",
)  # fmt: skip


def resolve_call(
    tool: str,
    arguments: dict[str, Any],
    names: HouseNames,
    *,
    accepts: Iterable[str],
    platforms: frozenset[str] | None = None,
    commanded: frozenset[str] | None = None,
    about: frozenset[str] | None = None,
    request: str = "",
) -> dict[str, Any]:
    """``arguments`` of a call of ``tool`` (which takes the arguments ``accepts``) with
    what makes them name one thing: a shared ``name`` gets the ``domain`` (or
    ``device_class``) of the thing meant, judged by the call's own ``domain`` and
    ``device_class``, the tool's ``platforms`` (the domains it acts on), the domains its
    intent acts on as the request's command words say (``commanded``: "close" is a
    cover's), the domains the request is ``about``, a domain the ``request`` says by its
    id ("the garage door opener light"), then the device's own entity and
    ``DOMAIN_ORDER``. A ``name`` that is only an area or floor becomes that; an ``area``
    or ``floor`` alone that is only, or also, a thing's name becomes that ``name``."""
    accepts = frozenset(accepts)
    if not names_entity(tool):
        return arguments
    arguments = _moved(arguments, names, accepts)
    name = arguments.get("name")
    if not isinstance(name, str):
        return arguments
    found = names.things.get(normalize(name), ())
    if len(found) < 2:
        return arguments
    kinds = (platforms, commanded, about)
    told = _telling_apart(found, arguments, accepts, kinds, normalize(request))
    return {**arguments, **told, **_placed(found, {**arguments, **told}, names, accepts, request)}


def _placed(
    found: tuple[Named, ...],
    arguments: Mapping[str, Any],
    names: HouseNames,
    accepts: frozenset[str],
    request: str,
) -> dict[str, Any]:
    """The ``area`` (else ``floor``) the ``request`` says, for a call of a name several
    things of its kind share and no place ("the primary bedroom ceiling fan": one of
    the house's seven "Ceiling Fan"s): HA matches the name in that place, where it
    refused the name as shared. Nothing where the request says no place, or several."""
    domains = _as_set(arguments.get("domain"))
    if len([n for n in found if not domains or n.domain in domains]) <= 1:
        return {}
    if arguments.get("area") or arguments.get("floor"):
        return {}
    own = words(str(arguments.get("name", "")))
    said = {place for place in names.mentioned(request) if not words(place) <= own}
    for place, known in (("area", names.areas), ("floor", names.floors)):
        places = sorted(said & known)
        if place in accepts and len(places) == 1:
            return {place: places[0]}
    return {}


def _moved(arguments: dict[str, Any], names: HouseNames, accepts: frozenset[str]) -> dict[str, Any]:
    """A thing's name given as an area or floor (or an area's or floor's given as a
    thing's) moved to the argument HA matches it by."""
    name = arguments.get("name")
    if isinstance(name, str) and normalize(name) not in names.things:
        for place, known in (("area", names.areas), ("floor", names.floors)):
            if normalize(name) in known and place in accepts and place not in arguments:
                rest = {k: v for k, v in arguments.items() if k != "name"}
                return {**rest, place: name}
        return arguments
    if "name" in arguments or "name" not in accepts or "domain" in arguments:
        return arguments
    for place in ("area", "floor"):
        value = arguments.get(place)
        others = {"area", "floor"} - {place}
        if (
            isinstance(value, str)
            and normalize(value) in names.things
            and not others & set(arguments)
        ):
            rest = {k: v for k, v in arguments.items() if k != place}
            return {**rest, "name": value}
    return arguments


def _as_set(value: Any) -> frozenset[str] | None:
    if isinstance(value, str):
        return frozenset({value})
    if isinstance(value, list):
        return frozenset(str(v) for v in value)
    return None


def _telling_apart(
    found: tuple[Named, ...],
    arguments: Mapping[str, Any],
    accepts: frozenset[str],
    kinds: tuple[frozenset[str] | None, ...],
    request: str,
) -> dict[str, Any]:
    """The ``domain`` or ``device_class`` that leaves one of ``found`` (or those of one
    kind), or nothing where nothing tells them apart; ``kinds``: sets of domains that
    narrow them in turn, where they keep some."""
    left = list(found)
    for wanted, of in (
        (_as_set(arguments.get("domain")), lambda n: n.domain),
        (_as_set(arguments.get("device_class")), lambda n: n.device_class),
        *((kind, lambda n: n.domain) for kind in kinds),
    ):
        if wanted and (kept := [n for n in left if of(n) in wanted]):
            left = kept
    if len({n.domain for n in left}) > 1:
        said = [n for n in left if says(request, n.domain.replace("_", " "))]
        left = said or left
    if len({n.domain for n in left}) > 1:
        main = [n for n in left if n.main]
        left = main or left
    if len({n.domain for n in left}) > 1:
        rank = {domain: i for i, domain in enumerate(DOMAIN_ORDER)}
        best = min(rank.get(n.domain, len(rank)) for n in left)
        left = [n for n in left if rank.get(n.domain, len(rank)) == best]
    domains = {n.domain for n in left}
    if len(domains) > 1:
        return {}
    added: dict[str, Any] = {}
    if "domain" in accepts:
        added["domain"] = sorted(domains)
    classes = {n.device_class for n in left}
    same_domain = [n for n in found if n.domain in domains]
    if (
        len(same_domain) > len(left)
        and "device_class" in accepts
        and len(classes) == 1
        and None not in classes
    ):
        added["device_class"] = sorted(classes)  # type: ignore[type-var]
    return added
