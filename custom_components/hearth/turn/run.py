"""Run: a turn's requests, one loop, as its policy says (turn/decide.py: what each
request carries, at most ``max_requests``).

Every request starts with the agent's house prefix (pinned in the engine), then the
history as sent before (without earlier turns' hints), then this turn's context
message, nearest example and user text (turn/prompt.py). Each reply streams into the
chat log through ``transform_stream`` (turn/stream.py); tool calls run through HA's LLM
API (chat log); after an action the turn says what HA reported (turn/speak.py). An AI
Task's ``response_format`` (its structure) constrains every reply, and the model's
reply is then the answer. A request over the model's context is sent again with less
(``_async_start``, turn/context_fit.py). entity.py adapts Home Assistant's chat log and
the agent to this loop (``Agent``) and records what ``TurnRun`` gathered.
"""

from __future__ import annotations

import dataclasses
import unicodedata
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from homeassistant.components import conversation
from homeassistant.core import HomeAssistant

from ..backend.api import RequestUsage
from ..backend.coordinator import HearthCoordinator
from ..const import CONF_MAX_TOKENS, CONF_TEMPERATURE, DEFAULT_MAX_TOKENS, DEFAULT_TEMPERATURE
from ..errors import BACKEND_ERRORS, is_context_exceeded
from .context_fit import ContextFit, LeftOut, async_started
from .decide import Retry
from .plan import RequestPlan
from .prepare import Turn
from .prompt import build_messages
from .speak import say
from .stream import Reply, Reported, transform_stream


@dataclass(frozen=True, slots=True)
class Agent:
    """What a turn's run needs of the agent: its ``options`` (read fresh), its engine's
    ``coordinator`` (the backend; the model's context length), and ``without_examples``:
    leaves the worked examples out of its pin and plans the turn's requests again."""

    hass: HomeAssistant
    agent_id: str
    options: Callable[[], Mapping[str, Any]]
    coordinator: HearthCoordinator
    without_examples: Callable[[], Awaitable[RequestPlan]]


@dataclass(slots=True)
class TurnRun:
    """What a turn's requests gathered: the ``plan`` they were sent with last, what the
    server reported of each, and when each's first token and first word came."""

    plan: RequestPlan
    fit: ContextFit
    requests: list[RequestUsage] = field(default_factory=list)
    client_ttfts: list[float | None] = field(default_factory=list)
    first_speech: list[float | None] = field(default_factory=list)
    seen_calls: set[str] = field(default_factory=set)

    def as_trace(self, turn: Turn) -> dict[str, Any]:
        """What the conversation trace shows of the turn (its usage follows)."""
        plan = self.plan
        return {
            "pin": plan.pin,
            "prefix_digest": plan.prefix.digest,
            "prefix_bytes": len(plan.prefix.data),
            "context_lines": len(plan.context.splitlines()),
            **turn.policy.as_trace(),
            **self.fit.as_trace(),
            "client_ttft_ms": self.client_ttfts,
            # per request: when its first word reached the chat log (ms)
            "first_speech_ms": self.first_speech,
        }


@dataclass(frozen=True, slots=True)
class Part:
    """One command of a request that says several (turn/parts.py), run as a turn of its
    own: its ``text``, and where its own items begin in the chat log (``since``)."""

    text: str
    since: int

    def content(self, content: Sequence[conversation.Content]) -> list[conversation.Content]:
        """The chat log as this part's requests see it: the request is the part's text,
        and what the earlier parts did is left out (each says what it did)."""
        asked = [i for i, item in enumerate(content) if isinstance(item, conversation.UserContent)]
        if not asked:
            return [*content, conversation.UserContent(self.text)]
        user = asked[-1]
        said = dataclasses.replace(content[user], content=self.text)
        return [*content[:user], said, *content[max(self.since, user + 1) :]]


async def _async_run_parts(
    chat_log: conversation.ChatLog, agent: Agent, parts: Sequence[Turn], run: TurnRun
) -> None:
    """Run each command of a request that says several as a turn of its own, in order,
    then say what each said, together."""
    said: list[str] = []
    for turn in parts:
        since = len(chat_log.content)
        await async_run_turn(chat_log, agent, turn, run, part=Part(turn.request.text, since))
        last = chat_log.content[-1]
        if len(chat_log.content) > since and isinstance(last, conversation.AssistantContent):
            said.append(last.content or "")
    said = [_ended(s.strip()) for s in said if s.strip()]
    if len(said) > 1:
        say(chat_log, agent.agent_id, " ".join(said))


def _ended(sentence: str) -> str:
    """``sentence`` ending as a sentence ends (HA's error sentences often do not)."""
    return sentence if unicodedata.category(sentence[-1]) == "Po" else f"{sentence}."


async def async_run_turn(
    chat_log: conversation.ChatLog,
    agent: Agent,
    turn: Turn,
    run: TurnRun,
    *,
    response_format: Mapping[str, Any] | None = None,
    part: Part | None = None,
) -> None:
    """Run the tool loop for the chat log's last user message (or ``part`` of it);
    ``run`` gathers what its requests reported (also where one fails)."""
    hass, policy = agent.hass, turn.policy
    if turn.parts:
        await _async_run_parts(chat_log, agent, turn.parts, run)
        return

    def content() -> Sequence[conversation.Content]:
        return chat_log.content if part is None else part.content(chat_log.content)

    retry: Retry | None = None  # a refused call's retry: its tool_choice and values
    for iteration in range(policy.max_requests):
        failure = turn.speech.error_speech(hass, content())
        reply = Reply()  # its time to the first token counts the requests sent again
        chunks = await _async_start(
            agent, turn, run, content, iteration=iteration, response_format=response_format,
            retry=retry,
        )  # fmt: skip
        # ``chunks`` is closed even where the chat log stops before reading it.
        async with aclosing(chunks):
            stream = transform_stream(
                chunks,
                reply,
                turn,
                seen_calls=run.seen_calls,
                context=run.plan.context if iteration == 0 else None,
                reported=Reported(turn.speech.speech(hass, content()), failure),
            )
            async for _content in chat_log.async_add_delta_content_stream(agent.agent_id, stream):
                pass
        run.client_ttfts.append(reply.client_ttft_ms)
        run.first_speech.append(reply.first_speech_ms)
        if reply.usage is not None:
            run.requests.append(reply.usage)
        if not chat_log.unresponded_tool_results:
            break
        # Each call refused for doing another thing than the request reads as: the
        # next request may call only what it reads as ("close the garage": not the
        # light's brightness, the off intent), else the turn says it did not do it.
        retry = policy.retry(run.plan.tools, reply.refused, iteration)
        if retry is None and (said := turn.speech.speech(hass, content())) is not None:
            say(chat_log, agent.agent_id, said)  # what HA reports was done
            break


def request_body(
    agent: Agent,
    plan: RequestPlan,
    messages: list[dict[str, Any]],
    turn: Turn,
    *,
    iteration: int,
    response_format: Mapping[str, Any] | None = None,
    retry: Retry | None = None,
) -> dict[str, Any]:
    """Request ``iteration`` of ``turn`` (its policy: turn/decide.py), or a refused
    call's ``retry`` (its own ``tool_choice`` and argument values)."""
    options, policy = agent.options(), turn.policy
    body: dict[str, Any] = {
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": float(options.get(CONF_TEMPERATURE, DEFAULT_TEMPERATURE)),
        "max_tokens": int(options.get(CONF_MAX_TOKENS, DEFAULT_MAX_TOKENS)),
    }
    if plan.tools:
        body["tools"] = list(plan.tools)
        chosen = retry.choice if retry else policy.tool_choice(iteration, True)
        if chosen is not None:
            body["tool_choice"] = chosen
    values = retry.values if retry else policy.values
    body.update(agent.coordinator.backend.request_extensions(values))
    if response_format is not None:
        body["response_format"] = dict(response_format)
    return body


async def _async_start(
    agent: Agent,
    turn: Turn,
    run: TurnRun,
    content: Callable[[], Sequence[conversation.Content]],
    *,
    iteration: int,
    response_format: Mapping[str, Any] | None,
    retry: Retry | None = None,
) -> AsyncGenerator[dict[str, Any]]:
    """Send request ``iteration`` and wait for its first chunk; returns the reply's
    chunks (``run.plan`` is then the plan it was sent with). ``content``: the chat log as
    the turn's requests see it (``Part.content``).

    A request over the model's context is sent again with less (turn/context_fit.py):
    without the conversation's earlier turns, then with the agent's prefix pinned
    without worked examples. Nothing of a refused request reached the chat log, so
    none of its calls ran and none of its words were said.
    """
    fit, hint, plan = run.fit, turn.policy.hint, run.plan
    while True:
        messages = build_messages(plan.prefix, content(), plan.context, fit.max_history, hint)
        body = request_body(
            agent, plan, messages, turn, iteration=iteration, response_format=response_format,
            retry=retry,
        )  # fmt: skip
        try:
            chunks = await async_started(agent.coordinator.backend.chat.async_chat_stream(body))
        except BACKEND_ERRORS as err:
            if not is_context_exceeded(err):
                raise
            alone = build_messages(plan.prefix, content(), plan.context, 0, hint)
            step = fit.next_step(
                err,
                history=len(alone) < len(messages),
                examples=bool(plan.prefix.examples),
                max_tokens=int(body["max_tokens"]),
                context_length=agent.coordinator.context_length,
            )
            if step is LeftOut.EXAMPLES:
                plan = await agent.without_examples()
        else:
            run.plan = plan
            return chunks
