"""Messages to prompt token ids, reusing the tokens of a request's house part.

Every request of a Hearth agent starts with the same *house part*: one system message
(instructions and the static context of the house's entities) and the tools, which is
also what the integration pins (see ``custom_components/hearth/prefix/render.py``). It is
thousands of tokens, and tokenizing it again for every request is most of the work of
preparing one. ``PromptEncoder`` keeps, per house part (a hash of the first message and
the tools), the rendered house text up to a *safe cut* and its token ids, so a warm
request only tokenizes the text after the cut.

A cut is safe when tokenizing the text before it and the text after it separately gives
exactly the tokens of the whole text. That holds right after a special token that the
tokenizer splits out before anything else (``<|im_end|>``, ``<|eot_id|>``, ...), as long
as the token does not swallow the whitespace after it (``rstrip``), no other added token
could straddle the cut, and text after a special token tokenizes as it would at the start
(checked by probing). Each new house part is also checked once against the encoding of the
whole prompt; a house part that disagrees is never split (and a warning is logged).

The chat template must still render the whole conversation for every request: a template
is a program over all messages, not a concatenation of parts. A template may take the
house part's text it rendered before in place of the first message and the tools
(Hearth's own does: ``hearth_house``, model/prepare/templates.py), which saves rendering
the tools' lines again (most of a request's render); that is used for a house part only
where the first request's text is the same both ways.

Not thread-safe: the server uses one encoder from one thread (its prepare executor), the
only thread that touches the formatter's tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from ..chat.formatter import ChatFormatter, ChatTemplateError

_LOGGER = logging.getLogger(__name__)

DEFAULT_CAPACITY = 8  # house parts kept: a few agents, each during a re-pin
# Texts that could follow a cut: whitespace and words, which is where tokenizers that
# treat the start of a text specially (a prefix space, ``lstrip``) would differ.
_PROBES = ("x", " x", "\n", "\n\n", " ", "  Hello world", "\nuser\nhi")
# What a template that takes a house part's text renders in its place when checked
# (``PromptEncoder._writes_house``): private-use characters no client text holds here.
_MARKER = "\ue000hearth-house\ue001"


@dataclass(frozen=True)
class HousePart:
    """The rendered house part up to its safe cut, and its token ids; ``rendered``: the
    whole house part's text, where the template writes it in place of rendering the
    first message and the tools again (``ChatFormatter.render``'s ``house``)."""

    text: str  # "" when nothing of this house part can be reused
    ids: tuple[int, ...]
    rendered: str | None = None


NOTHING = HousePart("", ())


def house_key(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str | None:
    """The cache key of a request's house part: its first message (a system one) and tools.

    Key order is kept (not sorted): the template renders the JSON as given.
    """
    if not messages or messages[0].get("role") != "system":
        return None
    data = json.dumps([messages[0], tools or None], ensure_ascii=False)
    return hashlib.sha256(data.encode("utf-8", "surrogatepass")).hexdigest()


class PromptEncoder:
    """Renders and encodes prompts, reusing the cached tokens of known house parts."""

    def __init__(self, formatter: ChatFormatter, capacity: int = DEFAULT_CAPACITY) -> None:
        self.formatter = formatter
        self._capacity = capacity
        self._houses: OrderedDict[str, HousePart] = OrderedDict()
        self._cut_safe: dict[str, bool] = {}  # special token -> text may be split after it
        self.hits = 0  # requests that reused a house part's tokens
        self.misses = 0  # requests whose house part was new
        self.reused_tokens = 0  # tokens taken from the cache instead of tokenized

    def encode(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool,
        suffix: str = "",
    ) -> list[int]:
        """Token ids of the rendered messages followed by ``suffix`` (forced text).

        Raises ``ChatTemplateError`` (or ``RecursionError``) when the template refuses.
        """
        formatter = self.formatter
        key = house_key(messages, tools)
        house = self._houses.get(key) if key is not None else None
        rendered = house.rendered if house is not None else None
        text = formatter.render(
            messages, tools, add_generation_prompt=add_generation_prompt, house=rendered
        )
        text += suffix
        if key is None:
            return formatter.encode(text)
        if house is None:
            self.misses += 1
            full = formatter.encode(text)
            request = (messages, add_generation_prompt, suffix)
            self._remember(key, self._house_part(request, tools, text, full))
            return full
        self._houses.move_to_end(key)
        if not house.text or not text.startswith(house.text):
            return formatter.encode(text)
        self.hits += 1
        self.reused_tokens += len(house.ids)
        return [*house.ids, *formatter.encode(text[len(house.text) :])]

    def _remember(self, key: str, house: HousePart) -> None:
        self._houses[key] = house
        while len(self._houses) > self._capacity:
            self._houses.popitem(last=False)

    def _house_part(
        self,
        request: tuple[list[dict[str, Any]], bool, str],
        tools: list[dict[str, Any]] | None,
        text: str,
        full: list[int],
    ) -> HousePart:
        """The reusable head of a new house part, checked against the whole prompt
        (``text``, its tokens ``full``) of ``request`` (its messages, whether it asks
        for the generation prompt, its forced suffix)."""
        messages = request[0]
        try:
            house = self.formatter.render(messages[:1], tools, add_generation_prompt=False)
        except ChatTemplateError:
            return NOTHING  # e.g. a template that wants a user message
        if not text.startswith(house):
            return NOTHING  # the template moves the system message (Mistral does)
        rendered = house if self._writes_house(request, house, text) else None
        cut = self.safe_cut(house)
        if cut == 0:
            return HousePart("", (), rendered)
        ids = self.formatter.encode(house[:cut])
        if full[: len(ids)] != ids or full[len(ids) :] != self.formatter.encode(text[cut:]):
            _LOGGER.warning(
                "Tokenizing after a special token does not match the whole prompt's tokens"
                " (cut at character %d): this house part is tokenized whole every time",
                cut,
            )
            return HousePart("", (), rendered)
        return HousePart(house[:cut], tuple(ids), rendered)

    def _writes_house(
        self, request: tuple[list[dict[str, Any]], bool, str], house: str, text: str
    ) -> bool:
        """Whether the template writes a house part's text in place of the first
        message and the tools, once, and with ``house`` there gives this request's
        ``text`` exactly: then later requests of this house part do not render the
        tools again. A template that knows no such variable never writes it (asked with
        a marker in its place, it renders no marker), whatever else it renders."""
        messages, add_generation_prompt, suffix = request
        try:
            again = self.formatter.render(
                messages, None, add_generation_prompt=add_generation_prompt, house=_MARKER
            )
        except ChatTemplateError:
            return False
        return again.count(_MARKER) == 1 and again.replace(_MARKER, house) + suffix == text

    def safe_cut(self, text: str) -> int:
        """The last position in ``text`` right after a special token where it may be split
        (0 if there is none)."""
        tokenizer = self.formatter.tokenizer
        added = [str(t.content) for t in tokenizer.added_tokens_decoder.values()]
        candidates = sorted(
            (
                (text.rfind(t.content) + len(t.content), str(t.content))
                for t in tokenizer.added_tokens_decoder.values()
                if t.special and not t.rstrip and not t.normalized and t.content in text
            ),
            reverse=True,
        )
        for end, token in candidates:
            head = text[:end]
            straddles = any(head.endswith(a[:k]) for a in added for k in range(1, len(a)))
            if not straddles and self._splits_after(token):
                return end
        return 0

    def _splits_after(self, token: str) -> bool:
        """Whether text after ``token`` tokenizes as it would on its own (probed once)."""
        safe = self._cut_safe.get(token)
        if safe is None:
            encode = self.formatter.encode
            head = encode(token)
            safe = all(encode(token + p) == head + encode(p) for p in _PROBES)
            self._cut_safe[token] = safe
        return safe
