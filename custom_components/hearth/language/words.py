"""The words Home Assistant's intents say, and which intent a request says most of.

Where no sentence template matches a request ("resume the music on the bedroom
speaker": HA's templates say "resume {name}" or "resume the music in {area}"), the
request's nearest example is of the intent whose templates say most of its words. The
words of an intent are those its templates (``home-assistant-intents``, in the
request's language) can say, less the names and numbers: the words of each text chunk,
and, so that a chunk joined to its neighbour is a word too ("degree[s]"), those of one
walk through the template per choice of its widest alternative. A word counts for
less the more of the language's intents say it: "the" and "is" next to nothing, a word
that one intent alone says ("resume", "degrees") decides.

Pure; the words are kept per language data (they are its immutable templates), and
counted as the language loads, in the executor (language/intents_data.py).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Iterator, Mapping, Set
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol

from hassil.expression import (
    Alternative,
    Expression,
    Group,
    ListReference,
    RuleReference,
    Sentence,
    TextChunk,
)
from hassil.intents import IntentData, Intents


class LanguageData(Protocol):
    """What is read of a language's data (intents_data.LanguageData, which imports
    this module to count the words as it loads)."""

    @property
    def intents(self) -> Intents: ...

    @property
    def said(self) -> dict[Any, Any]: ...


_WORDS = re.compile(r"\w+", re.UNICODE)
_ALIKE_LETTERS = 4  # a word inside another, or an inflection's stem, at least
_ENDING_LETTERS = 2  # the letters an inflection may change at a word's end
_MAX_WALKS = 16  # walks of one template: its widest alternative's choices, at most
_MAX_DEPTH = 12  # expansion rules inside rules
# The most strings one part of a template is spelled out to: a verb's endings, Spanish
# "sub(a|e|ir|í)" ("sube", "subir"), which the walks above pair with one another's.
_MAX_FORMS = 64
# The slots by which a template names what it acts on; the others read a value.
_TARGET_SLOTS = frozenset({"name", "area", "floor", "domain", "device_class"})


def words(text: str) -> set[str]:
    """The words of ``text``, in any script: lower-case ``\\w+`` runs, and for runs of
    a script written without spaces (CJK, Thai...) their character pairs. Numbers are
    not words here: they are a slot's value."""
    found: set[str] = set()
    for word in _WORDS.findall(unicodedata.normalize("NFKC", text).casefold()):
        if word.isdigit():
            continue
        if any(unspaced(ch) for ch in word) and len(word) > 1:
            found |= {word[i : i + 2] for i in range(len(word) - 1)}
        else:
            found.add(word)
    return found


def alike(word: str, other: str) -> bool:
    """Whether two words (of ``words``) say the same: equal, one of four letters or
    more inside the other ("flur" in "flurlicht"), or one inflected as the other: all
    but their last two letters alike, four at least (Polish "roleta" and "roletę",
    Russian "штора" and "штору", "light" and "lights")."""
    if word == other:
        return True
    short, long = sorted((word, other), key=len)
    if len(short) < _ALIKE_LETTERS:
        return False
    return short in long or inflected(word, other)


def inflected(word: str, other: str) -> bool:
    """Whether two words (of ``words``) are one word inflected: equal, or all but the
    shorter's last two letters alike, four at least ("roleta" and "roletę", "lamp" and
    "lamps"; not "room" and "bedroom"). Accents do not count ("ogród", "ogrodzie")."""
    if word == other:
        return True
    short, long = sorted((_plain(word), _plain(other)), key=len)
    if len(short) < _ALIKE_LETTERS:
        return False
    pairs = zip(short, long[: len(short)], strict=True)
    same = next((i for i, (a, b) in enumerate(pairs) if a != b), len(short))
    return same >= max(_ALIKE_LETTERS, len(short) - _ENDING_LETTERS)


def inflection_key(word: str) -> str:
    """What two words that are one word inflected (``inflected``) share: the first
    four letters of each, accents aside (a shorter word: all of it)."""
    return _plain(word)[:_ALIKE_LETTERS]


@lru_cache(maxsize=65536)
def _plain(word: str) -> str:
    """``word`` without its accents (combining marks)."""
    return "".join(c for c in unicodedata.normalize("NFD", word) if not unicodedata.combining(c))


def said_in(word: str, asked: Iterable[str]) -> bool:
    """Whether one of the words ``asked`` says ``word`` (``alike``)."""
    return any(alike(word, other) for other in asked)


def unspaced(ch: str) -> bool:
    """Whether ``ch`` is of a script written without spaces between words."""
    name = unicodedata.name(ch, "")
    return name.startswith(("CJK", "HIRAGANA", "KATAKANA", "THAI", "HANGUL", "LAO", "KHMER"))


def _widest(expression: Expression, rules: Mapping[str, Sentence], depth: int = 0) -> int:
    """The most choices one alternative in ``expression`` has (rules expanded)."""
    if isinstance(expression, RuleReference):
        rule = rules.get(expression.rule_name)
        return _widest(rule.expression, rules, depth + 1) if rule and depth < _MAX_DEPTH else 1
    if not isinstance(expression, Group):
        return 1
    inner = max((_widest(item, rules, depth) for item in expression.items), default=1)
    return max(inner, len(expression.items) if isinstance(expression, Alternative) else 1)


def _walk(expression: Expression, rules: Mapping[str, Sentence], choice: int, depth: int) -> str:
    """One sentence of ``expression``: the ``choice``-th item of every alternative
    (modulo its size); a list (a name, a number) is a gap."""
    if isinstance(expression, TextChunk):
        return expression.text
    if isinstance(expression, ListReference):
        return " "
    if isinstance(expression, RuleReference):
        rule = rules.get(expression.rule_name)
        if rule is None or depth >= _MAX_DEPTH:
            return " "
        return _walk(rule.expression, rules, choice, depth + 1)
    if isinstance(expression, Alternative):
        if not expression.items:
            return ""
        item = expression.items[choice % len(expression.items)]
        return _walk(item, rules, choice, depth)
    if isinstance(expression, Group):
        return "".join(_walk(item, rules, choice, depth) for item in expression.items)
    return " "


def _chunks(expression: Expression, rules: Mapping[str, Sentence], depth: int = 0) -> set[str]:
    """The words of every text chunk in ``expression`` (rules expanded)."""
    if isinstance(expression, TextChunk):
        return words(expression.text)
    if isinstance(expression, RuleReference):
        rule = rules.get(expression.rule_name)
        return _chunks(rule.expression, rules, depth + 1) if rule and depth < _MAX_DEPTH else set()
    if isinstance(expression, Group):
        return set().union(*(_chunks(item, rules, depth) for item in expression.items))
    return set()


def list_slots(
    expression: Expression, rules: Mapping[str, Sentence], depth: int = 0
) -> set[tuple[str, str]]:
    """The (list, slot) pairs ``expression`` reads, rules expanded
    (``{volume_step_down_words:volume_step}``)."""
    if isinstance(expression, ListReference):
        return {(expression.list_name, expression.slot_name)}
    if isinstance(expression, RuleReference):
        rule = rules.get(expression.rule_name)
        return (
            list_slots(rule.expression, rules, depth + 1) if rule and depth < _MAX_DEPTH else set()
        )
    if isinstance(expression, Group):
        return set().union(*(list_slots(item, rules, depth) for item in expression.items))
    return set()


def _ruled_blocks(data: LanguageData, intent: str) -> Iterator[tuple[IntentData, dict[str, Any]]]:
    """Each template block of ``intent`` with the expansion rules its templates read (the
    language's, and the block's own over them)."""
    found = data.intents.intents.get(intent)
    for block in found.data if found else ():
        yield block, {**data.intents.expansion_rules, **block.expansion_rules}


def value_words(data: LanguageData, intent: str, slot: str) -> dict[str, frozenset[str]]:
    """Each word value of ``slot`` that ``intent``'s templates read from a list, with the
    words that say it there (Polish "ścisz", "ciszej": ``volume_step`` down; kept per
    language data)."""
    key = ("value_words", intent, slot)
    if key not in data.said:
        found: dict[str, set[str]] = {}
        intents = data.intents
        for block, rules in _ruled_blocks(data, intent):
            read = set().union(*(list_slots(s.expression, rules) for s in block.sentences))
            for name, _ in {pair for pair in read if pair[1] == slot}:
                for value in getattr(intents.slot_lists.get(name), "values", ()):
                    if isinstance(value.value_out, str):
                        said = _chunks(value.text_in, rules)
                        found.setdefault(value.value_out, set()).update(said)
        data.said[key] = {value: frozenset(said) for value, said in found.items()}
    return data.said[key]


def template_words(
    sentence: Sentence, rules: Mapping[str, Sentence], spelled: dict[int, Any] | None = None
) -> set[str]:
    """Every word that the template ``sentence`` can say, less its lists' values: the
    words of each of its text chunks, those that chunks say together ("degree[s]") in
    one walk per choice of its widest alternative, and those of every part small enough
    to spell out whole ("sub(a|e|ir|í)": "sube" too, not only "suba"). ``spelled``:
    the rules spelled out so far (kept across one language's templates)."""
    found = _chunks(sentence.expression, rules)
    for choice in range(min(_widest(sentence.expression, rules), _MAX_WALKS)):
        found |= words(_walk(sentence.expression, rules, choice, 0))
    _forms(sentence.expression, rules, 0, found, {} if spelled is None else spelled)
    return found


def _forms(
    expression: Expression,
    rules: Mapping[str, Sentence],
    depth: int,
    found: set[str],
    spelled: dict[int, Any],
) -> frozenset[str] | None:
    """Every string ``expression`` can say (a list: a gap), where at most
    ``_MAX_FORMS`` (None: more); the words of each part's forms are added to ``found``.
    A rule is spelled out once (``spelled``: its expression's id -> it, its forms and
    their words)."""
    if isinstance(expression, TextChunk):
        return frozenset({expression.text})
    if isinstance(expression, ListReference):
        return frozenset({" "})
    if isinstance(expression, RuleReference):
        rule = rules.get(expression.rule_name)
        if rule is None or depth >= _MAX_DEPTH:
            return frozenset({" "})
        if (known := spelled.get(id(rule.expression))) is None:
            said: set[str] = set()
            forms = _forms(rule.expression, rules, depth + 1, said, spelled)
            known = spelled[id(rule.expression)] = (rule.expression, forms, frozenset(said))
        found |= known[2]
        return known[1]
    if not isinstance(expression, Group):
        return frozenset({" "})
    parts = [_forms(item, rules, depth, found, spelled) for item in expression.items]
    if isinstance(expression, Alternative):
        union = set().union(*(p for p in parts if p is not None))
        formed = None if None in parts or len(union) > _MAX_FORMS else union
    else:
        formed = {""}
        for part in parts:
            if part is None or len(formed) * len(part) > _MAX_FORMS:
                return None
            formed = {left + right for left in formed for right in part}
    if formed is None:
        return None
    for form in formed:
        found |= words(form)
    return frozenset(formed)


def block_words(data: LanguageData, intent: str) -> list[tuple[IntentData, frozenset[str]]]:
    """Each template block of ``intent`` with the words its templates say (kept per
    language data)."""
    key = ("words", intent)
    if key not in data.said:
        blocks = []
        for block, rules in _ruled_blocks(data, intent):
            said: set[str] = set()
            for sentence in block.sentences:
                said |= template_words(sentence, rules, data.said.setdefault(("spelled",), {}))
            blocks.append((block, frozenset(said)))
        data.said[key] = blocks
    return data.said[key]


@dataclass(frozen=True, slots=True)
class Scored:
    """How much of a request an intent's templates for ``domain`` say (``own``: a
    template of the intent is for that domain alone, not for any thing)."""

    score: float
    intent: str
    domain: str
    own: bool = False
    # A template of it for that domain that says one of the words needs no value
    # beyond what it acts on ("close the curtain": off, not a position).
    plain: bool = False


def block_domains(block: IntentData) -> list[str]:
    """The domains ``block`` is for (none: any)."""
    wanted = (block.requires_context or {}).get("domain") or (block.slots or {}).get("domain")
    if not wanted:
        return []
    return [wanted] if isinstance(wanted, str) else [str(d) for d in wanted]


def _fits_domain(block: IntentData, domain: str | None) -> bool:
    """Whether ``block`` can act on ``domain`` (any block where None)."""
    wanted = block_domains(block)
    return domain is None or not wanted or domain in wanted


def said_by(data: LanguageData) -> dict[str, int]:
    """Word -> how many of the language's intents say it (kept per language data;
    tenths of a second to a second: intents_data computes it as it loads)."""
    key = ("said_by",)
    if key not in data.said:
        counts: dict[str, int] = {}
        for intent in data.intents.intents:
            for word in set().union(*(w for _, w in block_words(data, intent))):
                counts[word] = counts.get(word, 0) + 1
        data.said[key] = counts
    return data.said[key]


# A command's own word is said by at most one in this many of the language's intents.
COMMAND_WORD_SHARE = 4


def says_command(data: LanguageData, said: Iterable[str]) -> bool:
    """Whether one of the words ``said`` is a command's own: said by some of the
    language's intents but by at most a quarter of them ("turn", "lock", "zgaś",
    "włącz"; not "the", "on", "i")."""
    counts = said_by(data)
    most = max(1, len(data.intents.intents) // COMMAND_WORD_SHARE)
    return any(0 < counts.get(word, 0) <= most for word in said)


def said_most(
    data: LanguageData,
    asked: Set[str],
    candidates: Iterable[tuple[str, str | None]],
) -> list[Scored]:
    """The ``candidates`` ((intent, domain) pairs; domain None: any) by how much of the
    request's words ``asked`` (less its names) the intent's templates for the domain
    say, best first. Each word weighs 1 / the number of the language's intents that
    say it: "the" and "is" next to nothing, "resume" and "degrees" much. Those that
    say none are left out."""
    counts = said_by(data)
    scored = []
    for intent, domain in sorted(set(candidates), key=lambda c: (c[0], c[1] or "")):
        blocks = block_words(data, intent)
        fitting = [
            (w, needs)
            for (b, w), needs in zip(blocks, _needs_value(data, intent), strict=True)
            if _fits_domain(b, domain)
        ]
        said = set().union(*(w for w, _ in fitting))
        score = sum(1 / counts[word] for word in said & asked)
        own = any(domain in block_domains(b) for b, _ in blocks)
        plain = any(not needs and w & asked for w, needs in fitting)
        if score > 0:
            scored.append(Scored(round(score, 6), intent, domain or "", own, plain))
    return sorted(scored, key=lambda s: (-s.score, not s.own, not s.plain, s.intent, s.domain))


def _needs_value(data: LanguageData, intent: str) -> list[bool]:
    """Of each template block of ``intent`` (as ``block_words``), whether each of its
    templates reads a value beyond what it acts on (a position, a brightness)."""
    key = ("needs", intent)
    if key not in data.said:
        needs = []
        for block, rules in _ruled_blocks(data, intent):
            needs.append(
                all(
                    any(slot not in _TARGET_SLOTS for _, slot in list_slots(s.expression, rules))
                    for s in block.sentences
                )
            )
        data.said[key] = needs
    return data.said[key]
