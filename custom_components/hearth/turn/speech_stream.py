"""Speech as the engine decodes it: the part of a streamed reply that is already safe.

``speakable`` (turn/speech.py) judges a whole reply. Waiting for the whole reply costs a
spoken answer the whole decode time, so ``SpeechStream`` lets text through word by word
as soon as nothing after it can turn it into markup: it holds the word being written
(``=>`` or ``f()`` may still grow), anything after an opening quote, bracket or ``<``
that is not closed yet (a JSON key, a call, a tag), and a line that starts like a
function definition. Text before the held part is let through when everything said so
far is ``speakable``; once it is not, the stream stops for the rest of the reply (what
was said stays said, the markup is never said). What is said is ``speech.plain``: an
attribute's key or an entity id the model copied from the live context is said as words.
"""

from __future__ import annotations

import re

from .speech import plain, speakable

_PAIRS = {"(": ")", "[": "]", "<": ">", "{": "}"}
_DEFINITION = re.compile(r"\s*(def|function)\b")


def safe_end(text: str) -> int:
    """How much of ``text`` nothing written later can make markup (up to the blank
    after its last whole word: the blank goes out with the next word)."""
    end = _word_start(text, len(text))
    head = text[:end]
    if head.count('"') % 2:
        end = min(end, _word_start(text, head.rfind('"')))
    for opener, closer in _PAIRS.items():
        start = head.rfind(opener)
        if start >= 0 and head.find(closer, start) < 0:
            end = min(end, _word_start(text, start))  # ``turn_on(``: from ``turn_on``
    line = text.rfind("\n", 0, end) + 1
    if _DEFINITION.match(text, line):
        end = min(end, line)
    return end


def _word_start(text: str, end: int) -> int:
    """Where the word that ``text[:end]`` ends in starts, less the blanks before it."""
    while end > 0 and not text[end - 1].isspace():
        end -= 1
    while end > 0 and text[end - 1].isspace():
        end -= 1
    return end


class SpeechStream:
    """Feeds on the reply's text (tool markup already removed); gives what may be said
    now. ``enabled`` False: it gives nothing (the reply is judged whole at its end)."""

    def __init__(self, enabled: bool) -> None:
        self.text = ""  # everything fed so far
        self.sent = 0  # how much of it was given out
        self.stopped = not enabled
        self.plain_sent = ""  # speech.plain of what was given out (kept, not recomputed)

    def feed(self, text: str) -> str:
        """What of the reply so far may be said now (not said before)."""
        self.text += text
        if self.stopped:
            return ""
        end = safe_end(self.text)
        if end <= self.sent:
            return ""
        if not speakable(self.text[:end]):
            self.stopped = True
            return ""
        out = self._plain(end)
        if not self.text[: self.sent].strip():
            out = out.lstrip()  # a reply does not start with blanks
        self.sent = end
        return out

    def stop(self) -> None:
        """Say nothing more early (a tool call started: the rest waits for the end)."""
        self.stopped = True

    @property
    def said(self) -> bool:
        """Whether some non-blank text was given out."""
        return bool(self.text[: self.sent].strip())

    def rest(self) -> str:
        """What is left to say at the end of the reply, if the whole of it may be said
        (else nothing: the markup at its end stays unsaid)."""
        if not speakable(self.text):
            return ""
        rest = self._plain(len(self.text)).rstrip()
        return rest if self.said else rest.lstrip()

    def _plain(self, end: int) -> str:
        """What ``text[:end]`` adds to the plain reply given out so far (speech.plain:
        no attribute keys or entity ids said; both are whole words, so the plain text
        grows as the reply does)."""
        whole = plain(self.text[:end])
        added = whole[len(self.plain_sent) :]
        self.plain_sent = whole
        return added
