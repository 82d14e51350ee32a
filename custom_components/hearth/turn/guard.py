"""Whether a tool call can act on what the request asks: a wrong action is worse than
none.

A small model picks wrong tools that Home Assistant then runs: it cancelled every timer
when asked to skip a track, and unlocked a door it was asked to lock. ``refusal`` tells
such a call before it runs (call.Calls.refusal); the model reads why and may call again
within the turn's bound, else Assist asks the user to say it another way. Every rule is
decided from Home Assistant's own data in the request's language, never word lists:

- **A call that names no thing** (a timer, a broadcast) runs only where the request
  reads as one of its intents: one of those intents' templates matches it whole, or it
  says a word that the intents of that kind say (most of them) and no other intent says
  ("timer", "minutes"; German "Minuten"). "Skip this track" says none.
- **A call of another kind than a timer** where the request says the timers' own
  words does not run either ("set a pasta timer for 8 minutes" is no position).
- **Where it acts** (turn/places.py): a call that names nothing of what the request
  names, or by a place it does not say, or by a name that says another place.
- **A call of an intent for some domains** (``HassMediaPause``: media players), or an
  on/off call on things of some domains (its name's, or its ``domain``), does not run on
  a request about other domains only (the curtains; asked to lock the front door, the
  small model switched on the office's lights).
- **On/off on a domain HA cannot switch**: ``HassTurnOn``/``HassTurnOff`` act on covers,
  locks, valves and buttons by their own services, else by the domain's
  ``turn_on``/``turn_off`` service; where the house has none (a vacuum), the call
  cannot act, and the tools made for that domain are named instead.
- **A word-valued argument** other than what a template of the call's intent reads in
  the request, or else the lists it reads it from ("ścisz": ``volume_step`` down), does
  not run; the retry may take only that value.
- **Direction**: where the request reads as the opposite intent of the call on that
  kind of thing (lock / unlock, open / close, on / off, start / return to base, pause /
  resume), the call is not run. The request reads as an intent where one of its
  templates for that domain matches it whole with the house's names; failing that,
  where it says a word that only that intent's templates for that domain say (and few
  intents of the language say at all), and none of the other's; for on / off, failing
  that, the same of their templates for any domain (also for a call by an area alone),
  or, for a lock, of the cover's the other way round ("close" locks).
  Nor does a call of a pair run against the on / off the request reads as, its things
  named as switches are ("turn on the vacuum": not back to its base).
- **An intent that says none of the request's command words**: where the request says
  words few intents say ("close", "pause"; its names aside), and a template of some
  intent made for a kind of thing the call or the request is about says one, a call
  none of whose intent's templates for the things it acts on says one is not run (of
  the pairs above, on / off only): "close the garage" is not ``HassLightSet`` on the
  light of that name, nor ``HassTurnOff`` on that light alone.

Pure: ``Guard`` holds what the turn read of the request and the house; what the request
reads as in HA's data (a direction, its command words) is turn/reading.py's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..house.kinds import Kinds
from ..house.names import HouseNames, normalize
from ..language.questions import QUESTION_INTENTS
from ..language.words import LanguageData, words
from ..tool_names import bare_name
from .places import unsaid_place, untargeted
from .reading import (
    ON_OFF,
    OPPOSITE,
    STARTS,
    command_words,
    commanded_domains,
    direction,
    intent_says,
    kind_asked,
    kind_of,
    most_said,
    read_whole,
    reads_as,
    said_values,
    says_kind,
    switched_as,
)
from .refusal import NOT_FOR_REQUEST, TARGETS, Refusal

# Domains HA's on/off handler switches by their own services (intent/__init__.py).
OWN_ON_OFF = frozenset({"cover", "lock", "valve", "button", "input_button"})


def _asks_for(other: str, intent: str) -> Refusal:
    return Refusal(f"{NOT_FOR_REQUEST}: the request asks for {other}, not {intent}.", (other,))


@dataclass(frozen=True, slots=True)
class Guard:
    """What the guard reads of one turn: the request's ``text``, the ``data`` of its
    language (None: not covered), the house's ``names``, the domains the request is
    ``about`` (None: not known), each offered tool's ``platforms`` (tool -> the domains
    it acts on), and ``switchable``: the domains that have ``turn_on``/``turn_off``."""

    text: str
    data: LanguageData | None
    names: HouseNames
    about: frozenset[str] | None = None
    platforms: Mapping[str, frozenset[str]] = field(default_factory=dict)
    switchable: Mapping[str, frozenset[str]] = field(default_factory=dict)
    follow_up: bool = False  # "cancel it": what it is is in the history, not the text
    question: bool = False  # the request asks (questions.is_question): it is read, not acted on
    said: frozenset[str] | None = None  # the request's words (None: split here)
    by_kind: frozenset[str] = frozenset()  # the things it names by kind (house/kinds.py)
    kinds: Kinds = field(default_factory=dict)  # HA's words for the kinds and their states

    @property
    def asked(self) -> frozenset[str]:
        """The request's words (language/words.py), as the turn split them."""
        return frozenset(words(self.text)) if self.said is None else self.said

    def refusal(self, tool: str, arguments: Mapping[str, Any]) -> str | None:
        """Why a call of ``tool`` with ``arguments`` cannot act on what the request
        asks (None: it may run)."""
        found = self.refused(tool, arguments)
        return found.why if found is not None else None

    def refused(self, tool: str, arguments: Mapping[str, Any]) -> Refusal | None:
        """``refusal``, with the intents the request reads as instead, where the call
        does another thing than they (its direction's opposite, or an intent that says
        none of the request's command words): a retry may call one of them."""
        intent = bare_name(tool)
        if not intent.startswith("Hass") or intent in QUESTION_INTENTS:
            return None  # reading never acts; a script's tool is its author's
        if self.question:
            return Refusal(
                f"{NOT_FOR_REQUEST}: the request asks a question; read the house, do not act."
            )
        targets = self.target_domains(arguments)
        found = (
            self._unnamed(intent, targets)
            or self._other_kind(intent)
            or untargeted(self, intent, arguments)
            or unsaid_place(self, intent, arguments)
            or self._other_domain(tool, intent, targets)
            or self._cannot_switch(intent, targets)
            or self._unsaid_command(intent, targets, arguments)
            or self._opposite(intent, targets)
            or self._contrary(intent, arguments)
        )
        return Refusal(found) if isinstance(found, str) else found

    def commanded(self, tool: str) -> frozenset[str]:
        """The kinds of thing (domains) a call of ``tool`` acts on as the request's
        command words say: those for which a template of its intent made for them says
        one ("close the garage": the cover of the name the garage door's light shares)."""
        intent = bare_name(tool)
        if self.data is None or intent not in self.data.intents.intents:
            return frozenset()
        command = self._command_words()
        return commanded_domains(self.data, intent, command) if command else frozenset()

    def target_domains(self, arguments: Mapping[str, Any]) -> frozenset[str]:
        """The domains a call acts on: those of the things its ``name`` names (of its
        ``domain``, where that keeps some: HA narrows a shared name so), else its
        ``domain``; empty where it names neither (an area's things, a timer)."""
        name = arguments.get("name")
        found = self.names.things.get(normalize(name)) if isinstance(name, str) else None
        domain = arguments.get("domain")
        listed = frozenset(str(d) for d in ([domain] if isinstance(domain, str) else domain or ()))
        if found:
            named = frozenset(thing.domain for thing in found)
            return named & listed or named
        return listed - {""}

    def _unnamed(self, intent: str, targets: frozenset[str]) -> Refusal | None:
        """A call of an intent that names no thing of the house (a timer, a broadcast),
        where the request does not read as one of that kind. Those whose templates made
        for what it is about (else the house's kinds) say most of its command words are
        what it reads as instead ("zakręć wodę": the off intent's valve templates)."""
        if targets or self.follow_up or self.data is None:
            return None
        if intent not in self.data.intents.intents:
            return None
        if intent in ON_OFF or intent in _DOMAIN_FREE_EXEMPT or self.platforms_of(intent):
            return None
        kin = kind_of(self.data, intent)
        if reads_as(self.data, self.text, kin, self.names) or says_kind(
            self.data, self.text, kin, said=self.asked
        ):
            return None
        why = f"{NOT_FOR_REQUEST}: the request asks nothing {intent} does."
        scope = self.about or frozenset(n.domain for f in self.names.things.values() for n in f)
        return Refusal(why, most_said(self.data, self._saying(scope), self._command_words(), scope))

    def _other_kind(self, intent: str) -> Refusal | None:
        """A call of another intent than a kind's (the timers) where the request says
        that kind's own words, its names left out: "set a pasta timer for 8 minutes" is
        no light's position. A retry is narrowed only to the kind's intent a template of
        which reads the request whole (HA reads "turn off the light in 5 minutes" as a
        timer that runs the command when it ends); else the refusal names those that say
        most of its command words, and the model may call any."""
        if self.data is None or self.follow_up:
            return None
        kin = kind_asked(self.data, self._unnamed_words()) - QUESTION_INTENTS
        if not kin or intent in kin:
            return None
        if read := read_whole(self.data, self.text, kin, self.names):
            return _asks_for(read, intent)
        said = " or ".join(most_said(self.data, kin, self._command_words())) or "a timer"
        return Refusal(f"{NOT_FOR_REQUEST}: the request asks for {said}, not {intent}.")

    def _other_domain(self, tool: str, intent: str, targets: frozenset[str]) -> str | None:
        """An intent for some domains, or an on/off call on things of some domains,
        called on a request about others only."""
        acts = self.platforms.get(tool) or self.platforms_of(intent)
        acts = acts or (targets if intent in ON_OFF else frozenset())
        if not acts or not self.about:
            return None
        asked = self.about | self.names.named_domains(self.text)
        if acts & asked:
            return None
        return (
            f"{NOT_FOR_REQUEST}: {intent} acts on {', '.join(sorted(acts))}; the request is "
            f"about {', '.join(sorted(asked))}."
        )

    def _cannot_switch(self, intent: str, targets: frozenset[str]) -> str | None:
        """On/off on things of a domain that has no such service (a vacuum)."""
        service = ON_OFF.get(intent)
        if service is None or not targets or not self.switchable:
            return None
        stuck = sorted(
            d
            for d in targets
            if d not in OWN_ON_OFF and d not in self.switchable.get(service, frozenset())
        )
        if not stuck or len(stuck) < len(targets):
            return None
        instead = sorted(
            bare_name(t) for t, acts in self.platforms.items() if acts & frozenset(stuck)
        )
        better = f"; call {' or '.join(instead)}" if instead else ""
        return f"{NOT_FOR_REQUEST}: {intent} cannot act on {', '.join(stuck)}{better}."

    def _unsaid_command(
        self, intent: str, targets: frozenset[str], arguments: Mapping[str, Any]
    ) -> Refusal | None:
        """A call of an intent whose templates for what it acts on say none of the
        request's command words, where a template made for a kind of thing the call or
        the request is about says one (of another intent, or of this one for another
        kind): "close the garage" is said by the off intent's cover templates, and by no
        template of ``HassLightSet``, so the light that shares the garage door's name is
        not switched on."""
        if self.data is None or self.follow_up or intent not in self.data.intents.intents:
            return None
        if intent in OPPOSITE and intent not in ON_OFF:
            return None  # a pair's own direction is read below, as on / off too
        named = self.target_domains({"name": arguments.get("name")})  # all its name names
        scope = targets | named | self.platforms_of(intent) | (self.about or frozenset())
        command = self._command_words()
        if not scope or not command:
            return None
        # What the call acts on: the things it names, where it names some.
        if intent_says(self.data, intent, command, targets or scope, own=False):
            return None
        others = most_said(self.data, self._saying(scope, command), command, scope)
        if not others:
            return None
        on = f" on {', '.join(sorted(targets))}" if targets else ""
        kinds = set().union(*(commanded_domains(self.data, o, command) for o in others)) & scope
        said, kind = ", ".join(sorted(command)), ", ".join(sorted(kinds))
        why = f"{intent}{on} does not do what the request says ({said}); {' or '.join(others)}"
        return Refusal(f"{NOT_FOR_REQUEST}: {why} on {kind} does.", tuple(others))

    def _command_words(self) -> frozenset[str]:
        """The request's command words (reading.command_words; none without data)."""
        if self.data is None:
            return frozenset()
        return command_words(self.data, self.text, self.names, said=self.asked)

    def _saying(
        self, scope: frozenset[str], command: frozenset[str] | None = None
    ) -> tuple[str, ...]:
        """The intents that act (not read) a template of which made for a domain of
        ``scope`` says one of the request's ``command`` words (its own, where None)."""
        if self.data is None or not scope:
            return ()
        if command is None:
            command = self._command_words()
        return tuple(
            sorted(
                other
                for other in self.data.intents.intents
                if other not in QUESTION_INTENTS
                and intent_says(self.data, other, command, scope, own=True)
            )
        )

    def _opposite(self, intent: str, targets: frozenset[str]) -> Refusal | None:
        """A call whose opposite intent is what the request reads as, on that kind."""
        other = OPPOSITE.get(intent)
        if other is None or self.data is None:
            return None
        switched = None if intent in ON_OFF else switched_as(self.data, self.text, self.names)
        if switched is not None:  # the words of switching say more than a word of a pair
            wanted = "HassTurnOn" if intent in STARTS else "HassTurnOff"
            if switched != wanted:  # the other of the pair is what it asks for
                return _asks_for(other, intent)
            return None
        domains: frozenset[str | None] = frozenset(targets or self.about or ())
        if not domains:
            domains = frozenset(self.platforms_of(intent))
        if not domains and intent in ON_OFF:
            domains = frozenset({None})  # by area or floor alone: on whatever is there
        asked = self.asked
        read = {
            direction(self.data, self.text, intent, d, self.names, said=asked, states=self.kinds)
            for d in domains
        }
        if other in read and intent not in read:
            return _asks_for(other, intent)
        return None

    def _contrary(self, intent: str, arguments: Mapping[str, Any]) -> Refusal | None:
        """A call whose word-valued argument is not what the request says of it
        (reading.said_values: "ścisz telewizor" says ``volume_step`` down; the small
        model turned it up), nor a number where it says none ("sube el volumen": up,
        not 40); its retry is the same intent with that value."""
        if self.data is None or intent not in self.data.intents.intents:
            return None
        numbered = any(ch.isdigit() for ch in self.text)
        slots = [k for k, v in arguments.items() if k not in TARGETS and _worded(v, numbered)]
        asked = self._unnamed_words()
        said = said_values(self.data, self.text, self.names, intent, slots=slots, said=asked)
        for slot, value in said.items():
            if (called := str(arguments[slot])).casefold() != value.casefold():
                why = f"{NOT_FOR_REQUEST}: the request asks for {slot} {value}, not {called}."
                return Refusal(why, (intent,), ((f"{intent}.{slot}", value),))
        return None

    def _unnamed_words(self) -> frozenset[str]:
        """The request's words, less those of the names of the house it says."""
        return self.asked.difference(*(words(n) for n in self.names.mentioned(self.text)))

    def platforms_of(self, intent: str) -> frozenset[str]:
        """The domains ``intent``'s tool acts on (empty: any, or none)."""
        found = (acts for tool, acts in self.platforms.items() if bare_name(tool) == intent)
        return next(found, frozenset())


def _worded(value: Any, numbered: bool) -> bool:
    """Whether an argument is read against the request: a word, or a number it lacks."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, str) or (number and not numbered)


# Intents that act on no thing and need no words of their own (they do nothing).
_DOMAIN_FREE_EXEMPT = frozenset({"HassNevermind", "HassRespond"})
