"""The messages of a request: house prefix, volatile context, history, user text.

Layout of every request (the prefix is pinned in the engine)::

    [system: house prefix]                       <- stable, pinned (prefix/render.py)
    [system: context of turn 1] [user 1] [assistant 1 ...] [tool results ...]
    ...
    [system: context of turn N] [example] [user N]  <- this turn

The context message of a turn holds what HA put in its system prompt for that
request and the prefix does not have: the time and date (when no GetDateTime tool
exists), the speaking satellite's area or device text, ``extra_system_prompt``, and
anything else that varies. It is stored with the turn (in the ``native`` field of the
turn's first assistant content) and re-sent unchanged with every later turn, like the
assistant messages, which are re-sent exactly as the engine produced them. So turn N+1
starts with the exact tokens of turn N and reuses all of them from the engine's cache.

This turn's nearest worked example (``[example]``: a user message and the call that
answers it, turn/hints.py) comes after its context, right before the user message: a voice
satellite's context (its area) is the same for every command it hears, so the engine
has the prefix and that context cached after the satellite's first command, and each
later one prefills only its example and its words.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from homeassistant.components import conversation
from homeassistant.helpers.json import json_dumps

from ..prefix.value import HousePrefix


@dataclass(frozen=True, slots=True)
class HearthNative:
    """What Hearth sent and received for one assistant message (``AssistantContent.native``).

    ``context`` is the context message sent before the turn's user message (only on
    the first assistant message of a turn); ``message`` is the assistant message as
    the engine produced it (content and raw tool calls), to be re-sent verbatim.
    """

    context: str | None
    message: dict[str, Any]


def volatile_lines(
    system_prompt: str, stable_system: str, told: frozenset[str] = frozenset()
) -> list[str]:
    """The lines of HA's per-request system prompt that the stable prefix lacks.

    HA renders the instructions, the API prompt, the date and time and
    ``extra_system_prompt`` into one system prompt per request, and some API
    prompts describe the speaking device (its area). Rather than trusting that none
    of that reaches the prefix, compare line by line: what is not a line of the
    prefix is volatile and moves to the context message, unless the caller tells it
    otherwise (``told``: the lines of a newer house, told as sentences).
    """
    stable = set(stable_system.splitlines())
    return [
        line
        for line in system_prompt.splitlines()
        if line.strip() and line not in stable and line not in told
    ]


def volatile_context(system_prompt: str, stable_system: str) -> str:
    """``volatile_lines`` as the text of a context message."""
    return "\n".join(volatile_lines(system_prompt, stable_system))


def build_messages(
    prefix: HousePrefix,
    content: Sequence[conversation.Content],
    context: str,
    max_history: int,
    hint: Sequence[dict[str, Any]] = (),
) -> list[dict[str, Any]]:
    """All messages of the next request of a turn.

    ``content`` is the chat log; its last user message is this turn's, and
    ``context`` its context message. Earlier turns keep the context they were sent
    with; at most ``max_history`` earlier turns are kept (whole turns, oldest
    dropped first). ``hint`` (this turn's nearest example, turn/hints.py) goes between this
    turn's context and its user message; earlier turns are sent without theirs.
    """
    items = list(content[1:])  # content[0] is HA's system prompt: replaced by the prefix
    user_indices = [i for i, item in enumerate(items) if isinstance(item, conversation.UserContent)]
    current = user_indices[-1] if user_indices else None
    if len(user_indices) > max_history + 1:
        start = user_indices[-(max_history + 1)]
        items = items[start:]
        if current is not None:
            current -= start
    messages = list(prefix.messages)
    for i, item in enumerate(items):
        if isinstance(item, conversation.UserContent):
            turn_context = _stored_context(items, i)
            if i == current and turn_context is None:
                turn_context = context
            if turn_context:
                messages.append({"role": "system", "content": turn_context})
            if i == current:
                messages.extend(hint)
            messages.append({"role": "user", "content": item.content})
        elif isinstance(item, conversation.AssistantContent):
            messages.append(assistant_message(item))
        elif isinstance(item, conversation.ToolResultContent):
            messages.append(tool_message(item))
    return messages


def _stored_context(items: Sequence[conversation.Content], user_index: int) -> str | None:
    """The context sent with the user message at ``user_index`` (None if none stored)."""
    following = items[user_index + 1] if user_index + 1 < len(items) else None
    if isinstance(following, conversation.AssistantContent) and isinstance(
        following.native, HearthNative
    ):
        return following.native.context
    return None


def assistant_message(item: conversation.AssistantContent) -> dict[str, Any]:
    """An assistant message: verbatim if Hearth produced it, else rebuilt."""
    if isinstance(item.native, HearthNative):
        return item.native.message
    message: dict[str, Any] = {"role": "assistant", "content": item.content or ""}
    if item.tool_calls:
        message["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.tool_name, "arguments": json_dumps(call.tool_args)},
            }
            for call in item.tool_calls
        ]
    return message


def tool_message(item: conversation.ToolResultContent) -> dict[str, Any]:
    """A tool result, answering the call with the same id (deterministic JSON)."""
    return {
        "role": "tool",
        "tool_call_id": item.tool_call_id,
        "content": json_dumps(item.result.data),
    }
