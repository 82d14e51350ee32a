"""What a constrained reply may be, written as an llguidance Lark grammar (text only).

A request with tools, ``tool_choice`` or ``response_format`` becomes one grammar over the
whole reply (the text after the generation prompt):

* **content**: plain text that never contains tool-call or tool-response markup, or,
  with ``response_format``, JSON (any object, or the given JSON schema);
* **calls**: one or more (one when ``parallel_tool_calls`` is false) tool calls in the
  model's format, each ``<tool_call>\\n{"name": "<tool>", "arguments": {...}}\\n</tool_call>``
  (Hermes), where ``<tool>`` is an offered tool and the arguments follow its JSON schema
  (types, enums, required keys, ``additionalProperties``). Every tool is held to its
  schema, ``strict`` or not: a small model gains most from the non-strict ones. A
  prefixed tool (``intent__HassTurnOn``) may also be called by its short name where that
  is unambiguous (``tool_aliases``); the server reports the full name. An array of enum
  values holds at most as many items as the enum has (``bound_enum_arrays``).

``tool_choice`` picks the start: ``none`` content only, ``auto`` content or calls,
``required`` calls, a named tool exactly one call to it, and ``allowed_tools`` (OpenAI's
``{"type": "allowed_tools", "allowed_tools": {"mode": "auto" | "required", "tools":
[...]}}``) ``auto`` or ``required`` over only the listed tools, while the prompt still
shows them all (so a pinned prefix stays byte-identical). Once the calls close, the
grammar allows only the end of the reply (or another call): the model cannot ramble on.

JSON is held to the spacing of the training data (``", "`` and ``": "``, no newlines):
whitespace loops are the classic failure of a constrained small model.

The house's values (``hearth.argument_values``, see docs/api.md) narrow string arguments
of those names to the listed values here, never in the prompt.

Only the Hermes format is constrained to calls (the default and tiny models use it); for
Llama 3 and Mistral templates ``tool_choice`` none and ``response_format`` are still
honoured, and tools stay unconstrained (``tool_format_supported``).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

from ..chat.formatter import ToolFormat

# Spacing of JSON in the grammar: as json.dumps and the chat templates write it.
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# Plain text: anything without tool markup. Any ``<tool_`` / ``</tool_`` is refused, not
# only the exact tags: refused ``<tool_response>``, the default model wrote
# ``<tool_response2>``. Nor may text open like JSON (``{`` or ``[``, after any blank
# space): beside offered tools, that is a call written without its markup, which the
# default model did for 10 of 36 home commands; refused, it writes a real call or words.
# Nor may it hold a JSON ``"name":`` key anywhere: the same call after some prose (2 of
# the 36 once the opening was refused). Braces in words stay allowed.
TEXT_RULE = (
    r"TEXT: /(.|\n)+/ & ~/(.|\n)*<\/?tool_(.|\n)*/ & ~/[ \t\n]*[\{\[](.|\n)*/"
    r' & ~/(.|\n)*"name"[ \t\n]*:(.|\n)*/'
)
MARKUP = ("<tool_call>", "</tool_call>")


class GrammarError(ValueError):
    """The request's tools or response format cannot be made a grammar (a 400)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ConstraintRequest:
    """The parts of a chat request that decide its grammar."""

    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    response_format: dict[str, Any] | None = None
    argument_values: dict[str, list[str]] | None = None
    # The tools that bare ``argument_values`` keys apply to (None: every tool).
    argument_tools: tuple[str, ...] | None = None
    # Arguments a call must give: ``arg`` in every tool, ``Tool.arg`` in that one.
    required_arguments: tuple[str, ...] | None = None

    @property
    def wants_json(self) -> bool:
        return bool(self.response_format) and self.response_format.get("type") != "text"

    def needs_grammar(self, fmt: ToolFormat) -> bool:
        """Whether the reply is constrained at all (see the module docstring)."""
        if self.wants_json:
            return True
        if not self.tools:
            return False
        return self.tool_choice == "none" or tool_format_supported(fmt)


def allowed_tools(choice: Any) -> tuple[frozenset[str], str] | None:
    """The tool names and mode (``auto`` or ``required``) of an ``allowed_tools``
    ``tool_choice`` (None for any other; the server has checked its shape)."""
    if not isinstance(choice, dict) or choice.get("type") != "allowed_tools":
        return None
    allowed = choice["allowed_tools"]
    names = frozenset(t["function"]["name"] for t in allowed["tools"])
    return names, allowed["mode"]


def tool_format_supported(fmt: ToolFormat) -> bool:
    return fmt is ToolFormat.HERMES


def tool_aliases(tools: list[dict[str, Any]] | tuple[dict[str, Any], ...]) -> dict[str, str]:
    """Short names a model may write for prefixed tools: ``HassTurnOn`` for
    ``intent__HassTurnOn`` (the plugin prefixes each tool with its API). Only where the
    short name is unique and no tool's full name; the server reports the full name."""
    full = {t["function"]["name"] for t in tools}
    short: dict[str, list[str]] = {}
    for name in full:
        if "__" in name:
            short.setdefault(name.split("__", 1)[1], []).append(name)
    return {a: names[0] for a, names in short.items() if len(names) == 1 and a and a not in full}


def narrow_schema(schema: Any, values: dict[str, list[str]], required: tuple[str, ...] = ()) -> Any:
    """``schema`` (a tool's parameters) with its string arguments named in ``values``
    limited to those values (arrays of strings: their items).

    An argument that already has an enum keeps the values both allow (its own enum if
    none are common: the tool's own list is never widened). An empty list: the argument
    may not be given (unless the schema requires it), and then no argument the schema
    does not list may be either. ``required``: arguments (of those it lists) that a
    call must give.
    """
    if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
        return schema
    out = copy.deepcopy(schema)
    given = set(out.get("required") or ())  # what the tool itself requires
    for name, allowed in values.items():
        prop = out["properties"].get(name)
        if not allowed and name not in given:
            if out["properties"].pop(name, None) is not None:
                out["additionalProperties"] = False
        elif isinstance(prop, dict) and allowed:
            out["properties"][name] = _restrict(prop, allowed)
    needed = [name for name in required if name in out["properties"] and name not in given]
    if needed:
        out["required"] = [*(out.get("required") or ()), *needed]
    return out


def required_for(tool: str, required: tuple[str, ...]) -> tuple[str, ...]:
    """The ``required_arguments`` that apply to ``tool`` (bare names: every tool), scoped
    as ``values_for`` scopes keys."""
    return tuple(values_for(tool, {key: [] for key in required}))


def _names(tool: str, owner: str) -> bool:
    """Whether ``owner`` names ``tool``, by its full or short name."""
    return owner == tool or tool.endswith(f"__{owner}")


def values_for(
    tool: str, values: dict[str, list[str]], tools: tuple[str, ...] | None = None
) -> dict[str, list[str]]:
    """The ``argument_values`` that apply to ``tool``: bare keys (``name``) apply to every
    tool in ``tools`` (all when None); ``Tool.arg`` keys only to that tool (by its full
    or short name, as in ``intent__HassTurnOn`` / ``HassTurnOn``), and win over a bare key.

    Scoping matters because one argument name means different things in different tools:
    ``name`` is an entity in ``HassTurnOn`` but a free timer name in ``HassStartTimer``.
    """
    general: dict[str, list[str]] = {}
    scoped: dict[str, list[str]] = {}
    in_scope = tools is None or any(_names(tool, owner) for owner in tools)
    for key, allowed in values.items():
        owner, dot, arg = key.rpartition(".")
        if not dot:
            if in_scope:
                general[key] = allowed
        elif _names(tool, owner):
            scoped[arg] = allowed
    return {**general, **scoped}


def bound_enum_arrays(schema: Any) -> Any:
    """``schema`` with each top-level array argument of enum items limited to as many
    items as the enum has (unless it says otherwise): a list longer than that repeats a
    value, and a small model that starts repeating (``["tv", "tv", "tv", ...``) never
    stops before ``max_tokens``."""
    if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
        return schema
    props = dict(schema["properties"])
    for name, prop in props.items():
        props[name] = _bound(prop)
    return {**schema, "properties": props}


def _bound(prop: Any) -> Any:
    if not isinstance(prop, dict):
        return prop
    for key in ("anyOf", "oneOf"):
        if isinstance(prop.get(key), list):
            return {**prop, key: [_bound(p) for p in prop[key]]}
    items = prop.get("items")
    if (
        prop.get("type") == "array"
        and isinstance(items, dict)
        and isinstance(items.get("enum"), list)
        and "maxItems" not in prop
    ):
        return {**prop, "maxItems": max(1, len(items["enum"]))}
    return prop


def _restrict(prop: dict[str, Any], allowed: list[str]) -> dict[str, Any]:
    if isinstance(prop.get("enum"), list):
        common = [v for v in prop["enum"] if v in allowed]
        return {**prop, "enum": common} if common else prop
    for key in ("anyOf", "oneOf"):
        if isinstance(prop.get(key), list):
            # Of its alternatives, those that can take a listed value (strings: not a
            # number): "up" for a relative volume, not any step from -100 to 100.
            kept = [_restrict(p, allowed) for p in prop[key] if _takes_text(p)]
            return {**prop, key: kept} if kept else prop
    kind = prop.get("type")
    if kind == "string":
        return {**prop, "enum": list(allowed)}
    if kind == "array" and isinstance(prop.get("items"), dict):
        return {**prop, "items": _restrict(prop["items"], allowed)}
    return prop


def _takes_text(prop: Any) -> bool:
    """Whether a schema alternative may hold a string (or strings: an array)."""
    if not isinstance(prop, dict):
        return False
    if isinstance(prop.get("enum"), list):
        return any(isinstance(value, str) for value in prop["enum"])
    kind = prop.get("type")
    return bool((set(kind) if isinstance(kind, list) else {kind}) & {"string", "array", None})


def json_rule(name: str, schema: Any) -> str:
    if schema is True or schema == {}:
        schema = {}
    if not isinstance(schema, dict):
        raise GrammarError(f"{name}: a JSON schema must be an object")
    styled = {**schema, "x-guidance": {**JSON_STYLE, **schema.get("x-guidance", {})}}
    return f"{name}: %json {json.dumps(styled, ensure_ascii=False)}"


def _content_rules(response_format: dict[str, Any] | None) -> list[str]:
    kind = (response_format or {}).get("type", "text")
    if kind == "json_object":
        return [json_rule("content", {"type": "object"})]
    if kind == "json_schema":
        spec = response_format.get("json_schema") or {}  # type: ignore[union-attr]
        return [json_rule("content", spec.get("schema", {}))]
    return ["content: TEXT", TEXT_RULE]


def _markup(text: str, special: frozenset[str]) -> str:
    """A markup string in a rule: a token reference where the tokenizer has it as one
    special token (llguidance never lets a lexeme match those), else literal text."""
    return text if text in special else json.dumps(text)


def build_grammar(
    req: ConstraintRequest, fmt: ToolFormat, special: frozenset[str] = frozenset()
) -> str:
    """The Lark grammar (llguidance dialect) for ``req``'s whole reply.

    ``special``: the markup strings (``MARKUP``) that are single special tokens.
    """
    choice = req.tool_choice
    tools = list(req.tools) if tool_format_supported(fmt) else []
    content = _content_rules(req.response_format)
    if choice == "none" or not tools:
        return "\n".join(["%llguidance {}", "start: content", *content])
    rules = ["%llguidance {}"]
    if (allowed := allowed_tools(choice)) is not None:
        names, choice = allowed
        tools = [t for t in tools if t["function"]["name"] in names]
    if isinstance(choice, dict):
        named = choice["function"]["name"]
        tools = [t for t in tools if t["function"]["name"] == named]
        rules.append("start: call")
    elif choice == "required":
        rules.append("start: calls")
    else:
        rules.append("start: content | calls")
        rules.extend(content)
    rules.append('calls: call ("\\n" call)*' if req.parallel_tool_calls else "calls: call")
    open_, close = (_markup(m, special) for m in MARKUP)
    rules.append(f'call: {open_} "\\n" body "\\n" {close}')
    rules.append("body: " + " | ".join(f"fn_{i}" for i in range(len(tools))))
    # Short names over every offered tool (as the server maps them back), kept for the
    # tools this grammar allows.
    allowed_names = {t["function"]["name"] for t in tools}
    aliases = {a: full for a, full in tool_aliases(req.tools).items() if full in allowed_names}
    for i, tool in enumerate(tools):
        fn = tool["function"]
        schema = fn.get("parameters") or {"type": "object", "properties": {}}
        values = values_for(fn["name"], req.argument_values or {}, req.argument_tools)
        required = required_for(fn["name"], req.required_arguments or ())
        if values or required:
            schema = narrow_schema(schema, values, required)
        schema = bound_enum_arrays(schema)
        names = [fn["name"], *(a for a, full in aliases.items() if full == fn["name"])]
        spelled = " | ".join(json.dumps(json.dumps(n)) for n in names)
        rules.append(f'fn_{i}: "{{\\"name\\": " ({spelled}) ", \\"arguments\\": " args_{i} "}}"')
        rules.append(json_rule(f"args_{i}", schema))
    return "\n".join(rules)
