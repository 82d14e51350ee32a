"""Sentences of Home Assistant's intents said of this house, and what HA answers.

``say`` picks a sentence template of an intent (``home-assistant-intents``, in the
agent's language) that names a target the way this house can (a thing by its name, an
area, a floor, or nothing), fills it with the target's name and example numbers, and
reads it back with hassil as Home Assistant's matcher would: that gives the intent's
slots (the tool call's arguments) and HA's response key, whose template (``responses``
in the same data) is what HA would speak. ``recognize`` matches a user's request
against the same templates with the house's names as slot lists.

Deterministic: the same target gives the same bytes (of the first sentences a
template yields, the one with the fewest words and signs, in the template's order), and
no state is read.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hassil import (
    Intents,
    RecognizeResult,
    SlotList,
    TextSlotList,
    WildcardSlotList,
    recognize_all,
    recognize_best,
)
from hassil.errors import MissingListError, MissingRuleError
from hassil.expression import Group, Sentence
from hassil.intents import IntentData
from hassil.sample import sample_expression
from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .intents_data import LanguageData
from .words import unspaced

NAME, AREA, FLOOR = "name", "area", "floor"
TARGET_LISTS = (NAME, AREA, FLOOR)
_SAMPLES = 256  # sentences of one template looked at for the plainest
_CACHED = 4096  # sentences kept per language
_JINJA = ImmutableSandboxedEnvironment(autoescape=False)
_TOKENS = re.compile(r"\w+|[^\w\s]")  # a word, or one sign ("l'": two tokens)


@dataclass(frozen=True, slots=True)
class Target:
    """What a sentence names: ``kind`` ``NAME`` (a thing, ``said`` its name), ``AREA``
    or ``FLOOR`` (``said`` its name; ``domain`` what is asked of it, "light"), or ""
    (nothing: a timer). ``domain`` is the thing's domain."""

    kind: str
    said: str = ""
    domain: str = ""
    entity_id: str = ""


@dataclass(frozen=True, slots=True)
class Said:
    """A sentence of ``intent`` (``text``), its slots as HA reads them (``slots``:
    name, area, domain, brightness...), and HA's response (``speech``; None where the
    data has none or it cannot be rendered without a state)."""

    intent: str
    text: str
    slots: dict[str, Any]
    speech: str | None
    response: str | None = None  # HA's response key ("one_yesno", "lights_area")
    words: dict[str, Any] = field(default_factory=dict)  # the slots as said


def slot_lists(
    names: Iterable[tuple[str, str]] = (), areas: Iterable[str] = (), floors: Iterable[str] = ()
) -> dict[str, TextSlotList]:
    """hassil lists of a house: ``names`` (name, domain) pairs, areas and floors."""
    return {
        NAME: TextSlotList.from_tuples(
            [(n, n, {"domain": d}) for n, d in names if n.strip()], allow_template=False
        ),
        AREA: TextSlotList.from_tuples([(a, a) for a in areas if a.strip()], allow_template=False),
        FLOOR: TextSlotList.from_tuples(
            [(f, f) for f in floors if f.strip()], allow_template=False
        ),
    }


def _domains(value: Any) -> set[str]:
    if isinstance(value, str):
        return {value}
    if isinstance(value, list | tuple | set):
        return {str(v) for v in value}
    return set()


def _fits(block: IntentData, target: Target) -> bool:
    """Whether ``block`` (one group of an intent's templates) can name ``target``."""
    required = block.requires_context or {}
    if set(required) - {"domain"}:
        return False  # asks for the speaking device's area: not a named target
    fixed = _domains(block.slots.get("domain"))
    if target.kind == NAME:
        wanted = _domains(required.get("domain")) or fixed
        return not wanted or target.domain in wanted
    if target.kind in {AREA, FLOOR}:
        return not required and (not fixed or target.domain in fixed)
    return True


def _lists_for(
    data: LanguageData, names: set[str], target: Target, free: Mapping[str, str] | None = None
) -> dict[str, TextSlotList] | None:
    """The lists to sample a sentence that refers to ``names`` (list names) with:
    the target's list, one value per number, and the ``free`` text given for a list of
    free text (list name -> text). None: it needs a list this target cannot fill, free
    text not given, or a list HA fills at run time."""
    wanted = target.kind
    if wanted and wanted not in names:
        return None
    lists: dict[str, TextSlotList] = {}
    for name in names:
        if name in TARGET_LISTS:
            if name != wanted:
                return None
            lists[name] = TextSlotList.from_tuples([(target.said, target.said)], False)
        elif (value := data.range_value(name)) is not None:
            lists[name] = TextSlotList.from_tuples([(str(value), value)], False)
        elif free and name in free:
            lists[name] = TextSlotList.from_tuples([(free[name], free[name])], False)
        elif name not in data.intents.slot_lists:
            return None  # free text (a to-do item) or a list HA fills at run time
    return lists


def _free_lists(
    sentence: Sentence, rules: Mapping[str, Sentence], free: Mapping[str, str]
) -> dict[str, str]:
    """``free`` (slot name -> text) by the names of the lists ``sentence`` fills
    those slots from ("{todo_list_item:item}": todo_list_item)."""
    expression = sentence.expression
    refs = expression.list_references(rules) if isinstance(expression, Group) else ()
    return {ref.list_name: free[ref.slot_name] for ref in refs if ref.slot_name in free}


def _plainest(texts: Iterable[str]) -> str | None:
    """The sentence of the fewest tokens, the first of them in the template's order.

    Not the fewest characters: templates write suffixes as optional parts of a word
    (Polish "wszys[cy|tkie]") and list speech-to-text slips beside a word (French
    "été" for "éteins"); the shortest string picks the bare stem or the slip, where the
    template's order puts the real word first. A token is a word or a sign, so an
    optional elision or unit ("l'", "%", "°") is left out as an optional word is. The
    first form can be an inflection the sentence does not need (French "quel[le][s]"
    says "quelles"): a real word all the same. Written without spaces (Japanese,
    Chinese, Thai), a sentence is one word: there the fewest characters decide.
    """
    found = [" ".join(text.split()) for text in itertools.islice(texts, _SAMPLES)]
    return min(found, key=_plainness) if found else None


def _plainness(text: str) -> tuple[int, int]:
    """Fewer tokens first; characters count only where the script has no spaces."""
    spaced = not any(unspaced(ch) for ch in text)
    return len(_TOKENS.findall(text)), 0 if spaced else len(text)


def say(
    data: LanguageData,
    intent: str,
    target: Target,
    *,
    asked: str | None = None,
    free: Mapping[str, str] | None = None,
    says: frozenset[str] = frozenset(),
) -> Said | None:
    """A sentence of ``intent`` that names ``target``, read back as HA reads it (None:
    the data has none). Of the templates that fit, one that says most of the slots in
    ``says`` comes first (a request's example says what the request says: "start a 10
    minute timer" gets a timer in minutes, not in hours), then one that says the least
    (fewest slots), so a timer is set in minutes, not hours and minutes. ``asked``: a
    question's response key to prefer ("one_yesno"); ``free``: the text to say for a
    slot of free text (slot name -> text: a to-do ``item``; without, no template that
    has one). Kept per language data."""
    key = (intent, target, asked, tuple(sorted((free or {}).items())), says)
    if key not in data.said:
        if len(data.said) > _CACHED:
            data.said.clear()
        data.said[key] = _say(data, intent, target, asked, free or {}, says)
    return data.said[key]


def _say(  # noqa: PLR0917
    data: LanguageData,
    intent: str,
    target: Target,
    asked: str | None,
    free: Mapping[str, str],
    says: frozenset[str],
) -> Said | None:
    found = data.intents.intents.get(intent)
    if found is None:
        return None
    candidates: list[tuple[tuple[bool, int, int, int], Any, dict[str, TextSlotList], Any]] = []
    for order, block in enumerate(found.data):
        if not _fits(block, target):
            continue
        rules = {**data.intents.expansion_rules, **block.expansion_rules}
        for sentence in block.sentences:
            try:
                names = set(sentence.list_names(rules))
                slots = {ref.slot_name for ref in sentence.expression.list_references(rules)}
            except MissingRuleError:
                continue
            given = _free_lists(sentence, rules, free)
            if (names & block.wildcard_list_names) - set(given):
                continue
            if (lists := _lists_for(data, names, target, given)) is not None:
                rank = (
                    asked is not None and block.response != asked,
                    -len(slots & says),
                    len(names),
                    order,
                )
                candidates.append((rank, sentence, {**block.slot_lists, **lists}, rules))
                break  # the block's first sentence that fits
    for _rank, sentence, lists, rules in sorted(candidates, key=lambda c: c[0]):
        try:
            text = _plainest(
                sample_expression(
                    sentence.expression, {**data.intents.slot_lists, **lists}, rules,
                    data.language,
                )
            )  # fmt: skip
        except MissingListError, MissingRuleError:
            continue
        if text and (said := _read_back(data, intent, text, target, lists)) is not None:
            return said
    return None


def _read_back(
    data: LanguageData, intent: str, text: str, target: Target, lists: dict[str, TextSlotList]
) -> Said | None:
    """``text`` as HA's matcher reads it (with the lists it was said with): its slots
    and HA's response."""
    only = dataclasses.replace(data.intents, intents={intent: data.intents.intents[intent]})
    names = [(target.said, target.domain)] if target.kind == NAME else []
    house = slot_lists(
        names,
        [target.said] if target.kind == AREA else [],
        [target.said] if target.kind == FLOOR else [],
    )
    numbers = {k: v for k, v in lists.items() if k not in TARGET_LISTS}
    result = recognize_best(text, only, slot_lists={**house, **numbers}, language=data.language)
    if result is None:
        return None
    slots = {key: _plain(entity.value) for key, entity in result.entities.items()}
    words = {key: entity.text or entity.value for key, entity in result.entities.items()}
    state = (
        {"domain": target.domain, "name": target.said, "entity_id": target.entity_id}
        if target.kind == NAME
        else None
    )
    speech = speak(data, intent, result.response, words, state)
    return Said(intent, text, slots, speech, result.response, words)


def _plain(value: Any) -> Any:
    """A slot's value as a call carries it (40, not 40.0)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def speak(
    data: LanguageData,
    intent: str,
    response: str | None,
    slots: Mapping[str, Any],
    state: Mapping[str, Any] | None,
    *,
    matched: bool = True,
) -> str | None:
    """HA's response ``response`` (a key of ``intent``'s responses) rendered as HA
    renders it, with the sentence's ``slots`` (their words) about ``state`` (a dict:
    domain, name, state...; ``matched``: whether it is what the question asked)."""
    source = data.response(intent, response)
    if not source:
        return None
    states = [state] if state is not None else []
    query = {"matched": states if matched else [], "unmatched": [] if matched else states}
    try:
        text = _JINJA.from_string(source).render(slots=dict(slots), state=state, query=query)
    except TemplateError, TypeError, ValueError, AttributeError:
        return None
    text = " ".join(text.split())
    return text or None


def recognize(
    data: LanguageData,
    text: str,
    lists: Mapping[str, TextSlotList],
    intents: set[str] | None = None,
    *,
    whole: bool = False,
) -> RecognizeResult | None:
    """The best match of ``text`` among ``intents`` (all where None) with a house's
    ``lists`` (names, areas, floors), as HA's matcher would pick it; a template that
    wants the speaking device's area gets one. Failing that (unless ``whole``: only a
    match of every slot), a template match whose name is not one of the house's (the
    user's words for a thing)."""
    chosen = data.intents
    if intents is not None:
        chosen = dataclasses.replace(
            chosen, intents={k: v for k, v in chosen.intents.items() if k in intents}
        )
    here = {AREA: "", "area_id": ""}
    for unmatched in (False,) if whole else (False, True):
        result = recognize_best(
            text,
            chosen,
            slot_lists=dict(lists),
            intent_context=here,
            language=data.language,
            allow_unmatched_entities=unmatched,
            best_slot_name=NAME,
        )
        if result is not None:
            return result
    return None


def matches(
    data: LanguageData,
    text: str,
    intents: frozenset[str],
    names: Iterable[tuple[str, str]] | None = None,
    places: tuple[Iterable[str], Iterable[str]] | None = None,
) -> bool:
    """Whether ``text`` matches a template of one of ``intents`` ("is {name} on"), with
    the house's ``names`` ((name, domain) pairs) or, where None, any words as a name;
    the house's ``places`` (areas, floors), where given, else any words as an area or
    a floor."""
    lists: dict[str, SlotList] = {key: WildcardSlotList(key) for key in TARGET_LISTS}
    if places is not None:
        lists.update({k: v for k, v in slot_lists((), *places).items() if k != NAME})
    if names is not None:
        chosen = _only(data, intents, keep_context=True)
        lists[NAME] = slot_lists(names)[NAME]
    else:
        chosen = _only(data, intents, keep_context=False)
    results = recognize_all(
        text, chosen, slot_lists=lists, intent_context={AREA: "", "area_id": ""},
        language=data.language,
    )  # fmt: skip
    for result in results:
        if all(e.text.strip() for e in result.entities.values() if e.is_wildcard):
            return True
    return False


def _only(data: LanguageData, intents: frozenset[str], *, keep_context: bool) -> Intents:
    """``data``'s templates of ``intents`` only; without ``keep_context``, a name of any
    domain fits (a wildcard name has none). Kept per language data."""
    key = ("only", intents, keep_context)
    if key not in data.said:
        found = {k: v for k, v in data.intents.intents.items() if k in intents}
        if not keep_context:
            found = {
                name: dataclasses.replace(
                    intent,
                    data=[
                        dataclasses.replace(
                            block,
                            requires_context={
                                k: v for k, v in block.requires_context.items() if k != "domain"
                            },
                            excludes_context={},
                        )
                        for block in intent.data
                    ],
                )
                for name, intent in found.items()
            }
        data.said[key] = dataclasses.replace(data.intents, intents=found)
    return data.said[key]
