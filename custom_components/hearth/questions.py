"""Questions about the house are answered from the house: a turn that asks starts by
reading it (``GetLiveContext``), never by acting.

Home Assistant's prompt tells the model to read live context for questions about the
current state. A small model does not: it answers from nothing ("The garage door is
open."), and shown worked examples of actions (examples.py) it may act on a question
instead (measured: "Is the front door locked?" unlocked the door). For an English
question (asked with a question word, not a polite command such as "can you ..."),
the turn's first request names the live-context tool in ``tool_choice``: the engine's
grammar then lets it call only that tool, and the reply comes from its result.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from .tool_names import bare_name

LIVE_CONTEXT = "GetLiveContext"
# A sentence that starts with one of these asks about something.
QUESTION_WORDS = frozenset({
    "is", "are", "was", "were", "do", "does", "did", "has", "have",
    "what", "whats", "which", "who", "how", "hows", "when", "where", "why",
})  # fmt: skip
_FIRST_WORD = re.compile(r"[a-z]+")


# ... or asks, politely, to be told: "could you check if the light is on?"
ASKS_TO_BE_TOLD = re.compile(r"\b(check (if|whether)|tell me|let me know|do you know)\b")


def is_question(text: str, language: str) -> bool:
    """Whether ``text`` asks a question (English only; other languages: never)."""
    if not language.lower().startswith("en"):
        return False
    said = text.strip().lower().replace("'", "")
    first = _FIRST_WORD.match(said)
    return (first is not None and first.group() in QUESTION_WORDS) or bool(
        ASKS_TO_BE_TOLD.search(said)
    )


def live_context_tool(tools: Iterable[Mapping[str, Any]]) -> str | None:
    """The offered live-context tool's full name (``homeassistant__GetLiveContext``)."""
    for tool in tools:
        name = str((tool.get("function") or {}).get("name", ""))
        if bare_name(name) == LIVE_CONTEXT:
            return name
    return None
