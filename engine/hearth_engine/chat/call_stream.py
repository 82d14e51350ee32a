"""Tool calls streamed as they are written: the name first, the arguments at the end.

OpenAI's streaming API sends a tool call in pieces: a first delta with its ``index``,
``id`` and function name, then fragments of ``arguments`` that the client concatenates.
A call's name is known a few tokens into the call, its arguments only at the end, so a
client (Home Assistant's chat log, say) learns "a call to HassTurnOn is coming" after
the name instead of after the whole call.

Only replies whose calls a grammar constrains announce early (``completions.py``): the
grammar guarantees that an announced name is one of the request's tools and that the
call completes (unless ``max_tokens`` cuts it). An unconstrained reply may turn out not
to be a call at all, so its calls are sent whole at the end, as before. A call cut short
gets the part of its arguments that was written, as OpenAI's API sends it: not a JSON
object, so no client runs the call (the finish reason is ``length``).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from .formatter import ToolCall, ToolFormat

_STRING = r'"((?:[^"\\]|\\.)*)"'
_NAME = r'\{\s*"name"\s*:\s*' + _STRING
# Where a call's name is complete: anchored at the call's start, so a "name" inside a
# call's arguments is never taken for another call.
_HERMES_NAMES = re.compile(r"<tool_call>\s*" + _NAME)
_ARGUMENTS = re.compile(r'"(?:arguments|parameters)"\s*:\s*(.*)', re.DOTALL)
_UNFINISHED = "{"  # the arguments of a cut call that wrote none: not a JSON object
_FIRST_NAME = {
    ToolFormat.LLAMA3: re.compile(r"\s*(?:<\|python_tag\|>)?\s*" + _NAME),
    ToolFormat.MISTRAL: re.compile(
        r"\s*\[TOOL_CALLS\]\s*(?:\[\s*" + _NAME + r"|([A-Za-z0-9_.\-]+)\[ARGS\])"
    ),
}


def _new_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class Announced:
    """A call whose start was sent: its index in the reply, its id and its name."""

    index: int
    id: str
    name: str
    start: int  # where the call starts in the reply's call text


@dataclass
class CallAnnouncer:
    """Finds the calls whose names are complete in a reply's call text."""

    fmt: ToolFormat
    aliases: dict[str, str] = field(default_factory=dict)  # short name -> tool name
    announced: list[Announced] = field(default_factory=list)

    def new_calls(self, call_text: str) -> list[Announced]:
        """Calls of ``call_text`` (the reply from its first call on) whose names are
        complete and were not announced yet, in order."""
        names = self._names(call_text)
        fresh = []
        for start, raw in names[len(self.announced) :]:
            try:
                name = json.loads(f'"{raw}"')
            except ValueError:
                break
            name = self.aliases.get(name, name)
            call = Announced(len(self.announced), _new_id(), name, start)
            self.announced.append(call)
            fresh.append(call)
        return fresh

    def _names(self, text: str) -> list[tuple[int, str]]:
        """(start, raw JSON string) of each call whose name is complete."""
        if self.fmt is ToolFormat.HERMES:
            return [(m.start(), m.group(1)) for m in _HERMES_NAMES.finditer(text)]
        match = _FIRST_NAME[self.fmt].match(text)
        if match is None:
            return []
        return [(0, next(g for g in match.groups() if g is not None))]

    def deltas(self, calls: list[ToolCall], call_text: str) -> list[dict[str, object]]:
        """The ``tool_calls`` deltas that complete the reply: the arguments of each
        announced call (matched in order by name), whole the calls that were not
        announced (indexes after the announced ones), and for an announced call that did
        not complete (cut short) the arguments it wrote."""
        out: list[dict[str, object]] = []
        pending = list(self.announced)
        extra = len(self.announced)
        for call in calls:
            if pending and pending[0].name == call.name:
                announced = pending.pop(0)
                out.append(_arguments(announced, call.arguments))
            else:
                out.append(call.as_openai(extra))
                extra += 1
        for cut in pending:
            after = [c.start for c in self.announced if c.start > cut.start]
            written = _ARGUMENTS.search(call_text, cut.start, min(after, default=len(call_text)))
            out.append(_arguments(cut, (written.group(1) if written else "") or _UNFINISHED))
        return out


def _arguments(call: Announced, arguments: str) -> dict[str, object]:
    return {"index": call.index, "function": {"arguments": arguments}}
