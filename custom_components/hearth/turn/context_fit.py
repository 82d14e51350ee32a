"""A turn's request over the model's context: sent again with less, or refused with
advice that helps.

A one-line command must not fail because the conversation before it is long, or because
the worked examples that help a small model take the room it needs. When the server
refuses a request for its length (``errors.is_context_exceeded``), the turn sends the
same request again, leaving out in this order:

1. the conversation's earlier turns: only this turn's messages follow the prefix (its
   context, nearest example, user message, and the calls and results of this turn);
2. the agent's worked examples: its prefix is pinned again without them
   (``PrefixManager.async_leave_out_examples``), for this turn and the next ones.

What is left out stays out for the rest of the turn. A request that still does not fit
raises ``ContextOverflow``: the house itself leaves no room for a command
(``house_too_big``: expose fewer entities, or use a model with a longer context), or the
agent's max tokens per reply alone fill the model's known context
(``max_tokens_exceed_context``).

The request is sent again only while nothing of it has been acted on or said: a server
refuses such a request before its reply starts, and a turn's request reaches the chat
log only once its first chunk came (``async_started``). So no call runs twice and no
word is streamed twice.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ..errors import ContextOverflow


class LeftOut(StrEnum):
    """What a turn's requests leave out to fit the model's context."""

    HISTORY = "history"  # the conversation's earlier turns
    EXAMPLES = "examples"  # the worked examples of the agent's prefix


@dataclass(slots=True)
class ContextFit:
    """What the requests of one turn leave out, from the first that did not fit on."""

    max_history: int  # earlier turns sent with each request (the agent's option, or 0)
    left_out: list[LeftOut] = field(default_factory=list)

    def next_step(
        self,
        err: Exception,
        *,
        history: bool,
        examples: bool,
        max_tokens: int,
        context_length: int | None,
    ) -> LeftOut:
        """What to leave out after ``err`` (the server's refusal of a request that was
        over the context): the earlier turns where the request had any (``history``),
        then the prefix's worked examples (``examples``). Raises ``ContextOverflow``
        where nothing is left to leave out, or where ``max_tokens`` alone fill the
        model's ``context_length`` (None: unknown)."""
        if history and self.max_history > 0:
            self.max_history = 0
            self.left_out.append(LeftOut.HISTORY)
            return LeftOut.HISTORY
        if context_length is not None and max_tokens >= context_length:
            raise ContextOverflow("max_tokens_exceed_context", err)
        if examples and LeftOut.EXAMPLES not in self.left_out:
            self.left_out.append(LeftOut.EXAMPLES)
            return LeftOut.EXAMPLES
        raise ContextOverflow("house_too_big", err)

    def as_trace(self) -> dict[str, Any]:
        """For the conversation trace: what this turn's requests left out."""
        return {"left_out": [step.value for step in self.left_out]}


async def async_started(chunks: AsyncGenerator[dict[str, Any]]) -> AsyncGenerator[dict[str, Any]]:
    """``chunks`` (a streamed reply) once its first chunk came, which it yields again.

    A server's refusal of the request (over the context, busy, a bad key) raises here,
    before anything of the reply reached the chat log. Closing what it returns closes
    ``chunks`` (the reply's HTTP stream), read or not.
    """
    try:
        first: dict[str, Any] | None = await anext(chunks)
    except StopAsyncIteration:
        first = None
    return _Started(first, chunks)


class _Started(AsyncGenerator[dict[str, Any]]):
    """A started reply: its first chunk (already read), then the rest of ``chunks``."""

    def __init__(
        self, first: dict[str, Any] | None, chunks: AsyncGenerator[dict[str, Any]]
    ) -> None:
        self._first = first
        self._chunks = chunks

    async def asend(self, value: None) -> dict[str, Any]:
        if (first := self._first) is not None:
            self._first = None
            return first
        return await self._chunks.asend(value)

    async def athrow(self, *args: Any) -> dict[str, Any]:
        return await self._chunks.athrow(*args)

    async def aclose(self) -> None:
        self._first = None
        await self._chunks.aclose()
