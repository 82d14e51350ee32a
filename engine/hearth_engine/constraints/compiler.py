"""Grammars compiled once per tool set, and per-request matchers started from them.

Runs on the server's prepare thread (never the event loop, never the engine worker).
Compiling the house's grammar (18 tools) takes ~15 ms and the tokenizer's token trie
~2 s once; a request then costs a ``deep_copy`` of the compiled matcher. Compiled
grammars are kept in a bounded LRU keyed by a hash of the grammar text, which is
derived from the tools, ``tool_choice``, ``parallel_tool_calls``, ``response_format``
and house values; the tokenizer is fixed per server.

llguidance is imported here only: an engine without it serves unconstrained requests.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from ..chat import ToolFormat
from .grammar import MARKUP, ConstraintRequest, GrammarError, build_grammar, json_rule
from .mask import Constraint

_LOGGER = logging.getLogger(__name__)

DEFAULT_CAPACITY = 32  # compiled grammars: a few agents x tool choices x schemas
MAX_GRAMMAR_CHARS = 1 << 20  # a larger grammar is refused (a 400), not compiled


class ConstraintCompiler:
    """Compiles and caches grammars for one tokenizer (prepare thread only)."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        eos_ids: Sequence[int],
        tool_format: ToolFormat,
        capacity: int = DEFAULT_CAPACITY,
    ) -> None:
        self._hf_tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_ids = tuple(sorted(eos_ids))
        self.tool_format = tool_format
        self._capacity = capacity
        self._ll_tokenizer: Any = None
        self._special: frozenset[str] | None = None
        self._compiled: OrderedDict[str, Any] = OrderedDict()
        self.compiles = 0
        self.hits = 0
        self.last_compile_ms = 0.0

    def _tokenizer(self) -> Any:
        """llguidance's view of the tokenizer (built on first use: ~1-3 s)."""
        if self._ll_tokenizer is None:
            import llguidance.hf

            t0 = time.perf_counter()
            self._ll_tokenizer = llguidance.hf.from_tokenizer(
                self._hf_tokenizer, n_vocab=self.vocab_size, eos_token=list(self.eos_ids) or None
            )
            _LOGGER.info(
                "Constrained decoding ready (tokenizer trie in %.0f ms)",
                (time.perf_counter() - t0) * 1000,
            )
        return self._ll_tokenizer

    def _special_markup(self) -> frozenset[str]:
        """The tool-call markup strings that this tokenizer has as one special token."""
        if self._special is None:
            tokenizer = self._tokenizer()
            vocab = self._hf_tokenizer.get_vocab()
            self._special = frozenset(
                m for m in MARKUP if m in vocab and tokenizer.is_special_token(vocab[m])
            )
        return self._special

    def warm(self) -> None:
        """Build the tokenizer's trie ahead of the first constrained request."""
        try:
            self._tokenizer()
        except ImportError:
            _LOGGER.warning("llguidance is not installed: constrained decoding is off")

    def compile(self, grammar: str) -> Any:
        """The compiled matcher (in its start state) for ``grammar``; cached."""
        key = hashlib.sha256(grammar.encode("utf-8", "surrogatepass")).hexdigest()
        template = self._compiled.get(key)
        if template is not None:
            self.hits += 1
            self._compiled.move_to_end(key)
            return template
        if len(grammar) > MAX_GRAMMAR_CHARS:
            raise GrammarError(
                f"the tools and response format are too large to constrain "
                f"({len(grammar)} characters of grammar; at most {MAX_GRAMMAR_CHARS})"
            )
        import llguidance

        t0 = time.perf_counter()
        template = llguidance.LLMatcher(self._tokenizer(), grammar, log_level=0)
        if template.is_error():
            raise GrammarError(_first_line(template.get_error()))
        # The first mask builds the lexer's start state: pay it here, not per request.
        template.compute_bitmask()
        if template.is_error():
            raise GrammarError(_first_line(template.get_error()))
        self.last_compile_ms = (time.perf_counter() - t0) * 1000
        self.compiles += 1
        _LOGGER.info(
            "Grammar compiled in %.0f ms (%d so far, %d reused)",
            self.last_compile_ms,
            self.compiles,
            self.hits,
        )
        self._compiled[key] = template
        while len(self._compiled) > self._capacity:
            self._compiled.popitem(last=False)
        return template

    def start(self, req: ConstraintRequest, forced: str = "") -> Constraint | None:
        """A request's constraint, after ``forced`` (text already in the prompt); None
        when the request needs none. Raises ``GrammarError`` for a bad schema."""
        if not req.needs_grammar(self.tool_format):
            return None
        grammar = build_grammar(req, self.tool_format, self._special_markup())
        try:
            matcher = self.compile(grammar).deep_copy()
        except GrammarError as err:
            raise self._blame(req, err) from None
        if forced:
            tokens = self._tokenizer().tokenize_str(forced, parse_special=True)
            if not matcher.consume_tokens(tokens):
                raise GrammarError(f"the forced reply start does not fit the grammar: {forced!r}")
        return Constraint(matcher, self.eos_ids)

    def _blame(self, req: ConstraintRequest, err: GrammarError) -> GrammarError:
        """The request part whose schema broke the grammar (each compiled on its own)."""
        parts: list[tuple[str, Any]] = [
            (f"tools.{i}.function.parameters", t["function"].get("parameters") or {})
            for i, t in enumerate(req.tools)
        ]
        if req.response_format and req.response_format.get("type") == "json_schema":
            schema = req.response_format["json_schema"].get("schema", {})
            parts.append(("response_format.json_schema.schema", schema))
        import llguidance

        for param, schema in parts:
            try:
                grammar = "\n".join(["%llguidance {}", "start: args", json_rule("args", schema)])
            except GrammarError as part_err:
                return GrammarError(f"{param}: {part_err}", param)
            matcher = llguidance.LLMatcher(self._tokenizer(), grammar, log_level=0)
            if matcher.is_error():
                return GrammarError(f"{param}: {_schema_error(matcher.get_error())}", param)
        return err


def _first_line(error: str) -> str:
    line = (error or "invalid grammar").strip().splitlines()[0]
    return line if len(line) <= 500 else line[:497] + "..."


def _schema_error(error: str) -> str:
    """llguidance's message without its grammar position (``at 3(10): ``)."""
    return re.sub(r"^at \d+\(\d+\): ", "", _first_line(error))
