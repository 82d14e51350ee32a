"""The only thing of its kind is named by its kind: "start the vacuum" in a house with
one vacuum, called "Roborock".

People name the only thing of a kind by the kind. The name guard (turn/call.py)
refuses a call that names a thing none of whose names the request says; without this,
a house with one vacuum refused every request that called it "the vacuum".

A kind's words are Home Assistant's own names for it in the user's language: the
domain's entity name ("Vacuum", "Staubsauger") and each device class's ("Garage",
"Water", "Speaker"; ``entity_component`` translations), and the words of the states
HA names a thing of that domain in ("Heat", "Cleaning": "turn the heating off" is the
one thermostat; a state word of several of the house's domains names none). A request
also names the kind its matched template acts on (``HassMediaPause`` reads "pause the
music": a player). A kind names a thing only where the house exposes no other thing of
that kind.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from homeassistant.core import HomeAssistant
from homeassistant.helpers import translation

from ..language.sentences import matches
from ..language.words import LanguageData, alike, said_in, words
from .names import HouseNames
from .values import DOMAIN_INTENTS

DOMAIN_KIND = "_"  # the entity_component key of a domain's own name
STATE_KIND = "_state"  # Kinds' key of a domain's one-word state names (any one names it)
Kinds = Mapping[str, Mapping[str, frozenset[str]]]  # domain -> class (or "_") -> words


def state_key(state: str) -> str:
    """Kinds' key of the words of one state of a domain ("_state.locked")."""
    return f"{STATE_KIND}.{state}"


# A state's word names its domain from this many letters ("Heat"; not "Off", "Dry").
_STATE_LETTERS = 4


async def async_kind_words(hass: HomeAssistant, language: str, domains: Iterable[str]) -> Kinds:
    """The words of each domain's and device class's name in ``language``, of the
    domain's one-word states (``STATE_KIND``), and of each of its states
    (``state_key``: "odblokowano" for a lock's ``unlocked`` in Polish)."""
    strings = await translation.async_get_translations(
        hass, language, "entity_component", set(domains)
    )
    found: dict[str, dict[str, frozenset[str]]] = {}
    states: dict[str, set[str]] = {}
    for key, text in strings.items():
        parts = key.split(".")  # component.<domain>.entity_component.<class>.name
        said = frozenset(words(text))
        if len(parts) == 5 and parts[2] == "entity_component" and parts[4] == "name" and said:
            found.setdefault(parts[1], {})[parts[3]] = said
        # component.<domain>.entity_component._.state.<state>
        state = len(parts) == 6 and parts[3] == DOMAIN_KIND and parts[4] == "state"
        if state and said:
            found.setdefault(parts[1], {})[state_key(parts[5])] = said
        if state and len(said) == 1 and len(next(iter(said))) >= _STATE_LETTERS:
            states.setdefault(parts[1], set()).update(said)
    for domain, said in states.items():
        found.setdefault(domain, {})[STATE_KIND] = frozenset(said)
    return found


def named_by_kind(
    names: HouseNames,
    text: str,
    kinds: Kinds,
    data: LanguageData | None,
    *,
    said: frozenset[str] | None = None,
) -> frozenset[str]:
    """The entities that ``text`` names by their kind: each the only exposed thing of a
    kind (a domain, or a device class of it) whose name the request says, or of a
    domain one of whose intents' templates the request matches (``data``: HA's
    intents in the request's language). ``said``: the request's words, where the turn
    has split it (turn/understand.py)."""
    by_kind: dict[tuple[str, str], set[str]] = {}
    for found in names.things.values():
        for named in found:
            by_kind.setdefault((named.domain, DOMAIN_KIND), set()).add(named.entity_id)
            if named.device_class:
                by_kind.setdefault((named.domain, named.device_class), set()).add(named.entity_id)
    said = frozenset(words(text)) if said is None else said
    states = _own_states(kinds, set(by_kind))
    chosen: set[str] = set()
    for (domain, kind), entities in by_kind.items():
        if len(entities) != 1 or entities <= chosen:
            continue
        name = kinds.get(domain, {}).get(kind)
        if (name and all(said_in(word, said) for word in name)) or (
            kind == DOMAIN_KIND
            and (
                any(said_in(word, said) for word in states.get(domain, ()))
                or _reads_as(data, text, domain, names)
            )
        ):
            chosen |= entities
    return frozenset(chosen)


def _own_states(kinds: Kinds, present: set[tuple[str, str]]) -> dict[str, frozenset[str]]:
    """Each of the house's domains' state words that none of its other kinds (the
    ``present`` domains and device classes) says, in a state or a name ("Heat": a
    thermostat's, where no binary sensor is of class heat; "Open": a cover's, a lock's
    and a valve's, none's; a weather's "Lightning" is a light's "Light")."""
    domains = {domain for domain, _ in present}
    said: dict[str, list[str]] = {domain: [] for domain in domains}
    for domain, kind in present:
        said[domain] += [*kinds.get(domain, {}).get(kind, ())]
    for domain in domains:
        said[domain] += [*kinds.get(domain, {}).get(STATE_KIND, ())]
    return {
        domain: frozenset(
            word
            for word in kinds.get(domain, {}).get(STATE_KIND, ())
            if not any(alike(word, w) for other in domains - {domain} for w in said[other])
        )
        for domain in domains
    }


def _reads_as(data: LanguageData | None, text: str, domain: str, names: HouseNames) -> bool:
    """Whether a template of an intent made for ``domain`` alone reads ``text``
    ("pause the music": ``HassMediaPause``, a player's)."""
    intents = frozenset(i for i, acts_on in DOMAIN_INTENTS.items() if acts_on == domain)
    if data is None or not intents:
        return False
    pairs = [(key, named.domain) for key, found in names.things.items() for named in found]
    return matches(data, text, intents, pairs)
