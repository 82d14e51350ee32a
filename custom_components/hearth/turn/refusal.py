"""What the guard (turn/guard.py) says of a call it does not run: a ``Refusal``."""

from __future__ import annotations

from typing import NamedTuple

# Where a tool error starts when the guard refuses a call (result_speech reads it).
NOT_FOR_REQUEST = "The call does not fit the request"
# The arguments by which a call of HA's intents says what it acts on.
TARGETS = ("name", "area", "floor", "domain", "device_class")


class Refusal(NamedTuple):
    """Why a call is not run, and the intents (HA's identifiers) the request reads as
    instead, where the guard read them (empty: it did not), with the word-valued
    arguments it reads for them (``("Intent.slot", value)``: "ścisz" is ``down``)."""

    why: str
    instead: tuple[str, ...] = ()
    values: tuple[tuple[str, str], ...] = ()
    required: tuple[str, ...] = ()  # arguments the retry must give ("Intent.name")
