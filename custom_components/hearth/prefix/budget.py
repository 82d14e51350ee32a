"""How much of the model's context the pinned house may take.

The pinned house (instructions, listing, worked examples, tools) is read before every
request, and a request needs room after it: the turn's context message, the history the
agent keeps, the user's words, tool results and the reply. So the house gets the
context less a quarter, and a house that does not fit leaves out entities
(``house_listing.fit``) rather than fail every command.

The integration has no tokenizer (no model logic here): it counts characters of the
prefix's data and converts them with the tokens per character the server reported for
the agent's last pin. Until a pin is counted it assumes a little more than the default
model's 0.277 tokens per character (measured on the demo house), so the first guess
errs on the small side.
"""

from __future__ import annotations

from dataclasses import dataclass

RESERVE_SHARE = 0.25  # of the context stays free for a request (2,048 of 8,192 tokens)
GUESS_TOKENS_PER_CHAR = 0.30  # before a pin was counted
MARGIN = 1.05  # on a measured rate: other text of the house tokenizes a little differently
LEARNED_CHANGE = 0.02  # a rate this much off the one a fit used fits the house again


@dataclass(slots=True)
class HouseBudget:
    """The room for an agent's pinned house in a model's context."""

    context: int | None = None  # the model's context in tokens (None: not known)
    tokens_per_char: float = GUESS_TOKENS_PER_CHAR
    measured: bool = False  # whether ``tokens_per_char`` comes from a counted pin

    @property
    def house_tokens(self) -> int | None:
        """The most tokens the house may take (None: no limit known)."""
        if self.context is None:
            return None
        return self.context - round(self.context * RESERVE_SHARE)

    @property
    def max_chars(self) -> int | None:
        """The most characters of prefix data that fit ``house_tokens``."""
        tokens = self.house_tokens
        return None if tokens is None else int(tokens / self.tokens_per_char)

    def learn(self, tokens: int | None, chars: int) -> bool:
        """Take the token count the server reported for ``chars`` characters of prefix
        data. Returns whether the rate moved enough that a fitted house should be
        fitted again."""
        if not tokens or chars <= 0:
            return False
        rate = tokens / chars * MARGIN
        moved = abs(rate - self.tokens_per_char) > LEARNED_CHANGE * self.tokens_per_char
        self.tokens_per_char = rate
        self.measured = True
        return moved

    def overflowed(self) -> None:
        """The server found the house longer than its context: count more carefully."""
        self.tokens_per_char *= 1.25
