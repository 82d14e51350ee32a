"""Invalid tool calls, read from what the engine really answered Home Assistant.

The benchmark puts a recording proxy between Home Assistant and the engine, so it sees
each chat request of a turn (with the tools offered) and the engine's reply (streamed or
not). A turn has an **invalid tool call** when a reply of the engine

* calls a tool that was not offered (the plugin's bare-name rule applies: ``HassTurnOn``
  means the only offered ``..__HassTurnOn``), or with arguments that are not a JSON
  object; or
* writes a tool call as text instead of calling the tool: tool-call markup
  (``<tool_call>``, ``[TOOL_CALLS]``...) or a bare JSON call (an object with a ``name``
  and ``arguments`` or ``parameters``). Such a call never reaches Home Assistant.

What Home Assistant **reported** of a turn's calls (the targets it says it acted on, and
its speech) is read from the same tool results (harm.py counts a reply that
claims more).

A call the agent **did not run** (it refused it: its tool result is the agent's
``NotRequested`` error, turn/stream.py) changed nothing: the judge and the harm counts
read only the calls that ran. Where a turn ended before that result was sent back, the
bench cannot tell, and counts the call as run.

Separately, a call is **rejected** when Home Assistant answered it with an error (the
tool result sent back in the next request has an ``error``, is an intent error, or lists
``failed`` targets: no entity matched, a service the entity lacks...). Those calls are
well formed; the values were wrong for the house.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

MARKUP = ("<tool_call>", "<tool_response>", "[TOOL_CALLS]", "<|python_tag|>", "<function=")
# The error of the tool result the Hearth agent sends back for a call it did not run.
NOT_RUN = "NotRequested"
_JSON_NAME = re.compile(r'"name"\s*:')
_JSON_ARGS = re.compile(r'"(arguments|parameters)"\s*:')


@dataclass
class EngineReply:
    """One reply of the engine: its text and its tool calls (name, raw arguments), with
    their ids (``ids[i]`` of ``calls[i]``; "" where the reply gave none)."""

    content: str = ""
    calls: list[tuple[str, str]] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)


def parse_reply(raw: bytes) -> EngineReply:
    """A chat completion, streamed (server-sent events) or whole, as text and calls."""
    reply = EngineReply()
    text = raw.decode("utf-8", errors="replace").strip()
    if text.startswith("{"):
        message = (json.loads(text).get("choices") or [{}])[0].get("message") or {}
        reply.content = message.get("content") or ""
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            reply.calls.append((function.get("name") or "", _text(function.get("arguments"))))
            reply.ids.append(str(call.get("id") or ""))
        return reply
    calls: dict[int, list[str]] = {}  # index -> name, arguments, id
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        for choice in json.loads(line[5:]).get("choices") or ():
            delta = choice.get("delta") or {}
            reply.content += delta.get("content") or ""
            for call in delta.get("tool_calls") or ():
                entry = calls.setdefault(int(call.get("index", len(calls))), ["", "", ""])
                function = call.get("function") or {}
                entry[0] += function.get("name") or ""
                entry[1] += _text(function.get("arguments"))
                entry[2] = entry[2] or str(call.get("id") or "")
    reply.calls = [(calls[i][0], calls[i][1]) for i in sorted(calls)]
    reply.ids = [calls[i][2] for i in sorted(calls)]
    return reply


def _text(arguments: Any) -> str:
    if arguments is None:
        return ""
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def offered_tools(body: Mapping[str, Any]) -> list[str]:
    return [str((tool.get("function") or {}).get("name")) for tool in body.get("tools") or ()]


def known_tool(name: str, offered: list[str]) -> bool:
    """Offered by name, or by the unique ``__name`` suffix the plugin resolves."""
    return name in offered or sum(tool.endswith(f"__{name}") for tool in offered) == 1


def runnable(arguments: str) -> bool:
    """Whether a call's arguments are a JSON object: others are never run."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return False
    return isinstance(value, dict)


def invalid_calls(body: Mapping[str, Any], reply: EngineReply) -> list[str]:
    """Why each call of ``reply`` to the request ``body`` is invalid (empty: all valid)."""
    offered = offered_tools(body)
    problems = []
    for name, arguments in reply.calls:
        if not known_tool(name, offered):
            problems.append(f"unknown tool {name!r}")
            continue
        if not runnable(arguments):
            problems.append(f"{name}: arguments are not a JSON object")
    if any(tag in reply.content for tag in MARKUP):
        problems.append("tool-call markup written as text")
    elif _JSON_NAME.search(reply.content) and _JSON_ARGS.search(reply.content):
        problems.append("tool call written as JSON text")
    return problems


def _tool_error(result: Any) -> str | None:
    """What went wrong in a tool result: an exception, or an intent that failed."""
    if not isinstance(result, dict):
        return None
    if "error" in result:
        return f"{result['error']}: {result.get('error_text', '')}"
    if result.get("response_type") == "error":
        return f"intent error: {(result.get('data') or {}).get('code', '')}"
    if failed := (result.get("data") or {}).get("failed"):
        return f"failed on {[item.get('id', item) for item in failed]}"
    return None


def not_run(bodies: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """The ids of the calls the agent did not run (their tool result is its refusal)."""
    return frozenset(
        call_id
        for call_id, result in _results(bodies).items()
        if isinstance(result, dict) and result.get("error") == NOT_RUN
    )


def rejected_calls(bodies: Iterable[Mapping[str, Any]]) -> list[str]:
    """Tool results with an error that the turn's requests sent back to the engine."""
    results = _results(bodies).items()
    return [problem for _, result in results if (problem := _tool_error(result))]


@dataclass(frozen=True)
class Reported:
    """What Home Assistant answered a turn's calls: the targets it reported done, and
    the speech of each answer (its own words for what happened or failed)."""

    done: tuple[str, ...] = ()
    speech: tuple[str, ...] = ()


def _results(bodies: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Each tool result the turn's requests sent back, by call id (the last copy).

    Only what follows a request's last user message: the worked examples and the
    history before it hold tool results of other turns."""
    found: dict[str, Any] = {}
    for body in bodies:
        messages = list(body.get("messages") or ())
        users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        for message in messages[users[-1] + 1 if users else 0 :]:
            if message.get("role") != "tool":
                continue
            try:
                found[str(message.get("tool_call_id"))] = json.loads(
                    message.get("content") or "null"
                )
            except ValueError:
                continue
    return found


def reported_results(bodies: Iterable[Mapping[str, Any]]) -> Reported:
    """The targets Home Assistant reported done (``data.success`` of an action, not of
    an answer: ``response_type``) and its speech, in
    the tool results of the turn's requests. The last reply of a turn is sent back to
    no one: a call in it is not read here."""
    done: list[str] = []
    speech: list[str] = []
    for result in _results(bodies).values():
        if not isinstance(result, dict):
            continue
        data = result.get("data") if isinstance(result.get("data"), dict) else {}
        # An answer's ``success`` is what it read, not what it did.
        acted = result.get("response_type", "action_done") == "action_done"
        for item in data.get("success") or () if acted else ():
            done.append(
                str(item.get("id") or item.get("name")) if isinstance(item, dict) else str(item)
            )
        plain = (
            ((result.get("speech") or {}).get("plain") or {})
            if isinstance(result.get("speech"), dict)
            else {}
        )
        if text := str(plain.get("speech") or "").strip():
            speech.append(text)
    return Reported(tuple(done), tuple(speech))
