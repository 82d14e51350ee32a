"""What a request reads as in Home Assistant's intents data, with the house's names:
which of a pair of opposite intents (``direction``), whether it switches a thing on or
off (``switched_as``), whether a template of some intents matches it whole
(``reads_as``), the words of a kind of intent it says (``says_kind``), and its command
words (``command_words``). The action guard (turn/guard.py) judges calls by them.

Pure; what is counted of a language's data is kept with it (language/words.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..house.kinds import Kinds, state_key
from ..house.names import HouseNames, normalize
from ..language.sentences import recognize, slot_lists
from ..language.words import (
    LanguageData,
    block_domains,
    block_words,
    inflected,
    said_by,
    said_in,
    says_command,
    value_words,
    words,
)

# HA intents and the intent that does the opposite on the same thing (its identifiers).
OPPOSITE: dict[str, str] = {
    "HassTurnOn": "HassTurnOff",
    "HassVacuumStart": "HassVacuumReturnToBase",
    "HassMediaUnpause": "HassMediaPause",
    "HassLawnMowerStartMowing": "HassLawnMowerDock",
}
STARTS = frozenset(OPPOSITE)  # of each pair, the intent that turns its thing on or starts it
OPPOSITE |= {off: on for on, off in OPPOSITE.items()}
ON_OFF = {"HassTurnOn": "turn_on", "HassTurnOff": "turn_off"}
# Where a language's templates of on / off made for a domain do not read a request,
# those made for this one do, the other way round: HA's Spanish, German and Portuguese
# templates lock with the words that close a cover ("cierra con llave", "mach die Tür
# zu", "fecha a fechadura") and unlock with those that open one, so Polish "zamknij
# drzwi na klucz" (no Polish template is made for locks) locks; it does not unlock.
CLOSES_LIKE: dict[str, str] = {"lock": "cover"}
# The state each of on / off leaves a thing of these domains in (HA's on/off handler):
# where no template or word of theirs reads a request, the word of the state it asks
# for does, in HA's name for that state ("odblokuj": a lock's "odblokowano").
LEAVES_IN: dict[str, dict[str, str]] = {
    "lock": {"HassTurnOn": "locked", "HassTurnOff": "unlocked"},
    "cover": {"HassTurnOn": "open", "HassTurnOff": "closed"},
    "valve": {"HassTurnOn": "open", "HassTurnOff": "closed"},
}
# A word says a direction where at most this many of the language's intents say it
# ("unlock": 1, "ferme": 8); "is", "the", German "auf" are said by many more.
FEW_INTENTS = 8
# Intents of one kind (HA's identifiers): a call of one may run where the request reads
# as any of them ("how long is left" before "cancel the timer").
KINDS = ("Timer",)


def kind_of(data: LanguageData, intent: str) -> frozenset[str]:
    """``intent`` and the intents of its kind in ``data`` (all the timer intents)."""
    kind = next((k for k in KINDS if k in intent), None)
    if kind is None:
        return frozenset({intent})
    return frozenset(i for i in data.intents.intents if kind in i)


def kind_words(data: LanguageData, kin: frozenset[str]) -> frozenset[str]:
    """The words that at least half the intents ``kin`` say and no other intent says
    ("timer", "minutes"; not "a", which three timer intents say)."""
    key = ("kind_words", kin)
    if key not in data.said:
        counts: dict[str, int] = {}
        others: set[str] = set()
        for intent in data.intents.intents:
            said = set().union(*(w for _, w in block_words(data, intent)))
            if intent in kin:
                for word in said:
                    counts[word] = counts.get(word, 0) + 1
            else:
                others |= said
        half = (len(kin) + 1) // 2
        data.said[key] = frozenset(w for w, n in counts.items() if n >= half and w not in others)
    return data.said[key]


def says_kind(
    data: LanguageData, text: str, kin: frozenset[str], *, said: frozenset[str] | None = None
) -> bool:
    """Whether ``text`` (its words ``said``, where split) says a word of the intents
    ``kin`` (inflected or not)."""
    own = kind_words(data, kin)
    return any(said_in(word, own) for word in (words(text) if said is None else said))


def kind_asked(data: LanguageData, said: frozenset[str]) -> frozenset[str]:
    """The intents of a kind (``KINDS``) one of whose own words the words ``said`` say
    as written ("timer", "minutes": all the timer intents; empty: none). Not inflected:
    Polish "stopnie" (degrees) is not "stoper" (a stopwatch)."""
    for kind in KINDS:
        kin = frozenset(i for i in data.intents.intents if kind in i)
        if kin and said & kind_words(data, kin):
            return kin
    return frozenset()


def most_said(
    data: LanguageData,
    intents: Iterable[str],
    command: frozenset[str],
    scope: frozenset[str] = frozenset(),
) -> tuple[str, ...]:
    """Of ``intents``, those whose templates for a domain of ``scope`` (or for any
    thing) say the most of the words ``command``, inflected or not ("set a pasta timer
    for 8 minutes": the start of a timer, not its cancel; "reanuda la música": resume,
    not mute); none where none says one."""
    said = {
        i: sum(intent_says(data, i, frozenset({w}), scope, own=False) for w in command)
        for i in intents
    }
    top = max(said.values(), default=0)
    return tuple(sorted(i for i, n in said.items() if n and n == top))


def said_values(
    data: LanguageData,
    text: str,
    names: HouseNames,
    intent: str,
    *,
    slots: Iterable[str],
    said: frozenset[str],
) -> dict[str, str]:
    """Of ``slots`` (word-valued arguments of ``intent``), those ``text`` says a value
    of: what a template of the intent reads in it, else what the lists its
    templates read them from say in its words ``said`` (the house's names left out)."""
    result = recognize(data, text, house_lists(names), {intent})
    read = {
        slot: entity.value
        for slot, entity in (result.entities if result is not None else {}).items()
        if not entity.is_wildcard and isinstance(entity.value, str)
    }
    found = {slot: read.get(slot) or said_value(data, intent, slot, said) for slot in slots}
    return {slot: value for slot, value in found.items() if value}


def said_value(data: LanguageData, intent: str, slot: str, said: frozenset[str]) -> str | None:
    """The one value of ``slot`` whose words (in the lists ``intent``'s templates read
    it from) the words ``said`` say, inflected or not, where they say no other's:
    "ścisz telewizor do 20 procent" says ``volume_step`` down, though no template of
    the relative volume reads it whole."""
    found = {
        value
        for value, worded in value_words(data, intent, slot).items()
        if any(inflected(word, own) for word in worded for own in said)
    }
    return next(iter(found)) if len(found) == 1 else None


def reads_as(data: LanguageData, text: str, intents: Iterable[str], names: HouseNames) -> bool:
    """Whether a template of one of ``intents`` matches ``text`` whole, with the
    house's names, areas and floors as HA's matcher reads them."""
    return read_whole(data, text, intents, names) is not None


def read_whole(
    data: LanguageData, text: str, intents: Iterable[str], names: HouseNames
) -> str | None:
    """The one of ``intents`` a template of which matches ``text`` whole, as in
    ``reads_as`` (None: none does)."""
    wanted = {i for i in intents if i in data.intents.intents}
    if not wanted:
        return None
    result = recognize(data, text, house_lists(names), wanted, whole=True)
    return None if result is None or result.unmatched_entities else result.intent.name


def switched_as(data: LanguageData, text: str, names: HouseNames) -> str | None:
    """``HassTurnOn`` or ``HassTurnOff`` where a template of one matches ``text`` with
    the house's things named as switches are: the words of switching a thing on or off,
    whatever the thing. HA reads "turn on the vacuum" as no intent (a vacuum has no
    ``turn_on``), and Polish has no vacuum template for "włącz odkurzacz", yet either
    asks to start it, never to send it back to its base (as the small model did). The
    thing may be said by its kind ("odkurzacz" for the one vacuum, Roborock), a name the
    templates do not know, where the words around it say a command (words.says_command):
    "send the vacuum home" matches HA's bare ``{name}`` template whole, and reads as
    nothing here."""
    switches = [(name, "switch") for name in names.things]
    lists = slot_lists(switches, names.areas, names.floors)
    result = recognize(data, text, lists, set(ON_OFF))
    if result is None:
        return None
    unmatched = result.unmatched_entities
    if unmatched:
        thing = unmatched.get("name")
        if thing is None or set(unmatched) - {"name", "domain"}:
            return None
        around = normalize(text).replace(normalize(thing.text).strip(), " ")
        if not says_command(data, words(around)):
            return None
    return result.intent.name


def direction(
    data: LanguageData,
    text: str,
    intent: str,
    domain: str | None,
    names: HouseNames,
    *,
    said: frozenset[str] | None = None,
    states: Kinds | None = None,
) -> str | None:
    """Which of ``intent`` and its opposite ``text`` reads as on ``domain`` (a domain of
    None: on anything; the result None: neither, or both): a template of one for that
    domain that matches it whole, else a word only one's templates for that domain say
    (said by few of the language's intents), and none of the other's; for on / off, else
    the same of their templates for any domain. That reads "close the kitchen" as off for
    the kitchen's lamp: no light template says "close", and only the off intent's cover
    templates do. Failing all that, for on / off, the word of the state the request
    asks for (``states``: the kinds' words, house/kinds.py). ``said``: ``text``'s
    words, where split."""
    pair = (intent, OPPOSITE[intent])
    if not all(i in data.intents.intents for i in pair):
        return None
    result = recognize(data, text, house_lists(names, domain), set(pair))
    if result is not None and not result.unmatched_entities:
        return result.intent.name  # the names it read are of ``domain`` only
    asked = frozenset(words(text)) if said is None else said
    for name in names.said_things(text) | (names.mentioned(text) - set(names.things)):
        asked -= words(name)
    counts = said_by(data)
    scopes: list[tuple[str | None, tuple[str, str]]] = [(domain, pair)]
    if intent in ON_OFF and domain is not None:  # else on / off for any, or for its like
        like = CLOSES_LIKE.get(domain)
        scopes.append((like, pair[::-1]) if like is not None else (None, pair))
    for scope, read_as in scopes:
        own = [_domain_words(data, i, scope) for i in read_as]
        says = [
            any(counts.get(w, FEW_INTENTS + 1) <= FEW_INTENTS for w in (mine - theirs) & asked)
            for mine, theirs in (own, own[::-1])
        ]
        if says[0] != says[1]:
            return pair[0] if says[0] else pair[1]
        if any(says):  # both directions said: neither is read
            return None
    return _by_state(pair, domain, asked, states or {})


def _by_state(
    pair: tuple[str, str], domain: str | None, asked: frozenset[str], states: Kinds
) -> str | None:
    """Which of the on / off ``pair`` leaves a thing of ``domain`` in the state whose
    name (``states``: house/kinds.py) the request says a word of, inflected: one only."""
    leaves = LEAVES_IN.get(domain or "", {})
    said = [
        intent
        for intent in pair
        if intent in leaves
        and any(
            inflected(word, own)
            for own in states.get(domain or "", {}).get(state_key(leaves[intent]), ())
            for word in asked
        )
    ]
    return said[0] if len(said) == 1 else None


def command_words(
    data: LanguageData, text: str, names: HouseNames, *, said: frozenset[str] | None = None
) -> frozenset[str]:
    """The words of ``text`` (``said``, where split), less the names of the house it
    says, that few of the language's intents say: "close", "lock", "pause"; not "the",
    "turn" or a name."""
    asked = frozenset(words(text)) if said is None else said
    for name in names.mentioned(text):
        asked -= words(name)
    counts = said_by(data)
    return frozenset(w for w in asked if 0 < counts.get(w, 0) <= FEW_INTENTS)


def intent_says(
    data: LanguageData, intent: str, command: frozenset[str], scope: frozenset[str], *, own: bool
) -> bool:
    """Whether a template of ``intent`` for a domain of ``scope`` says a word of
    ``command``: as written, of one made for that domain (``own``); else inflected too
    ("schließ" for "schließe"), of one for that domain or for any thing."""
    for block, said in block_words(data, intent):
        domains = block_domains(block)
        if (domains and not set(domains) & scope) or (own and not domains):
            continue  # made for other kinds (``own``: or not for a kind at all)
        if said & command or (not own and any(said_in(word, said) for word in command)):
            return True
    return False


def commanded_domains(data: LanguageData, intent: str, command: frozenset[str]) -> frozenset[str]:
    """The domains for which a template of ``intent`` made for that domain says a word
    of ``command`` (the off intent's cover templates say "close", its light ones do
    not)."""
    return frozenset(
        domain
        for block, said in block_words(data, intent)
        if said & command
        for domain in block_domains(block)
    )


def _domain_words(data: LanguageData, intent: str, domain: str | None) -> frozenset[str]:
    """The words of ``intent``'s templates for ``domain`` (those made for it; None: all
    but those made only for a lock, whose on / off says a cover's the other way round:
    German "schließe ab" locks, "schließe" closes)."""
    return frozenset().union(
        *(
            w
            for b, w in block_words(data, intent)
            if (domain in block_domains(b) if domain else not _lock_only(b))
        )
    )


def _lock_only(block: Any) -> bool:
    """Whether a template block is made only for kinds read as another the other way
    round (``CLOSES_LIKE``: locks)."""
    domains = block_domains(block)
    return bool(domains) and all(d in CLOSES_LIKE for d in domains)


def house_lists(names: HouseNames, domain: str | None = None) -> dict[str, Any]:
    """hassil lists of the house's names (of ``domain`` where given), areas, floors."""
    pairs = [
        (name, named.domain)
        for name, found in names.things.items()
        for named in found
        if domain is None or named.domain == domain
    ]
    return slot_lists(pairs, names.areas, names.floors)
