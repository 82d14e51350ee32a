"""Bounds on what one request's grammar may cost (text only; llguidance is not imported).

A grammar is compiled on the server's prepare thread, which every request waits for,
and its matcher computes a token mask on the engine worker every decode step, which
every running request waits for. So each stage has a bound, and a request that hits one
gets a 400 whose message names it (``limit <name>``):

* before anything is rendered (the server's request validation): at most ``max_tools``
  tools, and at most ``max_schema_bytes`` of JSON in the tools' parameter schemas
  together, and in a ``response_format`` schema (which never enters the prompt, so the
  context-length check never sees it);
* before compiling: at most ``max_grammar_chars`` of grammar text;
* while compiling: llguidance's parser limits (below), and ``compile_seconds`` of wall
  time, after which the request is refused and the compile is left to finish unseen;
* on the worker: llguidance's per-step limits (``step_lexer_fuel``, ``step_max_items``)
  ride along with every request's matcher; a request that hits one mid-reply may only
  end its reply.

A grammar that failed is remembered (``failure_capacity`` of them, least recently used
first out), so the same bad request is refused at once the next time.

The HA house (18 tools, ~9.5 kB of schemas) needs ~1k grammar symbols, ~19 items in a
row, ~40 Earley items and a few thousand units of lexer fuel per step, and ~200 lexer
states; 2,000 entity names as house values need ~0.45M initial lexer fuel.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# llguidance's error messages -> the limit (a ``GrammarLimits`` field) they mean.
_LLGUIDANCE_ERRORS = (
    ("too many expressions constructed", "step_lexer_fuel"),
    ("too many states", "max_lexer_states"),
    ("initial lexer configuration (grammar) too big", "initial_lexer_fuel"),
    ("grammar size (number of symbols) too big", "max_grammar_size"),
    ("current row has", "max_items_in_row"),
    ("too many items", "step_max_items"),
)


@dataclass(frozen=True)
class GrammarLimits:
    """What one request's grammar may cost; see the module docstring."""

    max_tools: int = 512
    max_schema_bytes: int = 256 * 1024
    max_grammar_chars: int = 1 << 20
    compile_seconds: float = 3.0
    failure_capacity: int = 256
    # llguidance's ``LLParserLimits`` (its defaults, where not lower, in comments).
    max_items_in_row: int = 2_000  # alternatives in one grammar row
    initial_lexer_fuel: int = 1_000_000  # building the lexer: ~20 ms
    step_lexer_fuel: int = 200_000  # new lexer states per mask: ~15 ms
    step_max_items: int = 10_000  # Earley items per mask (50,000): one step's parse
    max_lexer_states: int = 50_000  # lexer states, 1-2 kB each (250,000)
    max_grammar_size: int = 100_000  # grammar symbols (500,000)

    def parser_limits(self) -> dict[str, int]:
        """Keyword arguments for ``llguidance.LLParserLimits``."""
        return {
            "max_items_in_row": self.max_items_in_row,
            "initial_lexer_fuel": self.initial_lexer_fuel,
            "step_lexer_fuel": self.step_lexer_fuel,
            "step_max_items": self.step_max_items,
            "max_lexer_states": self.max_lexer_states,
            "max_grammar_size": self.max_grammar_size,
        }

    def named(self, limit: str) -> str:
        """How a message names a limit: ``limit max_tools = 512``."""
        value = getattr(self, limit)
        return (
            f"limit {limit} = {value:g}" if isinstance(value, float) else f"limit {limit} = {value}"
        )

    def limit_hit(self, error: str) -> str | None:
        """The limit that an llguidance error message reports hitting (None: another
        error)."""
        lowered = error.lower()
        for text, limit in _LLGUIDANCE_ERRORS:
            if text in lowered:
                return limit
        return None


DEFAULT_LIMITS = GrammarLimits()


def schema_bytes(schema: Any) -> int:
    """The size of ``schema`` as compact UTF-8 JSON (how its limit is counted)."""
    return len(
        json.dumps(schema, ensure_ascii=False, separators=(",", ":")).encode(
            "utf-8", "surrogatepass"
        )
    )
