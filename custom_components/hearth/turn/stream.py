"""One streamed reply of the engine as chat log deltas: its words, its tool calls.

``transform_stream`` reads the turn (turn/prepare.py). Words are spoken only if they are
speech (turn/speech.py: no tool markup, code, JSON or HTML); otherwise the turn says its
``fallback`` (None: the reply is not speech, such as an AI Task's structured data, and
is kept). Where the turn is ``early`` (an answer or a question, not a command) and no
failure is to be reported, they reach the chat log as they are decoded, as far as
nothing after them can make them markup (turn/speech_stream.py), until a tool call
starts; otherwise they are held to the end of the reply, so that a command ends with
what Home Assistant reports and nothing said before it contradicts it.
A call the turn already made (same tool, same arguments: small models repeat
themselves, adding the same item ten times) is not run again; when nothing new is left,
the reply is what Home Assistant ``Reported`` of the last calls. After calls that
failed, words that do not ask the user anything (``Turn.asks``) are what Home Assistant
says of the failure, never the model's own "Done.". A call the turn refuses
(``Turn.refusal``, turn/call.py) is not run; the others' arguments pass through
``Turn.resolve`` (a shared name gets what tells its things apart, an area-wide on/off
call keeps to the domains the request named) before Home Assistant runs them; the raw
call goes to the history unchanged.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from homeassistant.components import conversation
from homeassistant.helpers import llm
from homeassistant.util.ulid import ulid_now

from ..backend.api import RequestUsage
from .prompt import HearthNative
from .speech import MarkupFilter, plain, speakable
from .speech_stream import SpeechStream

if TYPE_CHECKING:
    from .prepare import Turn
    from .refusal import Refusal


@dataclass(frozen=True, slots=True)
class Reported:
    """What Home Assistant reported of the turn's calls before a request: ``done``,
    what the turn says of them (turn/speak.py; None: nothing); ``failed``, what it
    says where some failed (None: none failed)."""

    done: str | None = None
    failed: str | None = None


@dataclass
class Reply:
    """What one streamed engine reply carried besides the deltas."""

    started: float = field(default_factory=time.monotonic)
    content: str = ""
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    raw_usage: Mapping[str, Any] | None = None
    timings: Mapping[str, Any] | None = None  # llama.cpp's per-request figures
    finish_reason: str | None = None
    client_ttft_ms: float | None = None
    first_speech_ms: float | None = None  # when its first word reached the chat log
    repeated: bool = False  # it only repeated calls the turn had made
    # Where the turn refused every call it made, each for doing another thing than the
    # request reads as: why (guard.Refusal: what it reads as instead); a retry may call that.
    refused: tuple[Refusal, ...] = ()

    def first_output(self) -> None:
        if self.client_ttft_ms is None:
            self.client_ttft_ms = round((time.monotonic() - self.started) * 1000, 3)

    def first_speech(self) -> None:
        if self.first_speech_ms is None:
            self.first_speech_ms = round((time.monotonic() - self.started) * 1000, 3)

    def add_tool_call_delta(self, delta: Mapping[str, Any]) -> None:
        """Merge a (possibly partial, OpenAI-style) tool call delta by index."""
        index = int(delta.get("index", len(self.tool_calls)))
        call = self.tool_calls.setdefault(
            index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
        )
        if delta.get("id"):
            call["id"] = str(delta["id"])
        function = delta.get("function") or {}
        if name := function.get("name"):
            call["function"]["name"] += str(name)
        if (arguments := function.get("arguments")) is not None:
            call["function"]["arguments"] += (
                arguments if isinstance(arguments, str) else json.dumps(arguments)
            )

    @property
    def usage(self) -> RequestUsage | None:
        """What the server reported of this request (None: no ``usage`` was sent)."""
        if self.raw_usage is None:
            return None
        return RequestUsage.from_usage(self.raw_usage, self.timings, self.client_ttft_ms)

    def raw_tool_calls(self) -> list[dict[str, Any]]:
        calls = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        for call in calls:
            call["id"] = call["id"] or f"call_{ulid_now()}"
        return calls


def resolve_tool_name(name: str, available: list[str]) -> str:
    """The HA tool a model means.

    HA namespaces tools (``intent__HassTurnOn``); small models often call the bare
    intent name (``HassTurnOn``). An exact match wins, then a unique ``__`` suffix
    match; otherwise the name is passed through (HA answers "tool not found").
    """
    if name in available:
        return name
    matches = [tool for tool in available if tool.endswith(f"__{name}")]
    return matches[0] if len(matches) == 1 else name


def parse_tool_args(arguments: str) -> dict[str, Any] | None:
    """Tool arguments (a JSON string) as a dict, without empty values; None when they
    are not a JSON object (the call then gets a tool error, see ``invalid_args_result``).

    Small models add empty optional arguments that make intent matching fail.
    """
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    return {k: v for k, v in value.items() if v is not None and v != ""}


def invalid_args_result(call: Mapping[str, Any]) -> conversation.ToolResultContentDeltaDict:
    """The tool result of a call whose arguments are not a JSON object: the tool is not
    run (HA would run it with no arguments); the model reads why and may call again."""
    function = call["function"]
    text = (
        f"The arguments of {function['name']} were not valid JSON (a JSON object was "
        f"expected): {function['arguments']!r}"
    )
    return refused_result(call, "InvalidToolArguments", text)


def refused_result(
    call: Mapping[str, Any], error: str, text: str
) -> conversation.ToolResultContentDeltaDict:
    """The tool result of a call that was not run: ``error`` and why (``text``)."""
    return {
        "role": "tool_result",
        "tool_call_id": call["id"],
        "tool_name": call["function"]["name"],
        "result": llm.ToolResult(data={"error": error, "error_text": text}, error=True),
    }


def call_key(call: Mapping[str, Any]) -> str:
    """A tool call's identity within a turn: its name and its parsed arguments (the
    raw text where they are not valid)."""
    function = call["function"]
    arguments = parse_tool_args(function["arguments"])
    key = function["arguments"] if arguments is None else arguments
    return json.dumps([function["name"], key], sort_keys=True, default=str)


async def transform_stream(
    chunks: AsyncGenerator[dict[str, Any]],
    reply: Reply,
    turn: Turn,
    *,
    seen_calls: set[str],
    context: str | None = None,
    reported: Reported | None = None,
) -> AsyncGenerator[
    conversation.AssistantContentDeltaDict | conversation.ToolResultContentDeltaDict
]:
    """Engine chunks of one request of ``turn`` as chat log deltas; the raw message
    ends up in ``native`` (with ``context``, the turn's context message, on its first
    request). ``seen_calls``: the calls the turn made (call_key), updated here;
    ``reported``: what HA reported of the calls before (None: none)."""
    reported = reported or Reported()
    fallback, instead = turn.fallback, reported.failed
    repeat_speech = reported.done or instead
    early = turn.early
    speech = MarkupFilter()
    said: list[str] = []
    spoken = SpeechStream(early and fallback is not None and instead is None)
    yield {"role": "assistant"}
    async with aclosing(chunks):
        async for chunk in chunks:
            if usage := chunk.get("usage"):
                reply.raw_usage = usage
            if timings := chunk.get("timings"):
                reply.timings = timings
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                if text := delta.get("content"):
                    reply.first_output()
                    reply.content += text
                    said.append(speech.feed(text))
                    if now := spoken.feed(said[-1]):
                        reply.first_speech()
                        yield {"content": now}
                for call in delta.get("tool_calls") or ():
                    reply.first_output()
                    reply.add_tool_call_delta(call)
                    spoken.stop()
                if finish := choice.get("finish_reason"):
                    reply.finish_reason = finish
    said.append(speech.finish())
    spoken.feed(said[-1])
    made = reply.raw_tool_calls()
    raw_calls = [call for call in made if call_key(call) not in seen_calls]
    seen_calls.update(call_key(call) for call in raw_calls)
    reply.repeated = bool(made) and not raw_calls
    text = "".join(said)
    if fallback is None:  # not speech (an AI Task's structured reply): as written
        text = "" if reply.repeated else text
    elif reply.repeated:
        text = repeat_speech or fallback
        reply.content += text
    elif not speakable(text):
        text = "" if raw_calls else fallback
    elif not raw_calls and not text.strip():
        text = fallback  # nothing to say (or only markup): never silence
    elif not raw_calls and instead and not turn.asks(text):
        text = instead  # after an error, what went wrong; a question for the user stays
    if fallback is not None:
        text = plain(text)  # no attribute key or entity id is said (speech.plain)
    if spoken.said:  # the start was said already: only what may follow it
        text = f" {text}" if reply.repeated else spoken.rest()  # HA's report of the calls
        if text.strip():
            yield {"content": text.rstrip()}
    elif text.strip():
        reply.first_speech()
        yield {"content": text.strip()}
    refused: list[conversation.ToolResultContentDeltaDict] = []
    if raw_calls:
        tool_inputs = []
        wanted: list[Refusal | None] = []  # of each refused call: what to call instead
        for call in raw_calls:
            name = call["function"]["name"]
            arguments = parse_tool_args(call["function"]["arguments"])
            why = None if arguments is None else turn.refusal(name, arguments)
            if arguments is None or why is not None:
                refused.append(
                    invalid_args_result(call)
                    if why is None
                    else refused_result(call, "NotRequested", why.why)
                )
                wanted.append(why)
                # Not run by the chat log (external): its result is the error below.
                tool_inputs.append(
                    llm.ToolInput(tool_name=name, tool_args={}, id=call["id"], external=True)
                )
                continue
            tool_inputs.append(
                llm.ToolInput(
                    tool_name=resolve_tool_name(name, list(turn.tool_names)),
                    tool_args=turn.resolve(name, arguments),
                    id=call["id"],
                )
            )
        if len(wanted) == len(raw_calls) and all(why and why.instead for why in wanted):
            reply.refused = tuple(why for why in wanted if why)
        yield {"tool_calls": tool_inputs}
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if raw_calls:
        message["tool_calls"] = raw_calls
    yield {"native": HearthNative(context=context, message=message)}
    for result in refused:
        yield result
