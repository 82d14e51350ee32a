"""The house prefix as a value: its messages, tools, bytes and digest.

``HousePrefix`` is what ``prefix/render.py`` renders, what the backends pin or prime and
what a request starts with. It is kept apart from the renderer, which needs Home
Assistant's LLM API and the language data (hassil), so that the backends, the pins and
the turn import the value alone.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..house.diff import HouseSnapshot


@dataclass(frozen=True)
class HousePrefix:
    """The stable prefix of an agent's prompt (what gets pinned)."""

    system: str
    tools: tuple[dict[str, Any], ...]
    # Worked examples (prefix/examples.py): chat turns pinned after the system message.
    examples: tuple[dict[str, Any], ...] = ()
    # A system message after the examples: the lines of HA's prompt that differ between
    # the device classes in use (house/device_class.py), so that the classes' prefixes share
    # everything before it.
    class_lines: str = ""
    # The ``hearth`` request extension: the house's names for the engine's grammar
    # (house/values.py); sent with the pin and every request, never in the prompt.
    hearth: dict[str, Any] | None = None
    # The house this prefix describes (house/diff.py), to tell a request sent with this
    # prefix after the house changed what is different; not part of the prompt.
    house: HouseSnapshot | None = field(default=None, compare=False)
    # A closing system message: what changed in the house since ``base`` (prefix/delta.py).
    tail: str = ""
    # The digest of the prefix rendered in full whose bytes this one keeps (None: this
    # one is rendered in full).
    base: str | None = None

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The prefix messages: the system message, any worked examples, its class's
        lines, and the changes since its base."""
        closing = [
            {"role": "system", "content": text} for text in (self.class_lines, self.tail) if text
        ]
        return [{"role": "system", "content": self.system}, *self.examples, *closing]

    @property
    def stable_text(self) -> str:
        """The text of HA's prompt that the prefix holds (a request re-sends none of it)."""
        return f"{self.system}\n{self.class_lines}" if self.class_lines else self.system

    def pin_body(self) -> dict[str, Any]:
        """Body of ``PUT /v1/prefixes/{name}``."""
        body: dict[str, Any] = {"messages": self.messages}
        if self.tools:
            body["tools"] = list(self.tools)
        if self.hearth:
            body["hearth"] = self.hearth
        return body

    @cached_property
    def data(self) -> bytes:
        """The exact bytes of the prefix: compact JSON of the messages and tools (the
        ``hearth`` values are not part of the prompt: a new empty area re-pins nothing;
        requests carry the current values)."""
        body = {k: v for k, v in self.pin_body().items() if k != "hearth"}
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()

    @cached_property
    def digest(self) -> str:
        """SHA-256 of ``data``: equal digests mean the engine sees the same tokens."""
        return hashlib.sha256(self.data).hexdigest()
