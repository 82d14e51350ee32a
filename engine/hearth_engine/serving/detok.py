"""Incremental detokenization with stop strings.

Token ids are turned into text by ``tokenizers.decoders.DecodeStream``: it keeps the
sliding window that tokenizers attaching spaces or bytes to neighbouring tokens need,
and holds back a partial UTF-8 character (byte-fallback or byte-level pieces) until it
completes. Special tokens are skipped. On top of that, text that could be the start of a
stop string is held back, so a stop string never reaches the client.

A ``TextStream`` belongs to the thread that pushes tokens into it (the engine worker). The
tokenizer it decodes with must not be used by another thread at the same time: a Rust
tokenizer raises "Already borrowed" when two threads use it at once (the server encodes
with its own copy, see ``chat.ChatFormatter``).
"""

from __future__ import annotations

from typing import Any

from tokenizers.decoders import DecodeStream


class TextStream:
    def __init__(self, tokenizer: Any, stop: tuple[str, ...] = ()) -> None:
        # The Rust tokenizer behind a transformers fast tokenizer (what DecodeStream needs).
        self._backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
        self._decoder = DecodeStream(skip_special_tokens=True)
        self._stop = tuple(s for s in stop if s)
        self._holdback = max((len(s) for s in self._stop), default=1) - 1
        self._text = ""  # decoded so far (before any stop string)
        self._emitted = 0  # characters of _text already returned
        self.stopped = False

    @property
    def text(self) -> str:
        return self._text

    def push(self, token_id: int) -> str:
        """Add one generated token; returns newly releasable text (may be empty)."""
        if self.stopped:
            return ""
        chunk = self._decoder.step(self._backend, token_id)
        if chunk:
            self._text += chunk
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
        """Release everything still held back (call once generation ends).

        An incomplete UTF-8 character left at the end (generation stopped in the middle
        of one) is dropped, as before: it has no text yet.
        """
        return self._release(final=True)
