"""A re-pin that costs what changed: the pinned house, then what changed since.

The static context lists the exposed entities (``house/listing.py``) a few hundred
tokens into the prompt, and the tools and worked examples follow it. Rendered afresh, a rename
changes the prompt there, and the engine must prefill everything after it again:
about nine tenths of the house, for every pin of every agent, while users wait.

So a pin has a *base*: the prefix last rendered in full. While the house changes only
in ways ``house_diff.describe_changes`` can tell (renames, aliases, area moves, entities
added or removed), the prefix keeps the base's bytes and ends with one more system
message that tells the changes since the base. Every token of the base stays cached in
the engine and a re-pin prefills only that message. The prefix is still deterministic:
the same base and the same house give the same bytes.

The base is rendered in full again (*folded*) when this cannot hold: the instructions,
the tools or the worked examples' presence changed, a change cannot be told, or so many
changed that a full render is the smaller prompt. ``pins/pinning.py`` also folds once the house
has been quiet for a while, so the told changes do not linger.
"""

from __future__ import annotations

import dataclasses

from ..house.diff import describe_changes, fully_described
from .value import HousePrefix

# More changes than this are folded into a fresh render: by then a full prefill of the
# house costs about as much as the told changes do over a few requests, and the model
# reads the house better from one list than from a list and its corrections.
MAX_TOLD_CHANGES = 24
TAIL_HEADER = "Changes in the smart home since the overview above:"


def tail_text(sentences: list[str]) -> str:
    """The closing system message of a prefix that tells ``sentences``."""
    return "\n".join([TAIL_HEADER, *(f"- {sentence}" for sentence in sentences)])


def compose(base: HousePrefix, full: HousePrefix) -> HousePrefix:
    """``full``'s house told after ``base``'s bytes, or ``full`` itself (folded).

    ``base`` is a prefix rendered in full (no told changes); ``full`` is the prefix
    rendered now. The result has ``base``'s messages and tools, a closing message with
    the changes, and ``full``'s grammar values and house snapshot (what requests
    compare with and what the grammar allows). Where nothing in the prompt changed it
    is ``full``, which has ``base``'s bytes.
    """
    if base.base is not None or full.base is not None:
        raise ValueError("compose() takes prefixes rendered in full")
    old, new = base.house, full.house
    if full.digest == base.digest or old is None or new is None or not _composable(base, full):
        return full
    sentences = describe_changes(old, new)
    if not sentences or len(sentences) > MAX_TOLD_CHANGES:
        return full
    return dataclasses.replace(
        base,
        tail=tail_text(sentences),
        hearth=full.hearth,
        house=full.house,
        base=base.digest,
    )


def _composable(base: HousePrefix, full: HousePrefix) -> bool:
    """Whether ``full`` differs from ``base`` only in its house, in ways that can be told."""
    old, new = base.house, full.house
    return (
        old is not None
        and new is not None
        and bool(old.listing)
        and bool(new.listing)
        and old.left_out == new.left_out
        and full.tools == base.tools
        and full.class_lines == base.class_lines
        and bool(full.examples) == bool(base.examples)
        and base.system.count(old.listing) == 1
        and full.system.replace(new.listing, old.listing, 1) == base.system
        and fully_described(old, new)
    )
