"""Grammars compiled once per tool set, and per-request matchers started from them.

Runs on the server's prepare thread (never the event loop, never the engine worker).
Compiling the house's grammar (18 tools) takes ~15 ms and the tokenizer's token trie
~2 s once; a request then costs a ``deep_copy`` of the compiled matcher. Compiled
grammars are kept in a bounded LRU keyed by a hash of the grammar text, which is
derived from the tools, ``tool_choice``, ``parallel_tool_calls``, ``response_format``
and house values; the tokenizer is fixed per server. Failures are kept too (keyed the
same way), so a bad request is refused at once the next time, and so is each tool's
verdict when a failure is blamed on one part of the request.

Every compile runs under ``GrammarLimits`` (``limits.py``): llguidance's parser limits,
which ride along on each request's matcher to the worker, and a wall-clock bound, past
which the request is refused while the compile ends unseen on its own thread.

llguidance is imported here only: an engine without it serves unconstrained requests.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from ..chat.formatter import ToolFormat
from .grammar import MARKUP, ConstraintRequest, GrammarError, build_grammar, json_rule
from .limits import DEFAULT_LIMITS, GrammarLimits
from .mask import Constraint

_LOGGER = logging.getLogger(__name__)

DEFAULT_CAPACITY = 32  # compiled grammars: a few agents x tool choices x schemas
# Compiles past their deadline that may still run unseen; the next compile waits for
# the oldest beyond this (each ends: the llguidance limits and schema caps bound it).
MAX_RUNAWAYS = 2


class ConstraintCompiler:
    """Compiles and caches grammars for one tokenizer (prepare thread only)."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        eos_ids: Sequence[int],
        tool_format: ToolFormat,
        *,
        capacity: int = DEFAULT_CAPACITY,
        limits: GrammarLimits = DEFAULT_LIMITS,
    ) -> None:
        self._hf_tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_ids = tuple(sorted(eos_ids))
        self.tool_format = tool_format
        self._capacity = capacity
        self._ll_tokenizer: Any = None
        self._special: frozenset[str] | None = None
        self.limits = limits
        self._compiled: OrderedDict[str, Any] = OrderedDict()
        self._failed: OrderedDict[str, GrammarError] = OrderedDict()  # keyed as _compiled
        self._verdicts: OrderedDict[str, str] = OrderedDict()  # one part's grammar -> error
        self._runaways: list[threading.Thread] = []
        # Compiles that ran past their bound, by grammar key: awaited by the next request.
        self._slow: OrderedDict[str, tuple[threading.Thread, _CompileJob]] = OrderedDict()
        self.compiles = 0
        self.hits = 0
        self.failures = 0  # grammars that failed to compile
        self.refusals = 0  # requests refused from the failure cache, not compiled again
        self.timeouts = 0  # compiles past ``limits.compile_seconds``
        self.part_checks = 0  # single tools or response formats compiled by ``_blame``
        self.longest_wait_ms = 0.0  # the longest a request waited for a new compile
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

    def stats(self) -> dict[str, float]:
        """Counters for ``/v1/stats`` (read from the event loop: plain numbers)."""
        return {
            "grammar_compiles_total": self.compiles,
            "grammar_reused_total": self.hits,
            "grammar_failures_total": self.failures,
            "grammar_refusals_total": self.refusals,
            "grammar_timeouts_total": self.timeouts,
            "grammar_compile_wait_max_ms": round(self.longest_wait_ms, 1),
        }

    def warm(self) -> None:
        """Build the tokenizer's trie ahead of the first constrained request."""
        try:
            self._tokenizer()
        except ImportError:
            _LOGGER.warning("llguidance is not installed: constrained decoding is off")

    def compile(self, grammar: str) -> Any:
        """The compiled matcher (in its start state) for ``grammar``; cached, and so are
        failures. Raises ``GrammarError``."""
        return self._compile(grammar, lambda err: err)

    def _compile(self, grammar: str, blame: Callable[[GrammarError], GrammarError]) -> Any:
        """``compile``, where a new failure is first made specific by ``blame`` (the
        error that is remembered and raised)."""
        key = _key(grammar)
        template = self._compiled.get(key)
        if template is not None:
            self.hits += 1
            self._compiled.move_to_end(key)
            return template
        failure = self._failed.get(key)
        if failure is not None:
            self.refusals += 1
            self._failed.move_to_end(key)
            _LOGGER.info("Grammar refused from the failure cache (%d so far)", self.refusals)
            raise GrammarError(str(failure), failure.param)
        t0 = time.perf_counter()
        try:
            template = self._build(grammar, self.limits.compile_seconds, key)
        except GrammarTimeout as err:
            # Not remembered as a failure: on a busy machine a sound grammar can be slow.
            # Its compile goes on, and the next request with it waits for that one.
            _LOGGER.info("Grammar compile still running after the bound: %s", err)
            failure = blame(err)
            raise GrammarError(str(failure), failure.param) from None
        except GrammarError as err:
            failure = blame(err)
            self.failures += 1
            _LOGGER.info("Grammar refused: %s", failure)
            _remember(self._failed, key, failure, self.limits.failure_capacity)
            raise GrammarError(str(failure), failure.param) from None
        finally:
            waited = (time.perf_counter() - t0) * 1000
            self.longest_wait_ms = max(self.longest_wait_ms, waited)
        self.last_compile_ms = (time.perf_counter() - t0) * 1000
        self.compiles += 1
        _LOGGER.info(
            "Grammar compiled in %.0f ms (%d so far, %d reused)",
            self.last_compile_ms,
            self.compiles,
            self.hits,
        )
        _remember(self._compiled, key, template, self._capacity)
        return template

    def _build(self, grammar: str, seconds: float, key: str | None = None) -> Any:
        """A new matcher for ``grammar``, under the llguidance limits and within
        ``seconds``; its first mask is computed too (the lexer's start state: paid here,
        not per request). With ``key``, a compile of it that ran past its bound earlier
        is awaited (or taken, if done) instead of starting another."""
        limits = self.limits
        if len(grammar) > limits.max_grammar_chars:
            raise GrammarError(
                f"the tools and response format are too large to constrain "
                f"({len(grammar)} characters of grammar; {limits.named('max_grammar_chars')})"
            )
        import llguidance

        tokenizer = self._tokenizer()  # outside the deadline: built once, ~1-3 s
        parser_limits = llguidance.LLParserLimits(**limits.parser_limits(), verbose_errors=False)
        slow = self._slow.pop(key, None) if key is not None else None
        if slow is not None:
            thread, job = slow
        else:
            job = _CompileJob(tokenizer, grammar, parser_limits)
            self._runaways = [t for t in self._runaways if t.is_alive()]
            if len(self._runaways) >= MAX_RUNAWAYS:
                # Never wait for them (every request would): refuse this one at once.
                self.timeouts += 1
                raise GrammarTimeout(
                    f"{len(self._runaways)} slow grammars are still compiling "
                    f"({limits.named('compile_seconds')} seconds each); retry shortly"
                )
            thread = threading.Thread(target=job.run, name="hearth-grammar", daemon=True)
            thread.start()
        thread.join(max(seconds, 0.0))
        if thread.is_alive():
            if slow is None:
                self._runaways.append(thread)
            if key is not None:
                _remember(self._slow, key, (thread, job), MAX_RUNAWAYS)
            self.timeouts += 1
            raise GrammarTimeout(
                f"the grammar takes too long to compile ({limits.named('compile_seconds')} "
                f"seconds); simplify the schemas (anyOf, allOf, many optional properties)"
            )
        if job.error is not None:
            raise job.error
        matcher = job.matcher
        if matcher.is_error():
            raise GrammarError(self._describe(matcher.get_error()))
        return matcher

    def _describe(self, error: str) -> str:
        """llguidance's error as a client reads it: the limit it hit, if any."""
        line = _schema_error(error)
        limit = self.limits.limit_hit(line)
        if limit is not None:
            return f"the schema is too complex to constrain ({self.limits.named(limit)}): {line}"
        if line.startswith("panic"):
            return "the schema is too complex to constrain (it expands too far)"
        if line == "NoExtensionBias":
            return "the schema allows no finite value (does a $ref refer only to itself?)"
        return line

    def start(self, req: ConstraintRequest, forced: str = "") -> Constraint | None:
        """A request's constraint, after ``forced`` (text already in the prompt); None
        when the request needs none. Raises ``GrammarError`` for a bad schema."""
        if not req.needs_grammar(self.tool_format):
            return None
        grammar = build_grammar(req, self.tool_format, self._special_markup())
        matcher = self._compile(grammar, partial(self._blame, req)).deep_copy()
        if forced:
            tokens = self._tokenizer().tokenize_str(forced, parse_special=True)
            if not matcher.consume_tokens(tokens):
                raise GrammarError(f"the forced reply start does not fit the grammar: {forced!r}")
        return Constraint(matcher, self.eos_ids)

    def _blame(self, req: ConstraintRequest, err: GrammarError) -> GrammarError:
        """The request part whose schema broke the grammar (each checked on its own, and
        each verdict remembered, within one compile's time). A grammar that failed as a
        whole only (too large, too slow) is blamed on the tools or the response format."""
        parts: list[tuple[str, Any]] = [
            (f"tools.{i}.function.parameters", t["function"].get("parameters") or {})
            for i, t in enumerate(req.tools)
        ]
        if req.response_format and req.response_format.get("type") == "json_schema":
            schema = req.response_format["json_schema"].get("schema", {})
            parts.append(("response_format.json_schema.schema", schema))
        whole = "tools" if req.tools and req.tool_choice != "none" else "response_format"
        if isinstance(err, GrammarTimeout):  # its parts would take as long again
            return GrammarError(str(err), err.param or whole)
        deadline = time.perf_counter() + self.limits.compile_seconds
        for param, schema in parts:
            try:
                grammar = "\n".join(["%llguidance {}", "start: args", json_rule("args", schema)])
            except GrammarError as part_err:
                return GrammarError(f"{param}: {part_err}", param)
            verdict = self._verdict(grammar, deadline - time.perf_counter())
            if verdict:
                return GrammarError(f"{param}: {verdict}", param)
            if time.perf_counter() >= deadline:
                break
        return GrammarError(str(err), err.param or whole)

    def _verdict(self, grammar: str, seconds: float) -> str:
        """Why one part's grammar fails ("" when it compiles); remembered."""
        key = _key(grammar)
        verdict = self._verdicts.get(key)
        if verdict is not None:
            self._verdicts.move_to_end(key)
            return verdict
        self.part_checks += 1
        try:
            self._build(grammar, seconds)
            verdict = ""
        except GrammarTimeout as err:
            return str(err)  # not remembered: it may have had less than a compile's time
        except GrammarError as err:
            verdict = str(err)
        _remember(self._verdicts, key, verdict, self.limits.failure_capacity)
        return verdict


class GrammarTimeout(GrammarError):
    """A compile that ran past ``GrammarLimits.compile_seconds``."""


class _CompileJob:
    """One llguidance compile, run on its own thread (llguidance drops the GIL)."""

    def __init__(self, tokenizer: Any, grammar: str, limits: Any) -> None:
        self._args = (tokenizer, grammar)
        self._limits = limits
        self.matcher: Any = None
        self.error: BaseException | None = None  # raised again on the waiting thread

    def run(self) -> None:
        import llguidance

        try:
            matcher = llguidance.LLMatcher(*self._args, log_level=0, limits=self._limits)
            if not matcher.is_error():
                matcher.compute_bitmask()
            self.matcher = matcher
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread
            self.error = err


def _key(grammar: str) -> str:
    return hashlib.sha256(grammar.encode("utf-8", "surrogatepass")).hexdigest()


def _remember(cache: OrderedDict[str, Any], key: str, value: Any, capacity: int) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > capacity:
        cache.popitem(last=False)


def _first_line(error: str) -> str:
    line = (error or "invalid grammar").strip().splitlines()[0]
    return line if len(line) <= 500 else line[:497] + "..."


def _schema_error(error: str) -> str:
    """llguidance's message without its grammar position (``at 3(10): ``)."""
    return re.sub(r"^at \d+\(\d+\): ", "", _first_line(error))
