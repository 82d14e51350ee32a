"""``POST /v1/chat/completions``: OpenAI chat format, streaming (SSE) or not."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from aiohttp import web

from ..chat.call_stream import CallAnnouncer
from ..chat.formatter import ChatTemplateError, StreamSplitter, ToolCall
from ..constraints.grammar import ConstraintRequest, GrammarError, allowed_tools, tool_aliases
from ..constraints.mask import Constraint
from ..serving.engine import ContextLengthError, EngineClosedError, QueueFullError
from ..serving.sampling import SamplingParams
from ..serving.sequence import ErrorEvent, Event, FinishEvent, RequestStats, TokenEvent
from .errors import APIError, bad_request, overloaded
from .schemas import CHAT_REQUEST, check_tool_references, read_json, validate
from .state import ServerState

_LOGGER = logging.getLogger(__name__)


@dataclass
class PreparedChat:
    prompt: list[int]
    params: SamplingParams
    forced: str  # text forced after the generation prompt (tool_choice)
    parse_tools: bool
    stream: bool
    include_usage: bool
    salt: str | None
    logged_prompt: str | None  # the prompt as text, only with --log-prompts
    constraint: Constraint | None = None  # the grammar the reply must follow
    aliases: dict[str, str] | None = None  # short tool name -> offered name (constrained)
    # The request's figures; the server's preparation times go in first.
    stats: RequestStats = field(default_factory=RequestStats)


def constraint_for(state: ServerState, body: dict[str, Any], forced: str) -> Constraint | None:
    """The request's grammar (compiled once per tool set); bad schemas are 400s.

    Runs on the prepare thread. Also used when a prefix is pinned with tools, so that
    the house's grammar is compiled before its first request.
    """
    tools = body.get("tools") or ()
    request = ConstraintRequest(
        tools=tuple(tools),
        tool_choice=body.get("tool_choice", "auto") if tools else "none",
        parallel_tool_calls=body.get("parallel_tool_calls") is not False,
        response_format=body.get("response_format"),
        argument_values=(body.get("hearth") or {}).get("argument_values"),
        argument_tools=(body.get("hearth") or {}).get("argument_tools"),
        required_arguments=(body.get("hearth") or {}).get("required_arguments"),
    )
    try:
        return state.constraints.start(request, forced)
    except GrammarError as err:
        raise bad_request(
            f"invalid schema: {err}", param=err.param, code="invalid_schema"
        ) from None
    except ImportError:
        raise APIError(
            501,
            "constrained decoding (tools, response_format) needs the llguidance package",
            type_="server_error",
            code="constraints_unavailable",
        ) from None


def _prepare(state: ServerState, body: dict[str, Any]) -> PreparedChat:
    """Validate, render and tokenize a request (runs on the prepare thread, not the loop)."""
    messages = body["messages"]
    check_tool_references(messages)
    tools = body.get("tools") or None
    tool_choice = body.get("tool_choice", "auto")
    if tool_choice not in ("auto", "none") and not tools:
        raise bad_request("tool_choice needs tools", param="tool_choice")
    if isinstance(tool_choice, dict):
        offered = {t["function"]["name"] for t in tools or []}
        allowed = allowed_tools(tool_choice)
        for wanted in sorted(allowed[0]) if allowed else [tool_choice["function"]["name"]]:
            if wanted not in offered:
                raise bad_request(
                    f"tool_choice names an unknown tool {wanted!r}", param="tool_choice"
                )
    formatter = state.formatter
    forced = formatter.forced_prefix(tool_choice) if tools else ""
    try:
        prompt = state.prompts.encode(messages, tools, add_generation_prompt=True, suffix=forced)
    except RecursionError:
        raise bad_request("the messages or tools are nested too deeply") from None
    except ChatTemplateError as err:
        raise bad_request(str(err), param="messages", code="invalid_messages") from None
    limit = state.engine.info.context_length
    requested = body.get("max_completion_tokens") or body.get("max_tokens")
    max_tokens = requested or min(
        state.engine.config.default_max_tokens, max(1, limit - len(prompt))
    )
    _check_context(state, len(prompt), max_tokens, bool(requested))
    stop = body.get("stop", ())
    if tool_choice == "none" and tools:
        stop = (*stop, formatter.stop_marker)
    seed = body.get("seed")
    min_tokens = body.get("min_tokens") or 0
    if min_tokens > max_tokens:
        raise bad_request("min_tokens cannot exceed max_tokens", param="min_tokens")
    constraint = constraint_for(state, body, forced)
    if forced and constraint is not None and state.engine.config.jump_forward:
        # Forced tokens are part of the reply: they count against its max_tokens (so a
        # prompt that fits without them fits with them), and need one token left after.
        ahead = _forced_ahead(state, constraint, budget=max_tokens - 1)
        if ahead:  # computed with the prompt, not a step each
            prompt = [*prompt, *ahead[0]]
            forced += ahead[1]
            max_tokens -= len(ahead[0])
            min_tokens = max(0, min_tokens - len(ahead[0]))
    params = SamplingParams(
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        temperature=body.get("temperature") if body.get("temperature") is not None else 0.0,
        top_p=body.get("top_p") if body.get("top_p") is not None else 1.0,
        seed=None if seed is None else seed % (2**63),
        stop=stop,
    )
    options = body.get("stream_options") or {}
    return PreparedChat(
        prompt=prompt,
        params=params,
        forced=forced,
        parse_tools=bool(tools) and tool_choice != "none",
        stream=body["stream"],
        include_usage=bool(options.get("include_usage")),
        salt=body.get("cache_salt"),
        logged_prompt=formatter.tokenizer.decode(prompt) if state.log_prompts else None,
        constraint=constraint,
        aliases=tool_aliases(tools or []) if constraint is not None else None,
    )


def _check_context(state: ServerState, prompt: int, max_tokens: int, requested: bool) -> None:
    try:
        state.engine.check_context(prompt, max_tokens)
    except ContextLengthError as err:
        raise APIError(
            422,
            str(err),
            param="max_tokens" if requested else "messages",
            code="context_length_exceeded",
        ) from None


def _forced_ahead(
    state: ServerState, constraint: Constraint, budget: int
) -> tuple[list[int], str] | None:
    """The tokens (and their text) the grammar forces right after the forced reply start:
    ``{"name": "`` after ``<tool_call>``, and a tool's whole name where only one is
    allowed. Consumed by ``constraint``; None when there are none, when they are more
    than ``budget``, or when their text would not be whole characters (which the reply's
    parser could not read back)."""
    tokens = constraint.forced()
    if not tokens or len(tokens) > budget:
        return None
    text = state.formatter.tokenizer.decode(tokens)
    if "\ufffd" in text:
        return None
    if not all(constraint.advance(t) for t in tokens):
        # The grammar refused what it said it forces: its state is now unknown, so the
        # request fails here rather than decoding under a half-consumed grammar.
        raise APIError(
            500,
            "internal engine error: a grammar refused its own forced tokens",
            type_="server_error",
        )
    return tokens, text


def _usage(stats: RequestStats) -> dict[str, Any]:
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.completion_tokens,
        "total_tokens": stats.prompt_tokens + stats.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.cached_tokens},
        "hearth": {
            # Received -> first token, and its parts in order (see ``RequestStats``).
            "server_ttft_ms": round(stats.server_ttft_ms, 3),
            "prepare_wait_ms": round(stats.prepare_wait_ms, 3),
            "prepare_ms": round(stats.prepare_ms, 3),
            "queue_ms": round(stats.queue_ms, 3),
            "prefill_ms": round(stats.prefill_ms, 3),
            "pin_wait_ms": round(stats.pin_wait_ms, 3),
            "ttft_ms": round(stats.ttft_ms, 3),
            "decode_tokens_per_s": round(stats.decode_tokens_per_s, 2),
            "pin": stats.pin,
        },
    }


def _event_error(event: Event) -> APIError | None:
    """The error an engine event stands for, if any.

    A cancelled request only reaches a listener when the engine cancelled it at shutdown
    (a client that went away hears nothing more): that is not a complete answer.
    """
    if isinstance(event, ErrorEvent):
        if event.status == 400:
            return APIError(400, event.message, code="invalid_request")
        if event.status == 503:  # the KV budget could not hold it (``Engine._admit``)
            return overloaded(event.message, retry_after=5)
        return APIError(500, event.message, type_="server_error", code="engine_error")
    if isinstance(event, FinishEvent) and event.reason == "cancelled":
        return overloaded("the engine is shutting down; the request was cancelled", retry_after=5)
    return None


# How often a non-streaming request checks that its client is still connected.
DISCONNECT_POLL_S = 0.5


async def _next_event(events: AsyncIterator[Event]) -> Event:
    try:
        return await anext(events)
    except StopAsyncIteration:
        raise APIError(
            500, "generation ended unexpectedly", type_="server_error", code="engine_error"
        ) from None


def _sse(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def _finish_reason(reason: str, calls: list[ToolCall]) -> str:
    if calls:
        return "tool_calls"
    return "length" if reason == "length" else "stop"


class ChatCompletion:
    """One chat completion request; ``run`` returns the HTTP response."""

    def __init__(self, state: ServerState, request: web.Request, prep: PreparedChat) -> None:
        self.state = state
        self.request = request
        self.prep = prep
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = state.engine.info.name
        # Constrained, the reply cannot hold markup outside a call: a call cut short
        # (max_tokens) is dropped, never spoken as content.
        self.splitter = StreamSplitter(
            state.formatter.tool_format, self.prep.forced, drop_broken=prep.constraint is not None
        )
        # Constrained calls are streamed name first (call_stream.py); others whole.
        self.announcer: CallAnnouncer | None = None
        if prep.parse_tools and prep.constraint is not None:
            self.announcer = CallAnnouncer(state.formatter.tool_format, dict(prep.aliases or {}))

    async def _first_event(self, events: AsyncIterator[Event]) -> Event:
        """Wait for the request's first event, or ``ConnectionResetError`` once the
        client has gone.

        ``Engine.stream`` is an async generator: it submits the request (and may refuse
        it) only when first iterated, so the refusals are mapped here, before any
        response has started. A request waits here while it is queued or prefilling,
        when nothing is written yet: the connection is watched (``run`` then cancels the
        request), or a client that left would keep its slot to the end.
        """
        try:
            return await self._next_while_connected(events)
        except QueueFullError as err:
            raise overloaded(f"the engine is busy ({err}); retry shortly") from None
        except EngineClosedError:
            raise overloaded("the engine is shutting down", retry_after=5) from None

    def _content(self, text: str) -> str:
        return self.splitter.feed(text) if self.prep.parse_tools else text

    def _finish_text(self) -> tuple[str, list[ToolCall]]:
        if not self.prep.parse_tools:
            return "", []
        content, calls = self.splitter.finish()
        aliases = self.prep.aliases or {}
        # The grammar let the model write a prefixed tool's short name: report the tool.
        calls = [
            ToolCall(aliases[c.name], c.arguments, c.id) if c.name in aliases else c for c in calls
        ]
        return content, calls

    def _log(self, stats: RequestStats, reason: str) -> None:
        _LOGGER.info(
            "chat %s: prompt=%d cached=%d%s ttft=%.0fms completion=%d finish=%s",
            self.id[-8:],
            stats.prompt_tokens,
            stats.cached_tokens,
            f" (pin {stats.pin})" if stats.pin else "",
            stats.ttft_ms,
            stats.completion_tokens,
            reason,
        )

    async def run(self) -> web.StreamResponse:
        if self.prep.logged_prompt is not None:
            _LOGGER.info("chat %s prompt: %s", self.id[-8:], self.prep.logged_prompt)
        events = self.state.engine.stream(
            self.prep.prompt,
            self.prep.params,
            salt=self.prep.salt,
            constraint=self.prep.constraint,
            stats=self.prep.stats,
        )
        try:
            first = await self._first_event(events)
            if self.prep.stream:
                return await self._stream(events, first)
            return await self._complete(events, first)
        finally:
            # Client gone, write failed or done: cancel the request now (frees its locks).
            await events.aclose()

    async def _until_finish(
        self, events: AsyncIterator[Event], event: Event
    ) -> tuple[str, FinishEvent]:
        """The content up to the finish event; raises the error an event stands for."""
        parts: list[str] = []
        while True:
            error = _event_error(event)
            if error is not None:
                raise error
            if isinstance(event, FinishEvent):
                return "".join(parts), event
            if isinstance(event, TokenEvent):
                parts.append(self._content(event.text))
            event = await self._next_while_connected(events)

    async def _next_while_connected(self, events: AsyncIterator[Event]) -> Event:
        """The next event, or ``ConnectionResetError`` once the client has gone.

        A non-streaming reply writes nothing until it is done, so nothing else notices a
        client that gave up: aiohttp's handler cancellation missed some closes under load
        (the request then decoded thousands of tokens for nobody). The transport is
        checked every ``DISCONNECT_POLL_S`` while waiting.
        """
        pending = asyncio.ensure_future(_next_event(events))
        try:
            while True:
                done, _ = await asyncio.wait({pending}, timeout=DISCONNECT_POLL_S)
                if done:
                    return pending.result()
                transport = self.request.transport
                if transport is None or transport.is_closing():
                    raise ConnectionResetError("the client closed the connection")
        finally:
            # Left early (client gone, or this handler cancelled): stop the pending read
            # before the caller closes the event stream, which must not be running then.
            if not pending.done():
                pending.cancel()
                await asyncio.wait({pending})

    async def _complete(self, events: AsyncIterator[Event], first: Event) -> web.Response:
        content, event = await self._until_finish(events, first)
        content += self._content(event.text)
        tail, calls = self._finish_text()
        content += tail
        self._log(event.stats, event.reason)
        message: dict[str, Any] = {"role": "assistant", "content": content or None}
        if calls:
            message["tool_calls"] = [c.as_openai() for c in calls]
        elif not content:
            message["content"] = ""
        return web.json_response(
            {
                "id": self.id,
                "object": "chat.completion",
                "created": self.created,
                "model": self.model,
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "logprobs": None,
                        "finish_reason": _finish_reason(event.reason, calls),
                    }
                ],
                "usage": _usage(event.stats),
            }
        )

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        return _sse(
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }
        )

    async def _stream(self, events: AsyncIterator[Event], first: Event) -> web.StreamResponse:
        # The first event came before committing to a 200: errors before any output
        # still get a proper status code.
        error = _event_error(first)
        if error is not None:
            raise error
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(self.request)
        try:
            await self._stream_events(response, events, first)
        except ConnectionResetError:
            # The client went away: nothing more can be sent. ``run`` closes the event
            # stream, which cancels the request and frees its cache locks.
            _LOGGER.debug("chat %s: client disconnected mid-stream", self.id[-8:])
        return response

    async def _stream_events(
        self, response: web.StreamResponse, events: AsyncIterator[Event], first: Event
    ) -> None:
        await response.write(self._chunk({"role": "assistant", "content": ""}))
        event = first
        while True:
            error = _event_error(event)
            if error is not None:
                await response.write(_sse(error.body()))
                break
            if isinstance(event, TokenEvent):
                text = self._content(event.text)
                if text:
                    await response.write(self._chunk({"content": text}))
                await self._stream_call_starts(response)
            elif isinstance(event, FinishEvent):
                await self._stream_finish(response, event)
                break
            try:
                event = await _next_event(events)
            except APIError as err:
                await response.write(_sse(err.body()))
                break
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()

    async def _stream_call_starts(self, response: web.StreamResponse) -> None:
        """Send the start (index, id, name) of each call whose name is now complete."""
        if self.announcer is None:
            return
        for call in self.announcer.new_calls(self.splitter.call_text):
            start = {"name": call.name, "arguments": ""}
            delta = {"index": call.index, "id": call.id, "type": "function", "function": start}
            await response.write(self._chunk({"tool_calls": [delta]}))

    async def _stream_finish(self, response: web.StreamResponse, event: FinishEvent) -> None:
        text = self._content(event.text)
        tail, calls = self._finish_text()
        if text + tail:
            await response.write(self._chunk({"content": text + tail}))
        await self._stream_call_starts(response)
        if self.announcer is not None and self.announcer.announced:
            deltas = self.announcer.deltas(calls, self.splitter.call_text)
        else:
            deltas = [c.as_openai(i) for i, c in enumerate(calls)]
        if deltas:
            await response.write(self._chunk({"tool_calls": deltas}))
        await response.write(self._chunk({}, _finish_reason(event.reason, calls)))
        if self.prep.include_usage:
            usage = {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": _usage(event.stats),
            }
            await response.write(_sse(usage))
        self._log(event.stats, event.reason)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    received = time.monotonic()
    state: ServerState = request.app[ServerState.KEY]
    body = validate(CHAT_REQUEST, await read_json(request))
    prep, timing = await state.prepare_timed(partial(_prepare, state, body), since=received)
    prep.stats.prepare_wait_ms, prep.stats.prepare_ms = timing
    return await ChatCompletion(state, request, prep).run()
