"""Decide: one turn policy, what each request of a turn carries.

From the request as the turn read it (turn/understand.py: its text, whether it asks,
what of this house it names, its nearest example), the house (its names, what each tool
acts on) and what the server can do (``Capabilities``), ``decide`` returns a
``TurnPolicy``; turn/run.py runs it:

- **Read first.** A question that names something of this house (a thing, area or
  floor, or a kind of thing its nearest example is about) starts by reading the house:
  the first request names the live-context tool. "Tell me a joke" reads nothing.
- **A question never acts.** Its other requests may call only the tools that read
  (questions.reads: the live context, a calendar, a to-do list, the date and time),
  or answer in words: asked how warm it was outside, the small model set a thermostat.
- **A command acts or asks.** A request that names something of this house and does
  not ask must call a tool first (``required``; where the server takes OpenAI's
  ``allowed_tools``, only the tools that act on what it names), never answer in prose.
  Where one of HA's sentence templates reads the request whole with this house's
  names, the command may call only that template's intent: HA's matcher would run
  it ("lock the front door" is ``HassTurnOn``; the small model unlocked it), and its
  call names what the template read: "all the lights in the office" is the office's
  lights by area, not one light by name.
- **Argument values.** Where the server narrows arguments (Hearth's grammar), a
  command's on/off calls may name only things of the domains it names, and a request
  that says a thing's name may name only the things it says (a small model copies the
  name in its example: asked what the living room thermostat was set to, it read the
  bedroom's). In a spoken first turn, where a call by a name that shares no word with
  the request is refused (turn/call.py), the grammar offers only the names that do, where
  any do: asked to turn off the TV, the small model called the bedroom speaker by name,
  was refused and said it did not understand. A question one of HA's templates reads
  whole reads the house through the live-context tool's filters, set to what the
  template read ("which lights are on in the living room": that area's lights, not the
  whole house nor one light).
- **A narrowed retry.** Where the turn refused every call of a request for doing another
  thing than the request reads as (turn/guard.py's ``Refusal.instead``), the next request
  may call only those intents (``retry``): asked to unlock, the model locked; it
  may then only unlock. A word-valued argument the request reads takes only that value
  ("ścisz": ``volume_step`` down).
- **Bounded.** At most ``MAX_REQUESTS`` requests; the last may not call a tool. After
  an action, the turn ends with what Home Assistant reports was done (turn/result_speech.py),
  not with the model's words; a repeated call ends it the same way.

``decide`` and ``TurnPolicy`` are pure; turn/understand.py gathers their inputs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from ..house.names import names_entity, normalize
from ..house.values import AREA_WIDE, allowed_for
from ..language.questions import reads
from ..tool_names import bare_name

if TYPE_CHECKING:
    from .refusal import Refusal
    from .understand import Request

MAX_REQUESTS = 3  # a call, a retry after an error, then words
TARGETS = ("name", "area", "floor")  # the arguments that name what a call acts on


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What the server behind the agent does with a request's tool fields (the
    backend knows; see backend/base.py)."""

    forced_calls: bool = False  # a forced call is grammar-valid: commands may be forced
    allowed_tools: bool = False  # it takes OpenAI's ``allowed_tools`` tool_choice
    value_lists: bool = False  # it narrows argument values (the ``hearth`` extension)

    @classmethod
    def of(cls, narrows_tools: bool) -> Capabilities:
        """Hearth's engine does all three; another OpenAI-compatible server none."""
        return cls(narrows_tools, narrows_tools, narrows_tools)


@dataclass(frozen=True, slots=True)
class Options:
    """The agent's options that shape its turns."""

    read_first: bool = True
    tool_first: bool = False


@dataclass(frozen=True, slots=True)
class TurnPolicy:
    """What the requests of one turn carry."""

    hint: tuple[dict[str, Any], ...] = ()
    first_choice: str | dict[str, Any] | None = None  # the first request's tool_choice
    later_choice: str | dict[str, Any] | None = None  # the others' (but the last)
    allowed: list[str] | None = None  # the tools a command may call (None: any)
    values: dict[str, Any] | None = None  # argument values for the grammar (None: none)
    about: frozenset[str] | None = None
    read_first: bool = False
    command: bool = False
    max_requests: int = MAX_REQUESTS
    request: dict[str, Any] = field(default_factory=dict)  # what it read: named, question
    retries: bool = False  # a refused call's retry may be narrowed (``retry``)

    def as_trace(self) -> dict[str, Any]:
        """What the conversation trace shows of the policy."""
        return {
            "hint": self.hint[0]["content"] if self.hint else None,
            "allowed_tools": self.allowed,
            "read_first": self.read_first,
            "command": self.command,
            **self.request,
        }

    def tool_choice(self, iteration: int, has_tools: bool) -> str | dict[str, Any] | None:
        """The ``tool_choice`` of request ``iteration`` (None: the server's default)."""
        if not has_tools:
            return None
        if iteration == 0:
            return self.first_choice
        if iteration >= self.max_requests - 1:
            return "none"  # the last request speaks
        return self.later_choice

    def retry(
        self, tools: Sequence[Mapping[str, Any]], refused: Sequence[Refusal], iteration: int
    ) -> Retry | None:
        """The request after ``iteration``, where the turn refused each call of it for
        doing another thing than the request reads as (``refused``, guard.Refusal): it
        must call one of the intents they read as instead; a word-valued argument the
        request reads takes only that value ("ścisz": the model turned the volume up
        again when only its intent was narrowed), and the arguments they require must be
        given (a thing the request names, where the call named none). None: no retry
        (the server cannot narrow the tools, none of them is offered, or the next
        request is the last, which speaks)."""
        instead = {i for why in refused for i in why.instead}
        if not self.retries or not instead or iteration + 1 >= self.max_requests - 1:
            return None
        names = [str((t.get("function") or {}).get("name", "")) for t in tools]
        choice = required([n for n in names if bare_name(n) in instead])
        if not choice:
            return None
        values = dict(self.values or {})
        narrowed: dict[str, list[str]] = {}
        for key, value in (pair for why in refused for pair in why.values):
            if value not in (listed := narrowed.setdefault(key, [])):
                listed.append(value)
        if narrowed:
            values["argument_values"] = {**values.get("argument_values", {}), **narrowed}
        if needed := {arg for why in refused for arg in why.required}:
            values["required_arguments"] = sorted({*values.get("required_arguments", ()), *needed})
        return Retry(choice, values or self.values)


class Retry(NamedTuple):
    """A refused call's retry: its ``tool_choice``, and the argument values it sends."""

    choice: dict[str, Any]
    values: dict[str, Any] | None


def decide(
    request: Request,
    tools: Sequence[Mapping[str, Any]],
    options: Options,
    caps: Capabilities,
    *,
    live_tool: str | None = None,
    tool_domains: Mapping[str, frozenset[str]] | None = None,
    values: dict[str, Any] | None = None,
    names_by_domain: Mapping[str, Sequence[str]] | None = None,
    max_requests: int | None = None,
) -> TurnPolicy:
    """This turn's policy. ``tools``: the OpenAI tools its requests offer;
    ``live_tool``: the live-context tool's name among them; ``tool_domains``: tool ->
    the domains it acts on (values.tool_domains); ``values``: the house's
    argument values (values.house_values); ``names_by_domain``: the exposed
    names and aliases of each domain; ``max_requests``: where not ``MAX_REQUESTS``
    (an AI Task's structured reply may take more)."""
    about = request.about
    read_first = bool(
        tools and request.question and options.read_first and live_tool and request.names_house
    )
    # A command: it names something of this house, or it has an action's example (a
    # timer names nothing).
    command = bool(tools) and not request.question and (request.names_house or bool(request.hint))
    allowed = None
    if command and caps.allowed_tools and tool_domains is not None:
        allowed = allowed_for(tools, tool_domains, about)
    read = None  # the one tool of the intent a template read in it
    if command and caps.allowed_tools and request.intent:
        read = said_intent(tools, allowed, request.intent)
        allowed = read or allowed
    first: str | dict[str, Any] | None = None
    if read_first:
        first = {"type": "function", "function": {"name": live_tool}}
    elif command and caps.forced_calls and allowed:
        first = required(allowed)
    elif tools and ((command and caps.forced_calls) or options.tool_first):
        first = "required"
    # A question never acts: after its first request (the read), and where it reads
    # nothing first, its requests may call the tools that read only, or answer.
    later = reading_choice(tools) if request.question and caps.allowed_tools else None
    first = later if first is None else first
    sent = None
    if caps.value_lists and values:
        sent = command_values(values, about, names_by_domain or {}) if command else values
        sent = said_values(sent, request.things)
        if request.worded is not None:
            sent = worded_values(sent, request.worded)
        if read:
            sent = read_values(sent, request.intent or "", request.slots)
        elif read_first and live_tool and request.slots:
            sent = live_values(sent, bare_name(live_tool), request.slots)
    return TurnPolicy(
        hint=tuple(request.hint),
        first_choice=first,
        later_choice=later,
        allowed=None if read_first else allowed,
        values=sent,
        about=about,
        read_first=read_first,
        command=command,
        max_requests=max_requests or MAX_REQUESTS,
        retries=caps.allowed_tools and caps.forced_calls,
        request={
            "named": sorted(request.named),
            "question": request.question,
            **({"parts": list(request.parts)} if request.parts else {}),
        },
    )


def required(names: Sequence[str]) -> dict[str, Any]:
    """A ``tool_choice`` by which a request must call one of the tools ``names``
    (empty: none)."""
    if not names:
        return {}
    chosen = [{"type": "function", "function": {"name": name}} for name in names]
    return {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": chosen}}


def reading_choice(tools: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """A ``tool_choice`` that lets a request call only the offered tools that read
    (questions.reads), or answer in words; None where none of them reads."""
    names = [str((t.get("function") or {}).get("name", "")) for t in tools]
    chosen = [{"type": "function", "function": {"name": n}} for n in names if reads(n)]
    if not chosen:
        return None
    return {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": chosen}}


def said_intent(
    tools: Sequence[Mapping[str, Any]], allowed: list[str] | None, intent: str
) -> list[str] | None:
    """Of ``allowed`` (None: all ``tools``), the tool of the ``intent`` a template of
    HA read in the request: a small model told to lock a door unlocked it, with the
    example of locking right before it. None where no such tool is offered."""
    names = allowed or [str((t.get("function") or {}).get("name", "")) for t in tools]
    chosen = [name for name in names if bare_name(name) == intent]
    return chosen or None


def read_values(values: dict[str, Any], intent: str, slots: Mapping[str, str]) -> dict[str, Any]:
    """``values`` where the call of ``intent`` targets what HA's template read (its
    ``slots``): the name, area and floor it read, and none it did not read (asked for
    all the lights in the office, the small model switched on one of them by name); the
    domain and device class it read, else any of the house's. The targets it read are
    required: a call of the lights upstairs that said no floor (and may say no name)
    switched off every light of the house. A slot read as "" (the speaking device's
    area) is left to the model."""
    narrowed = {
        f"{intent}.{slot}": [slots[slot]] if slots.get(slot) else []
        for slot in TARGETS
        if slots.get(slot) != ""
    }
    for kind in ("domain", "device_class"):  # the curtains of an area, not its doors
        if slots.get(kind):
            narrowed[f"{intent}.{kind}"] = [slots[kind]]
    required = sorted(f"{intent}.{slot}" for slot in TARGETS if slots.get(slot))
    return {
        **values,
        "argument_values": {**values.get("argument_values", {}), **narrowed},
        "required_arguments": required,
    }


def live_values(values: dict[str, Any], tool: str, slots: Mapping[str, str]) -> dict[str, Any]:
    """``values`` where a question's live-context call (``tool``, its bare name) filters
    the house by what HA's template read of the question (``slots``, as ``read_values``
    takes them), where it read a thing's name or a kind of thing: Home Assistant's
    ``GetLiveContext`` then lists only those, where the whole house, or the one thing
    of its example that a small model copied, answered from the wrong entity ("which
    lights are on in the living room"). An area alone is left to the model: the
    temperature in the kitchen is one of seven things there, and the model asked for
    the kitchen's temperature sensor by name on its own."""
    if not (slots.get("name") or slots.get("domain")):
        return values
    read = read_values(values, tool, slots)
    if slots.get("domain"):  # the model left the kind out, and read the living room whole
        read["required_arguments"] = sorted({*read["required_arguments"], f"{tool}.domain"})
    else:  # a thing's name: its kind is its own (a wrong one filters it out)
        read["argument_values"][f"{tool}.domain"] = []
    return read


def command_values(
    values: dict[str, Any],
    about: frozenset[str] | None,
    names_by_domain: Mapping[str, Iterable[str]],
) -> dict[str, Any]:
    """``values`` for a command about the domains ``about``: the on/off intents, which
    act on any domain, may name only things of those (asked to turn off all the lights
    in the office, the default model turned off its thermostat)."""
    if not about:
        return values
    names = sorted({n for domain in about for n in names_by_domain.get(domain, ())})
    tools = values.get("argument_tools") or ()
    keys = {f"{bare_name(t)}.name" for t in tools if bare_name(t) in AREA_WIDE}
    if not names or not keys:
        return values
    narrowed = {**values["argument_values"], **dict.fromkeys(sorted(keys), names)}
    return {**values, "argument_values": narrowed}


def worded_values(values: dict[str, Any], worded: frozenset[str]) -> dict[str, Any]:
    """``values`` where the ``name`` of each intent tool that names an entity keeps
    only the ``worded`` names (normalized; names.worded), as ``said_values``
    keeps the said ones. A list that holds none of them is left whole: with no name
    to give, the default model acted on an area instead ("turn off the heating"
    turned off a bathroom's fan and light), where a refused name ends the turn with
    "Sorry, I couldn't understand that". The live-context tool's filter is left
    alone: reading is never refused."""
    listed = values.get("argument_values", {})
    keys = [
        f"{bare_name(tool)}.name"
        for tool in values.get("argument_tools") or ()
        if names_entity(tool)
    ]
    return _keep_names(values, worded, {k: listed.get(k, listed.get("name")) for k in keys})


def said_values(values: dict[str, Any], things: frozenset[str]) -> dict[str, Any]:
    """``values`` whose ``name`` lists keep only the ``things`` (normalized names) the
    request says; a list that holds none of them is left whole (the request says a
    sensor, the tool sets thermostats)."""
    if not things:
        return values
    listed = values.get("argument_values", {})
    names = {k: v for k, v in listed.items() if k == "name" or k.endswith(".name")}
    return _keep_names(values, things, names)


def _keep_names(
    values: dict[str, Any], keep: frozenset[str], lists: Mapping[str, Any]
) -> dict[str, Any]:
    """``values`` where each of ``lists`` (key -> its names) keeps only the names in
    ``keep`` (normalized), if it holds any."""
    narrowed = {}
    for key, listed in lists.items():
        kept = [v for v in listed or () if normalize(str(v)) in keep]
        if kept:
            narrowed[key] = kept
    if not narrowed:
        return values
    return {**values, "argument_values": {**values["argument_values"], **narrowed}}
