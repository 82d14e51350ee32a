"""Text is text: message text never turns into the chat template's control tokens.

A chat template renders messages into one string, and the tokenizer then splits out
every added token it finds, wherever it came from. A user message, an entity name, a
tool result or a tool argument holding ``<|im_end|>\\n<|im_start|>system`` would become a
real turn: anyone who can put text in front of the model (a notification read by an
automation, a calendar entry, a device name) could forge roles and tool results.

``ControlTokens`` knows the strings that would become control tokens: every special
added token of the tokenizer, and every other added token that the chat template itself
writes (``<tool_call>``, ``[TOOL_CALLS]``, ...). ``escape`` breaks each occurrence in
untrusted text with a zero-width space after its first character, so the tokenizer sees
ordinary characters: the model reads what was written (the text looks the same), never
the control token. Text without such strings is returned unchanged, so prompts (and the
prefix cache) are byte-identical to before for ordinary text.
"""

from __future__ import annotations

import re
from typing import Any

ZERO_WIDTH_SPACE = "\u200b"


class ControlTokens:
    def __init__(self, tokenizer: Any, template: str) -> None:
        strings: set[str] = set()
        for token in getattr(tokenizer, "added_tokens_decoder", {}).values():
            content = str(getattr(token, "content", token))
            if len(content) < 2:
                continue  # one character cannot be broken up (and is no marker)
            if getattr(token, "special", False) or content in template:
                strings.add(content)
        for content in getattr(tokenizer, "all_special_tokens", []) or []:
            if len(str(content)) >= 2:
                strings.add(str(content))
        self.strings = frozenset(strings)
        # Longest first: a token that contains another is matched whole.
        ordered = sorted(self.strings, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def escape(self, text: str) -> str:
        """``text`` with every control-token string broken up (unchanged if none)."""
        if self._pattern is None:
            return text
        return self._pattern.sub(_break, text)

    def escape_value(self, value: Any) -> Any:
        """``value`` (JSON-like: str, list, dict) with every string escaped, keys too."""
        if isinstance(value, str):
            return self.escape(value)
        if isinstance(value, list | tuple):
            return [self.escape_value(v) for v in value]
        if isinstance(value, dict):
            return {self.escape_value(k): self.escape_value(v) for k, v in value.items()}
        return value


def _break(match: re.Match[str]) -> str:
    text = match.group()
    return text[0] + ZERO_WIDTH_SPACE + text[1:]
