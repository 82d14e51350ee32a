"""What the house calls its things, areas and floors, and what a call must carry to
name exactly one of them.

Home Assistant matches a call's ``name`` against every exposed entity's name and
aliases; where two of them share it (a garage door opener exposed as a cover and as a
light, a lock whose device gives its name to two entities), the intent fails with
"Multiple entities share the name" unless the call also carries what tells them apart:
a ``domain`` or a ``device_class`` (HA's ``async_match_targets``). The engine's grammar
narrows each argument to the house's values on its own (house/values.py); it cannot
make ``domain`` depend on ``name``. So ``resolve_call`` adds what resolves a shared
name to the call before Home Assistant runs it, chosen from what the call and the
request say, never a guess between equals. An area or floor given where a thing of that
name was meant (or the other way round) is moved to the argument HA matches it by.

``unasked`` tells a call that names a thing none of whose names the request says a
word of (turn/call.py does not run it in a conversation's first turn); ``worded`` lists
the names such a call may use (turn/decide.py narrows the grammar's names to them). Both
take the request's words, split once per turn (turn/understand.py).

Pure: ``HouseNames`` is built by values.house_names from the registries.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ..language.words import inflected, inflection_key, said_in, unspaced, words
from ..tool_names import bare_name

# Domains in the order a shared name most likely means them when nothing else tells:
# the thing a device is (a garage door opener is a cover, a lock a lock) before the
# lights and switches it also exposes.
DOMAIN_ORDER = (
    "lock", "cover", "valve", "climate", "water_heater", "humidifier", "vacuum",
    "lawn_mower", "media_player", "fan", "todo", "alarm_control_panel", "light", "switch",
)  # fmt: skip
# Intent tools that name no entity by ``name`` (a timer's name is free text).
FREE_NAME = ("Timer", "Broadcast")


def names_entity(tool: str) -> bool:
    """Whether ``tool`` is an intent whose ``name`` is an exposed entity's (not a
    timer's or a broadcast's free text)."""
    short = bare_name(tool)
    return short.startswith("Hass") and not any(word in short for word in FREE_NAME)


def normalize(name: str) -> str:
    """A name as Home Assistant compares it (``intent._normalize_name``)."""
    return name.strip().casefold()


@dataclass(frozen=True, slots=True)
class Named:
    """An exposed entity that a name or alias names."""

    entity_id: str
    device_class: str | None = None
    main: bool = False  # the device's own entity: it has the device's name

    @property
    def domain(self) -> str:
        return self.entity_id.split(".", 1)[0]


@dataclass(frozen=True, slots=True)
class HouseNames:
    """Normalized entity names and aliases -> the exposed entities they name; the
    normalized names and aliases of areas and floors."""

    things: Mapping[str, tuple[Named, ...]] = field(default_factory=dict)
    areas: frozenset[str] = frozenset()
    floors: frozenset[str] = frozenset()
    # Each name by the inflection key (words.inflection_key) of its first word: what a
    # request must say for the name to be said in it inflected.
    keyed: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        things: Iterable[tuple[Iterable[str], Named]],
        areas: Iterable[str] = (),
        floors: Iterable[str] = (),
    ) -> HouseNames:
        """From (names and aliases, entity) pairs and area and floor names."""
        by_name: dict[str, dict[str, Named]] = {}
        for names, named in things:
            for name in names:
                if key := normalize(name):
                    by_name.setdefault(key, {})[named.entity_id] = named
        areas = frozenset(normalize(a) for a in areas if normalize(a))
        floors = frozenset(normalize(f) for f in floors if normalize(f))
        keyed: dict[str, set[str]] = {}
        for name in (*by_name, *areas, *floors):
            if parts := _parts(name):
                keyed.setdefault(inflection_key(parts[0]), set()).add(name)
        return cls(
            {key: tuple(found.values()) for key, found in by_name.items()},
            areas,
            floors,
            {key: frozenset(found) for key, found in keyed.items()},
        )

    def house_slots(self, slots: Mapping[str, str]) -> dict[str, str]:
        """``slots`` (what a template read of a target) without a device class that no
        exposed thing of the slots' domain has. HA's English templates read "the garage
        door" as area Garage with class ``door`` too, and Home Assistant refuses a call
        for class ``door`` on a cover whose class is ``garage``: left out, the call's
        class is the model's, from the house's own."""
        wanted, domain = slots.get("device_class"), slots.get("domain")
        if not wanted:
            return dict(slots)
        has = any(
            named.device_class == wanted and (not domain or named.domain == domain)
            for found in self.things.values()
            for named in found
        )
        return dict(slots) if has else {k: v for k, v in slots.items() if k != "device_class"}

    def shared(self) -> dict[str, tuple[Named, ...]]:
        """The names that name more than one entity."""
        return {key: found for key, found in self.things.items() if len(found) > 1}

    def domains_of(self, names: Iterable[str]) -> frozenset[str]:
        """The domains of the things that ``names`` (normalized) name."""
        return frozenset(n.domain for name in names for n in self.things.get(name, ()))

    def said_things(self, text: str) -> frozenset[str]:
        """The names and aliases (normalized) of things that ``text`` says; the longest
        wins where one holds another ("kitchen ceiling light", not "kitchen")."""
        said = [name for name in self.mentioned(text) if name in self.things]
        return frozenset(n for n in said if not any(n != o and n in o for o in said))

    def named_domains(self, text: str) -> frozenset[str]:
        """The domains of the things whose name or alias ``text`` says."""
        return frozenset(named.domain for n in self.said_things(text) for named in self.things[n])

    def mentioned(self, text: str) -> set[str]:
        """The names of things, areas and floors that ``text`` says: as they are
        written, or with their words inflected (``said_inflected``) where no name
        said as written takes those words ("zapal lampę stojącą" says "Lampa stojąca",
        "the kitchen lights" a "Kitchen Light"; where the house has both a "Kitchen
        Light" and "Kitchen Lights", "the kitchen light" says only the first)."""
        said = normalize(text)
        exact, inflected = self._said(said)
        return exact | set(inflected)

    def spelled(self, text: str) -> str:
        """``text`` (normalized) with each name it says inflected written as the house
        writes it ("włącz lampa stojąca" for "Włącz lampę stojącą"): Home Assistant's
        sentence templates read a name only as written."""
        said = normalize(text)
        _, inflected = self._said(said)
        for name, (start, end) in sorted(inflected.items(), key=lambda i: -i[1][0]):
            said = f"{said[:start]}{name}{said[end:]}"
        return said

    def _said(self, said: str) -> tuple[set[str], dict[str, tuple[int, int]]]:
        """The names normalized ``said`` says as written, and those it says inflected
        (where, in ``said``)."""
        names = (*self.things, *self.areas, *self.floors)
        spans = {name: list(said_at(said, name)) for name in names if name in said}
        taken = [(at, at + len(name)) for name, found in spans.items() for at in found]
        exact = {name for name, found in spans.items() if found}
        keys = {inflection_key(word) for word in _TOKEN.findall(said)}
        maybe = set().union(*(self.keyed.get(key, ()) for key in keys))
        return exact, said_inflected(said, maybe - exact, taken)


def names_of(names: HouseNames, entities: Iterable[str]) -> frozenset[str]:
    """Every name and alias (normalized) of the ``entities`` (ids)."""
    wanted = frozenset(entities)
    return frozenset(
        name for name, found in names.things.items() if any(n.entity_id in wanted for n in found)
    )


def unasked(name: str, names: HouseNames, said: Iterable[str]) -> bool:
    """Whether ``name`` names things of the house none of whose names and aliases
    shares a word with the request, whose words are ``said`` (a word, one of four
    letters or more inside another: "Flur" in "Flurlicht", or the word inflected:
    "roletę" for "Roleta"). A name the house does not have is not judged here: Home
    Assistant refuses it."""
    key = normalize(name)
    return key in names.things and key not in worded(names, said)


def worded(names: HouseNames, said: Iterable[str]) -> frozenset[str]:
    """The names and aliases (normalized) of the things one of whose names or aliases
    shares a word with the request, whose words are ``said`` (language/words.py; see
    ``unasked``)."""
    by_entity: dict[str, list[str]] = {}
    for name, found in names.things.items():
        for named in found:
            by_entity.setdefault(named.entity_id, []).append(name)
    kept = (own for own in by_entity.values() if _says_a_word_of(said, own))
    return frozenset(name for own in kept for name in own)


def _says_a_word_of(said: Iterable[str], names: Iterable[str]) -> bool:
    theirs = set().union(*(words(name) for name in names))
    return any(said_in(word, theirs) for word in said)


def says(text: str, name: str) -> bool:
    """Whether normalized ``text`` says ``name``: as whole words where the name starts
    or ends with a letter of a spaced script (``tv`` is not in "activate"), anywhere
    in unspaced scripts (キッチン in キッチンの電気をつけて)."""
    return next(said_at(text, name), None) is not None


def said_at(text: str, name: str) -> Iterator[int]:
    """Where normalized ``text`` says ``name`` as ``says`` reads it."""
    start = 0
    while (at := text.find(name, start)) >= 0:
        before = text[at - 1] if at else " "
        after = text[at + len(name)] if at + len(name) < len(text) else " "
        if not (_joins(before, name[0]) or _joins(name[-1], after)):
            yield at
        start = at + 1


def said_inflected(
    text: str, names: Iterable[str], taken: Iterable[tuple[int, int]]
) -> dict[str, tuple[int, int]]:
    """The ``names`` (normalized) that normalized ``text`` says with their words
    inflected, and where: each word of the name, in order and side by side, one of the
    text's inflected (words.inflected: "bramę garażową" for "brama garażowa", "w kuchni" for
    "Kuchnia"), where no name said as written (``taken``: their spans; ``_crosses``),
    nor one of more words said inflected, takes those words. Names in a script without
    spaces are said as written or not at all."""
    tokens = [(m.group(), m.start(), m.end()) for m in _TOKEN.finditer(text)]
    taken = list(taken)
    found: dict[str, tuple[int, int]] = {}
    keys = {inflection_key(word) for word, _, _ in tokens}
    # Only names all of whose words share a key with one of the text's can be said
    # (a thousand names: tenths of a millisecond, not a tenth of a second).
    spelled = {
        name: parts
        for name in names
        if (parts := _parts(name)) and all(inflection_key(p) in keys for p in parts)
    }
    # Names of more words first: "lampkę nocną" is "Lampka nocna", and "lampkę" is then
    # not also "Lampa" inflected.
    for name, parts in sorted(spelled.items(), key=lambda item: (-len(item[1]), item[0])):
        for i in range(len(tokens) - len(parts) + 1):
            window = tokens[i : i + len(parts)]
            start, end = window[0][1], window[-1][2]
            alike = all(inflected(p, w) for p, (w, _, _) in zip(parts, window, strict=True))
            if alike and not any(_crosses((at, to), (start, end)) for at, to in taken):
                found[name] = (start, end)
                taken.append((start, end))
                break
    return found


@lru_cache(maxsize=65536)
def _parts(name: str) -> tuple[str, ...]:
    """The words of a normalized name (none for a name in a script without spaces)."""
    return () if any(map(unspaced, name)) else tuple(_TOKEN.findall(name))


def _crosses(said: tuple[int, int], window: tuple[int, int]) -> bool:
    """Whether a name said as written at ``said`` takes words of ``window``, other than
    as a part of it ("the office windows" holds the area "office"; "the kitchen light"
    is "Kitchen Light", not "Kitchen Lights" inflected)."""
    (at, to), (start, end) = said, window
    inside = start <= at and to <= end and (at, to) != (start, end)
    return at < end and start < to and not inside


_SPACED = re.compile(r"[0-9a-zß-ɏͰ-ӿ]")
_TOKEN = re.compile(r"\w+")  # Latin, Greek, Cyrillic (casefolded)


def _joins(left: str, right: str) -> bool:
    """Whether two letters side by side are one word in a spaced script."""
    return bool(_SPACED.match(left) and _SPACED.match(right))


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
    name = normalize(str(arguments.get("name", "")))
    said = {place for place in names.mentioned(request) if place not in name}  # not its own
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
