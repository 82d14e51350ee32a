"""Incremental detokenization with stop strings.

Tokens are decoded with a sliding window (``prefix_offset``/``read_offset``) so that
tokenizers which attach spaces or bytes to neighbouring tokens still produce the right
text, and a partial UTF-8 character (``\\ufffd``) is held back until it completes. Text
that could be the start of a stop string is held back too, so a stop string never
reaches the client.
"""

from __future__ import annotations

from typing import Any


class TextStream:
    def __init__(self, tokenizer: Any, stop: tuple[str, ...] = ()) -> None:
        self._tokenizer = tokenizer
        self._stop = tuple(s for s in stop if s)
        self._holdback = max((len(s) for s in self._stop), default=1) - 1
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self._text = ""  # decoded so far (before any stop string)
        self._emitted = 0  # characters of _text already returned
        self.stopped = False

    @property
    def text(self) -> str:
        return self._text

    def _decode(self, ids: list[int]) -> str:
        return str(self._tokenizer.decode(ids, skip_special_tokens=True))

    def push(self, token_id: int) -> str:
        """Add one generated token; returns newly releasable text (may be empty)."""
        if self.stopped:
            return ""
        self._ids.append(token_id)
        before = self._decode(self._ids[self._prefix_offset : self._read_offset])
        after = self._decode(self._ids[self._prefix_offset :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self._text += after[len(before) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
        return self._release(final=False)

    def _release(self, final: bool) -> str:
        if self._stop:
            start = max(0, self._emitted - self._holdback)
            cut = min(
                (i for i in (self._text.find(s, start) for s in self._stop) if i >= 0),
                default=-1,
            )
            if cut >= 0:
                self._text = self._text[:cut]
                self.stopped = True
                final = True
        end = len(self._text) if final else max(self._emitted, len(self._text) - self._holdback)
        out = self._text[self._emitted : end]
        self._emitted = end
        return out

    def finish(self) -> str:
        """Release everything still held back (call once generation ends)."""
        return self._release(final=True)
