"""Chat templates and tool calls.

OpenAI messages in, prompt text out; model text in, tool calls out.

Three tool-call conventions are understood, chosen from the chat template:

* **Hermes** (Qwen2.5, Hermes, Hearth's own template):
  ``<tool_call>{"name", "arguments"}</tool_call>``;
* **Llama 3**: the reply is a JSON object ``{"name", "parameters"}``, perhaps after
  ``<|python_tag|>``;
* **Mistral**: ``[TOOL_CALLS][{"name", "arguments"}, ...]`` or ``[TOOL_CALLS]name[ARGS]{...}``.

Text that looks like a tool call but does not parse is returned as content, never dropped.
"""

from __future__ import annotations

import copy
import enum
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jinja2 import TemplateError

from .control_tokens import ControlTokens


class ChatTemplateError(ValueError):
    """The chat template refused the messages (for example an unsupported role order)."""


class ToolFormat(enum.Enum):
    HERMES = "hermes"
    LLAMA3 = "llama3"
    MISTRAL = "mistral"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as in OpenAI's API
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def as_openai(self, index: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        if index is not None:
            out["index"] = index
        return out


def detect_tool_format(template: str) -> ToolFormat:
    if "[TOOL_CALLS]" in template:
        return ToolFormat.MISTRAL
    if "<tool_call>" in template:
        return ToolFormat.HERMES
    if "<|python_tag|>" in template or "ipython" in template:
        return ToolFormat.LLAMA3
    return ToolFormat.HERMES


_MARKERS = {
    ToolFormat.HERMES: "<tool_call>",
    ToolFormat.MISTRAL: "[TOOL_CALLS]",
    ToolFormat.LLAMA3: "<|python_tag|>",
}
_HERMES_RE = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_MISTRAL_ARGS_RE = re.compile(r"\s*([A-Za-z0-9_.\-]+)\[ARGS\]", re.DOTALL)


def _call_from_obj(obj: Any) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return ToolCall(obj["name"], args)
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


def _json_values(text: str) -> list[Any] | None:
    """All JSON values in ``text`` separated by whitespace or ``;``; None if anything else."""
    decoder = json.JSONDecoder()
    out: list[Any] = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " \t\r\n;":
            i += 1
        if i >= n:
            break
        try:
            value, i = decoder.raw_decode(text, i)
        except ValueError:
            return None
        out.append(value)
    return out


def parse_tool_calls(text: str, fmt: ToolFormat) -> tuple[str, list[ToolCall]]:
    """Split model output into content and tool calls."""
    if fmt is ToolFormat.HERMES:
        start = text.find("<tool_call>")
        if start < 0:
            return text, []
        calls = []
        for body in _HERMES_RE.findall(text[start:]):
            values = _json_values(body)
            parsed = [_call_from_obj(v) for v in values] if values else [None]
            if any(c is None for c in parsed):
                return text, []
            calls.extend(c for c in parsed if c is not None)
        return text[:start].rstrip(), calls
    if fmt is ToolFormat.MISTRAL:
        start = text.find("[TOOL_CALLS]")
        if start < 0:
            return text, []
        rest = text[start + len("[TOOL_CALLS]") :]
        values = _json_values(rest)
        calls: list[ToolCall | None] = []
        if values and len(values) == 1 and isinstance(values[0], list):
            calls = [_call_from_obj(v) for v in values[0]]
        else:
            for chunk in rest.split("[TOOL_CALLS]"):
                m = _MISTRAL_ARGS_RE.match(chunk)
                args = _json_values(chunk[m.end() :]) if m else None
                calls.append(
                    _call_from_obj({"name": m.group(1), "arguments": args[0]})
                    if m and args
                    else None
                )
        if not calls or any(c is None for c in calls):
            return text, []
        return text[:start].rstrip(), [c for c in calls if c is not None]
    body = text.replace("<|python_tag|>", "").strip()
    if not body.startswith("{"):
        return text, []
    values = _json_values(body)
    parsed = [_call_from_obj(v) for v in values] if values else []
    if not parsed or any(c is None for c in parsed):
        return text, []
    return "", [c for c in parsed if c is not None]


class StreamSplitter:
    """Streams content deltas and holds back anything that may be a tool call.

    ``feed`` returns text that is safe to send as content now. ``finish`` returns the
    remaining content and the parsed tool calls.
    """

    def __init__(self, fmt: ToolFormat, prefix: str = "", *, drop_broken: bool = False) -> None:
        self.fmt = fmt
        self.marker = _MARKERS[fmt]
        self._text = prefix
        self._sent = 0
        self._in_call = bool(prefix)
        # A call that does not parse is dropped instead of returned as content (for
        # constrained replies, where only a call cut short by max_tokens can be broken).
        self._drop_broken = drop_broken

    def feed(self, delta: str) -> str:
        self._text += delta
        if self._in_call:
            return ""
        if self.fmt is ToolFormat.LLAMA3 and not self._text[self._sent :].strip():
            return ""
        if (
            self.fmt is ToolFormat.LLAMA3
            and self._sent == 0
            and self._text.lstrip().startswith("{")
        ):
            self._in_call = True
            return ""
        found = self._text.find(self.marker, self._sent)
        if found >= 0:
            self._in_call = True
            out = self._text[self._sent : found]
            self._sent = found
            return out
        # Hold back a tail that could be the start of the marker.
        keep = 0
        for k in range(min(len(self.marker) - 1, len(self._text) - self._sent), 0, -1):
            if self.marker.startswith(self._text[-k:]):
                keep = k
                break
        end = len(self._text) - keep
        out = self._text[self._sent : end]
        self._sent = end
        return out

    @property
    def call_text(self) -> str:
        """The reply from its first tool call on, so far ("" before any call)."""
        return self._text[self._sent :] if self._in_call else ""

    def finish(self) -> tuple[str, list[ToolCall]]:
        content, calls = parse_tool_calls(self._text, self.fmt)
        if calls:
            return content[self._sent :] if len(content) > self._sent else "", calls
        if self._drop_broken and self._in_call:
            return "", []
        return self._text[self._sent :], []


def _text_content(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") in ("text", "input_text"):
                parts.append(str(part.get("text", "")))
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    return str(content)


def _template_tool_call(call: dict[str, Any]) -> dict[str, Any]:
    fn = dict(call.get("function") or {})
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            fn["arguments"] = json.loads(args)
        except ValueError:
            fn["arguments"] = args
    return {"id": call.get("id"), "type": "function", "function": fn}


def _same(value: Any) -> Any:
    return value


def normalize_messages(
    messages: list[dict[str, Any]], escape: Callable[[Any], Any] = _same
) -> list[dict[str, Any]]:
    """OpenAI messages → what HF chat templates expect (string content, dict arguments).

    ``escape`` is applied to every value that comes from the client (a
    ``ControlTokens.escape_value``): contents, names, ids, tool calls.
    """
    out = []
    for message in messages:
        item: dict[str, Any] = {
            "role": message["role"],
            "content": escape(_text_content(message.get("content"))),
        }
        if message.get("tool_calls"):
            item["tool_calls"] = [escape(_template_tool_call(c)) for c in message["tool_calls"]]
        if message.get("tool_call_id"):
            item["tool_call_id"] = escape(message["tool_call_id"])
        if message.get("name"):
            item["name"] = escape(message["name"])
        out.append(item)
    return out


class ChatFormatter:
    """Renders messages with the tokenizer's chat template and encodes them.

    The formatter works on its own copy of the tokenizer. The engine worker decodes
    generated tokens with the model's tokenizer while the server encodes the next
    request, and a Rust fast tokenizer used from two threads at once can fail with
    "Already borrowed" (transformers 5 reconfigures it in place on encode). A private
    copy shares nothing with the worker's.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = copy.deepcopy(tokenizer)
        self.template = str(tokenizer.chat_template or "")
        self.tool_format = detect_tool_format(self.template)
        self.control = ControlTokens(self.tokenizer, self.template)

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        house: str | None = None,
    ) -> str:
        """The template's text of ``messages`` and ``tools``. ``house``: its text of the
        first message and the tools, rendered before, for a template that writes it in
        their place (templates.HERMES_CHATML_TEMPLATE's ``hearth_house``); neither is
        then rendered again (server/prompts.py checks the text is the same)."""
        extra: dict[str, Any] = {}
        if house is not None:
            messages = [{"role": messages[0]["role"], "content": ""}, *messages[1:]]
            tools, extra = None, {"hearth_house": house}
        try:
            # Text is text: nothing a client sends becomes a control token.
            escape = self.control.escape_value
            text = self.tokenizer.apply_chat_template(
                normalize_messages(messages, escape),
                tools=escape(tools) or None,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **extra,
            )
        except (TemplateError, ValueError, TypeError, KeyError, AttributeError) as err:
            message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ChatTemplateError(f"the chat template rejected the messages: {message}") from None
        return str(text)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    @property
    def stop_marker(self) -> str:
        """Text that starts a tool call (a stop string when ``tool_choice`` is ``none``)."""
        return _MARKERS[self.tool_format]

    def forced_prefix(self, tool_choice: Any) -> str:
        """Text appended after the generation prompt to force a tool call."""
        if self.tool_format is not ToolFormat.HERMES:
            return ""
        if tool_choice == "required" or (
            isinstance(tool_choice, dict)
            and tool_choice.get("type") == "allowed_tools"
            and tool_choice["allowed_tools"].get("mode") == "required"
        ):
            return "<tool_call>\n"
        if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
            name = (tool_choice.get("function") or {}).get("name")
            if isinstance(name, str) and name:
                # No space after the colon: BPE splits `": {"` as `":` + ` {"`, so a
                # forced trailing space would be a token boundary the model never saw.
                return f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments":'
        return ""
