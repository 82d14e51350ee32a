"""A turn's inputs, read from Home Assistant for the turn policy (turn/policy.py), and what
the turn says after its tools ran (turn/result_speech.py).

``async_prepare_turn`` reads the request (its text, whether it asks, what of this house
it names, its nearest example), the house (its names, what each tool acts on) and the
agent's options, and asks ``policy.decide``; the ``Turn`` it returns also resolves each
call's arguments (house_names.resolve_call) and says what Home Assistant reported.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from homeassistant.components import conversation
from homeassistant.core import HomeAssistant, callback

from ..const import (
    CONF_READ_FIRST,
    CONF_TOOL_FIRST,
    DEFAULT_TOOL_FIRST,
    MAX_TOOL_ITERATIONS,
)
from ..errors import async_spoken
from ..house.kinds import Kinds, async_kind_words, named_by_kind
from ..house.names import HouseNames, names_entity, normalize, resolve_call, unasked, worded
from ..house.values import (
    domain_names,
    house_names,
    scoped_arguments,
    tool_domains,
)
from ..language.intents_data import async_language_data, cached_language_data
from ..language.questions import is_question, live_context_tool
from ..tool_names import bare_name
from .guard import NOT_FOR_REQUEST, Guard
from .hints import Hint, house_hint
from .plan import RequestPlan
from .policy import Capabilities, Options, Request, TurnPolicy, decide
from .prompt import HearthNative
from .result_speech import (
    NOT_ASKED,
    Outcome,
    Responses,
    async_responses,
    last_outcomes,
    render_response,
    spoken_outcomes,
)


@dataclass(frozen=True, slots=True)
class Turn:
    """One turn's policy and what it needs to run: the user's ``text``, the house's
    ``names``, each tool's arguments and domains, and the agent's phrases."""

    policy: TurnPolicy
    text: str
    names: HouseNames
    accepts: Mapping[str, tuple[str, ...]]  # tool (as shown) -> its arguments
    platforms: Mapping[str, frozenset[str]]  # tool (as shown) -> the domains it acts on
    responses: Responses
    done: str  # "Done.": where HA has no sentence of its own for an action
    fallback: str  # what is said in place of a reply that is not speech
    spoken: bool  # a conversation (speech); an AI Task's reply is structured data
    language: str
    follow_up: bool = False  # the conversation has earlier turns ("turn it off")
    guard: Guard | None = None  # whether a call can act on what was asked (action_guard)
    ask: str = ""  # what is said where the guard refused the calls: say it another way
    unchanged: str | None = None  # what is said where HA's action reached no target
    kinds: Kinds = field(default_factory=dict)  # HA's names of each kind (house/kinds.py)

    def resolve(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """A call's arguments as Home Assistant should run them (see resolve_call)."""
        key = tool if tool in self.accepts else _shown(tool, self.accepts)
        arguments = scoped_arguments(tool, arguments, self.policy.about)
        return resolve_call(
            tool,
            arguments,
            self.names,
            accepts=self.accepts.get(key, ()),
            platforms=self.platforms.get(key),
            about=self.policy.about,
            request=self.text,
        )

    def refusal(self, tool: str, arguments: Mapping[str, Any]) -> str | None:
        """Why a call is not run (None: it is). A call that cannot act on what the
        request asks is never run (turn/guard.py: a timer for "skip this track", the
        unlock for "lock the door", any action on a question). In the first turn of a
        conversation a call may name by ``name`` only a thing that shares a word with the
        request ("turn off the heating" turned off a bathroom light, and said so). The
        model reads why and may call again; else Assist asks the user to say it another way."""
        if self.guard is not None and (why := self.guard.refusal(tool, arguments)):
            return why
        name = arguments.get("name")
        if (
            not self.spoken
            or self.follow_up
            or not names_entity(tool)
            or not isinstance(name, str)
            or not unasked(name, self.names, self.text)
            or self._named_by_kind(name)
        ):
            return None
        return f"{NOT_ASKED} {name}: call a tool only on what the request names."

    def _named_by_kind(self, name: str) -> bool:
        """Whether the request names the thing ``name`` names by its kind ("the vacuum"
        for the house's one vacuum; house/kinds.py)."""
        named = {n.entity_id for n in self.names.things.get(normalize(name), ())}
        data = cached_language_data(self.language)
        return bool(named & named_by_kind(self.names, self.text, self.kinds, data))

    def speech(self, hass: HomeAssistant, content: Sequence[conversation.Content]) -> str | None:
        """What the turn says after its last tool calls (None: the model goes on)."""
        return self._said(hass, last_outcomes(content)) if self.spoken else None

    def _said(self, hass: HomeAssistant, outcomes: Sequence[Outcome]) -> str | None:
        return spoken_outcomes(
            outcomes,
            self.text,
            partial(render_response, hass, self.responses.intents),
            self.done,
            partial(self.responses.failed, hass),
            unchanged=self.unchanged,
        )

    def error_speech(
        self, hass: HomeAssistant, content: Sequence[conversation.Content]
    ) -> str | None:
        """What Assist says of the turn's last tool calls where some failed: each error's
        sentence, and what the others did (None: none failed)."""
        outcomes = last_outcomes(content)
        if not self.spoken or not any(outcome.error for outcome in outcomes):
            return None
        said = [
            (self.ask if _not_run(outcome) else self.responses.error(hass, outcome))
            if outcome.error
            else self._said(hass, [outcome])
            for outcome in outcomes
        ]
        return " ".join(dict.fromkeys(s for s in said if s)) or None

    def asks(self, text: str) -> bool:
        """Whether the model's ``text`` asks the user something (a clarifying question)."""
        return is_question(text, self.language)


def _not_run(outcome: Outcome) -> bool:
    """Whether the guard refused the call (action_guard.NOT_FOR_REQUEST)."""
    return str(outcome.result.get("error_text") or "").startswith(NOT_FOR_REQUEST)


def _shown(tool: str, accepts: Mapping[str, Any]) -> str:
    """The tool as the model is shown it, for a call by another of its names."""
    return next((name for name in accepts if bare_name(name) == bare_name(tool)), tool)


async def async_prepare_turn(
    hass: HomeAssistant,
    chat_log: conversation.ChatLog,
    plan: RequestPlan,
    *,
    language: str,
    options: Mapping[str, Any],
    caps: Capabilities,
    read_first: bool,
    spoken: bool,
) -> Turn:
    """This turn's policy, from its request, the house, the options and ``caps``."""
    asked = [c for c in chat_log.content if isinstance(c, conversation.UserContent)]
    text = asked[-1].content if asked else ""
    await async_language_data(hass, language)  # hints and questions read it
    names = house_names(hass)
    by_domain = domain_names(hass)
    pairs = [(name, domain) for domain, found in by_domain.items() for name in found]
    question = bool(text) and is_question(text, language, names=pairs)
    follow_up = len(asked) > 1  # "turn it off": the names are in the history
    platforms = tool_domains(hass, chat_log.llm_api) if chat_log.llm_api else {}
    hint = Hint()
    if text and plan.prefix.examples:
        hint = house_hint(hass, plan.tools, language, text, platforms)
    # What the request is about: its hint's domains, else those of the things it names.
    about = hint.domains if hint.domains is not None else names.named_domains(text) or None
    request = Request(
        text,
        question,
        frozenset(names.mentioned(text)),
        tuple(hint.messages),
        about,
        things=names.said_things(text),
        intent=hint.intent,
        slots=names.house_slots(hint.slots),
        worded=worded(names, text) if spoken and not follow_up else None,
    )
    policy = decide(
        request,
        plan.tools,
        Options(
            read_first=bool(options.get(CONF_READ_FIRST, read_first)),
            tool_first=bool(options.get(CONF_TOOL_FIRST, DEFAULT_TOOL_FIRST)),
        ),
        caps,
        live_tool=live_context_tool(plan.tools),
        tool_domains=platforms,
        values=plan.hearth,
        names_by_domain=by_domain,
        max_requests=None if spoken else MAX_TOOL_ITERATIONS,
    )
    accepts = {
        str(function.get("name", "")): tuple(
            (function.get("parameters") or {}).get("properties") or {}
        )
        for function in (tool.get("function") or {} for tool in plan.tools)
    }
    guard = Guard(
        text,
        cached_language_data(language),
        names,
        about,
        platforms,
        switchable(hass),
        follow_up=follow_up,
        question=question,
    )
    # "The vacuum" for the house's one vacuum (house/kinds.py).
    kinds = await async_kind_words(
        hass, language, {n.domain for f in names.things.values() for n in f}
    )
    return Turn(
        policy=policy,
        text=text,
        names=names,
        accepts=accepts,
        platforms=platforms,
        responses=await async_responses(hass, language),
        done=await async_spoken(hass, language, "action_done"),
        fallback=await async_spoken(hass, language, "markup_only"),
        spoken=spoken,
        language=language,
        follow_up=follow_up,
        guard=guard if spoken else None,
        ask=await async_spoken(hass, language, "not_run"),
        unchanged=await async_spoken(hass, language, "nothing_changed"),
        kinds=kinds,
    )


def switchable(hass: HomeAssistant) -> dict[str, frozenset[str]]:
    """``turn_on`` and ``turn_off`` -> the domains that have that service (a vacuum
    has neither: HA's on/off intents cannot act on it)."""
    services = hass.services.async_services()
    return {
        service: frozenset(d for d, found in services.items() if service in found)
        for service in ("turn_on", "turn_off")
    }


@callback
def say(chat_log: conversation.ChatLog, agent_id: str, said: str) -> None:
    """End the turn saying ``said`` (not the model's words; kept in the history)."""
    message = {"role": "assistant", "content": said}
    chat_log.async_add_assistant_content_without_tools(
        conversation.AssistantContent(
            agent_id=agent_id, content=said, native=HearthNative(context=None, message=message)
        )
    )
