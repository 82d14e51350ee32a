"""Parts: a request that is several commands in one sentence ("turn off the night lamp
and turn on the sconce"), each of which Home Assistant's templates read whole.

HA's matcher reads a sentence as one intent, and the small model, asked for two things,
did one of them. ``command_parts`` finds where the request splits into commands: a
left part that reads whole as an action with the house's names (as the turn reads them:
inflected names written as the house writes them), then at most ``MAX_JOIN`` words
("and", "and then", "i", "und dann"), then a right part that does too, or splits again.
No word list of ours decides: the language's templates do. The turn then runs each part
as a turn of its own (turn/prepare.py ``Turn.parts``, turn/run.py), and says what each
did.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..house.names import HouseNames
from ..language.intents_data import LanguageData
from ..language.questions import QUESTION_INTENTS
from ..language.words import says_command, words
from .reading import reads_as

MAX_JOIN = 2  # words between two commands
MAX_WORDS = 24  # a longer request is not split (each split point is a template match)
MAX_PARTS = 4


def command_parts(data: LanguageData, text: str, names: HouseNames) -> tuple[str, ...]:
    """The commands ``text`` says one after another, as said (empty: it is one command,
    or its parts are not each read whole as one)."""
    tokens = text.split()
    if not 3 <= len(tokens) <= MAX_WORDS:
        return ()
    acts = [i for i in data.intents.intents if i not in QUESTION_INTENTS]
    known: dict[tuple[int, int], bool] = {}

    def reads(start: int, end: int) -> bool:
        if (start, end) not in known:
            part = names.spelled(" ".join(tokens[start:end]))
            known[start, end] = commands(data, part, names) and reads_as(data, part, acts, names)
        return known[start, end]

    if reads_as(data, names.spelled(text), acts, names):
        return ()  # one command (and no word of it split again: the turn split it once)
    known[0, len(tokens)] = False
    found = _split(reads, 0, len(tokens), MAX_PARTS)
    return tuple(" ".join(tokens[a:b]) for a, b in found) if len(found) > 1 else ()


def commands(data: LanguageData, text: str, names: HouseNames) -> bool:
    """Whether ``text`` says a command's own word beside the names it says
    (words.says_command): HA reads "the ceiling fan" alone as turning it on, yet "turn
    off the light and the ceiling fan" must not turn the fan on."""
    asked = set(words(text))
    for name in names.said_things(text) | names.mentioned(text):
        asked -= set(words(name))
    return says_command(data, asked)


def _split(
    reads: Callable[[int, int], bool], start: int, end: int, most: int
) -> Sequence[tuple[int, int]]:
    """Spans of ``tokens[start:end]`` that each read whole, in order, with at most
    ``MAX_JOIN`` words between them, at most ``most`` of them (empty: none such)."""
    if reads(start, end):
        return [(start, end)]
    if most < 2:
        return []
    for cut in range(start + 1, end):
        if not reads(start, cut):
            continue
        for join in range(MAX_JOIN + 1):
            if cut + join < end and (rest := _split(reads, cut + join, end, most - 1)):
                return [(start, cut), *rest]
    return []
