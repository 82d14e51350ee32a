"""What the house calls its things, areas and floors, and what a call must carry to
name exactly one of them.

Home Assistant matches a call's ``name`` against every exposed entity's name and
aliases; where two of them share it (a garage door opener exposed as a cover and as a
light, a lock whose device gives its name to two entities), the intent fails with
"Multiple entities share the name" unless the call also carries what tells them apart:
a ``domain`` or a ``device_class`` (HA's ``async_match_targets``). The engine's grammar
narrows each argument to the house's values on its own (house/values.py); it cannot
make ``domain`` depend on ``name``. So house/resolve.py adds what resolves a shared
name to the call before Home Assistant runs it.

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

from ..language.words import inflected, inflection_key, said_in, unspaced, words
from ..tool_names import bare_name

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
