"""A turn as one pipeline: understand → decide → call → speak.

``async_prepare_turn`` reads the request once (turn/understand.py: its words, what of
the house it names, whether it asks, its nearest example), asks the pure policy
(turn/decide.py) what each request carries, and builds what judges the model's calls
(turn/call.py) and what the turn says of them (turn/speak.py). The ``Turn`` it returns
is what the run (turn/run.py) and the stream (turn/stream.py) read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from homeassistant.components import conversation
from homeassistant.core import HomeAssistant

from ..const import CONF_READ_FIRST, CONF_TOOL_FIRST, DEFAULT_TOOL_FIRST, MAX_TOOL_ITERATIONS
from ..language.questions import live_context_tool
from .call import Calls
from .decide import Capabilities, Options, TurnPolicy, decide
from .plan import RequestPlan
from .refusal import Refusal
from .speak import Speech
from .understand import Request, async_understand


@dataclass(frozen=True, slots=True)
class Turn:
    """One turn: its ``request`` (read once), its ``policy``, what judges its ``calls``,
    what it says (``speech``) and the names of the tools HA offers it."""

    request: Request
    policy: TurnPolicy
    calls: Calls
    speech: Speech
    tool_names: tuple[str, ...] = ()
    # A request of several commands (turn/parts.py): each one's own turn, run in order.
    parts: tuple[Turn, ...] = ()

    @property
    def spoken(self) -> bool:
        """A conversation (speech); an AI Task's reply is structured data."""
        return self.speech.spoken

    @property
    def fallback(self) -> str | None:
        """What is said in place of a reply that is not speech (None: not speech)."""
        return self.speech.fallback if self.spoken else None

    @property
    def early(self) -> bool:
        """Whether its words may be said as they are decoded: a command ends with what
        HA reports."""
        return not self.policy.command

    def resolve(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """A call's arguments as Home Assistant should run them (call.Calls.resolve)."""
        return self.calls.resolve(tool, arguments)

    def refusal(self, tool: str, arguments: Mapping[str, Any]) -> Refusal | None:
        """Why a call is not run (None: it is; call.Calls.refusal)."""
        return self.calls.refusal(tool, arguments)

    def asks(self, text: str) -> bool:
        """Whether the model's ``text`` asks the user something (speak.Speech.asks)."""
        return self.speech.asks(text)


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
    part: str | None = None,
) -> Turn:
    """This turn, from its request, the house, the options and ``caps``; ``part``: one
    command of the request's several (turn/parts.py), as a turn of its own."""
    request, house = await async_understand(
        hass, chat_log, plan, language=language, spoken=spoken, part=part
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
        tool_domains=house.platforms,
        values=plan.hearth,
        names_by_domain=house.by_domain,
        max_requests=None if spoken else MAX_TOOL_ITERATIONS,
    )
    calls = Calls.of(hass, request, house, tools=plan.tools, spoken=spoken)
    tools = chat_log.llm_api.tools if chat_log.llm_api else []
    parts = [
        await async_prepare_turn(
            hass, chat_log, plan, language=language, options=options, caps=caps,
            read_first=read_first, spoken=spoken, part=text,
        )
        for text in request.parts
    ]  # fmt: skip
    return Turn(
        request,
        policy,
        calls,
        await Speech.async_of(hass, request.text, language, spoken=spoken),
        tuple(tool.name for tool in tools),
        tuple(parts),
    )
