"""What may be spoken: tool-call markup never reaches text-to-speech.

A model that writes a tool call (or a fake tool response) as text instead of calling the
tool would otherwise have Assist read ``<tool_call> {"name": ...`` aloud. The engine's
grammar prevents this for Hermes-style models; Llama 3 and Mistral formats, and other
OpenAI-compatible servers, are not constrained. ``MarkupFilter`` removes such markup from
the streamed reply (the raw text still goes into the conversation history, so the
engine's cache keeps matching it).

A reply that is not a spoken sentence at all (a fenced code block, a function written
out, JSON, HTML or any other markup: "The function to close the irrigation valve is:
```function close_irrigation_valve() {...```") is not spoken either: ``speakable``
says whether a whole reply may be, and the turn says something else in its place.
"""

from __future__ import annotations

import re

from homeassistant.const import Platform

# opener -> what ends the markup: a closing tag, None (the rest of the reply), or ""
# (the tag alone: a stray closer).
MARKUP: dict[str, str | None] = {
    "<tool_call>": "</tool_call>",
    "<tool_response>": "</tool_response>",
    "</tool_call>": "",
    "</tool_response>": "",
    "[TOOL_CALLS]": None,
    "<|python_tag|>": None,
}


def _partial_suffix(text: str, tags: list[str]) -> int:
    """Length of the longest end of ``text`` that could begin one of ``tags``."""
    best = 0
    for tag in tags:
        for size in range(min(len(tag) - 1, len(text)), best, -1):
            if tag.startswith(text[-size:]):
                best = size
                break
    return best


class MarkupFilter:
    """Streams text through, dropping tool markup; splits across chunks are handled."""

    def __init__(self) -> None:
        self._held = ""  # text that may be the start of a tag
        self._until: str | None = ""  # "" outside markup; a closer, or None (to the end)
        self.removed = False  # some markup was dropped
        self.spoken = False  # some non-blank text was let through

    def feed(self, text: str) -> str:
        """The part of ``text`` that may be spoken now."""
        buf, self._held = self._held + text, ""
        out: list[str] = []
        while buf:
            if self._until is None:  # inside markup that runs to the end
                return self._spoken(out)
            if self._until:  # inside a block: skip to its closer
                end = buf.find(self._until)
                if end < 0:
                    self._held = buf[len(buf) - _partial_suffix(buf, [self._until]) :]
                    return self._spoken(out)
                buf, self._until = buf[end + len(self._until) :], ""
                continue
            hits = [(buf.find(tag), tag) for tag in MARKUP if tag in buf]
            if hits:
                start, tag = min(hits)
                out.append(buf[:start])
                buf, self._until = buf[start + len(tag) :], MARKUP[tag]
                self.removed = True
                continue
            keep = _partial_suffix(buf, list(MARKUP))
            out.append(buf[: len(buf) - keep])
            self._held = buf[len(buf) - keep :]
            break
        return self._spoken(out)

    def finish(self) -> str:
        """What is left at the end (held text that never became a tag)."""
        held, self._held = self._held, ""
        return self._spoken([held]) if self._until == "" else ""

    def _spoken(self, parts: list[str]) -> str:
        text = "".join(parts)
        if text.strip():
            self.spoken = True
        return text


# What no spoken sentence holds: fences and backticks, braces, tags (<b>, </div>, <br/>,
# <|eot_id|>), bracketed control words ([TOOL_CALLS]), a JSON key, a call written as
# code (``turn_on(name="x")``, ``f()``), a function definition, arrows and ``::``.
_NOT_SPOKEN = re.compile(
    r"""`|[{}]|</?[A-Za-z|!?][^<>]*>|\[[A-Z_]{3,}\]|"[^"]*"\s*:|=>|->|::|"""
    r"""\b\w+\([^()]*[="']|\w\(\)|;\s*$|^\s*(def|function)\s+\w+\s*\(""",
    re.MULTILINE,
)


def speakable(text: str) -> bool:
    """Whether a whole reply may be spoken: it holds no code, JSON, HTML or tool
    markup (see ``_NOT_SPOKEN``)."""
    return not _NOT_SPOKEN.search(text) and not any(tag in text for tag in MARKUP)


# A live-context entry's attributes as the model may copy them ("off (brightness: 178,
# brightness_pct: 70)"): a parenthesis of ``key: value`` pairs.
_ATTRIBUTES = re.compile(r"\(([a-z][a-z0-9]*(?:_[a-z0-9]+)*: [^()]*)\)")
_PAIR = re.compile(r"\b([a-z][a-z0-9]*(?:_[a-z0-9]+)+|[a-z][a-z0-9]*): ")
# An entity id of one of Home Assistant's entity domains ("light.kitchen_lamp").
_ENTITY_ID = re.compile(
    rf"\b(?:{'|'.join(sorted((str(p) for p in Platform), key=len, reverse=True))})"
    r"\.([a-z0-9]+(?:_[a-z0-9]+)*)\b"
)


def plain(text: str) -> str:
    """``text`` as words, not Home Assistant's identifiers: an attribute's key is said
    as its words ("current temperature 19" for ``current_temperature: 19``) and an
    entity id as its object id's words ("kitchen lamp" for ``light.kitchen_lamp``).
    Whole words only, so a prefix of a reply cut after a whole word gives a prefix of
    the plain reply (the stream says it as it comes)."""
    text = _ATTRIBUTES.sub(lambda m: f"({_PAIR.sub(_words_of_key, m.group(1))})", text)
    return _ENTITY_ID.sub(lambda m: m.group(1).replace("_", " "), text)


def _words_of_key(match: re.Match[str]) -> str:
    return f"{match.group(1).replace('_', ' ')} "
