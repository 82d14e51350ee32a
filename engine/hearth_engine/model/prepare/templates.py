"""Chat templates installed into the models Hearth prepares.

The default model (SmolLM2) ships a ChatML template that ignores ``tools``. Hearth
installs a Hermes-style ChatML template instead: tools are listed in the system turn, one
compact signature a line, the model answers with
``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` blocks, and tool results come
back as ``<tool_response>`` blocks in a user turn (the Qwen2.5 convention).

A tool's line reads like a TypeScript signature, written by the template itself (Jinja
macros, no recursion), so a model folder renders the same text wherever it is served
(transformers here, llama.cpp's own Jinja engine from the GGUF file). One line, broken
here::

    HassLightSet(name?: string, domain?: light[], brightness?: integer 0..100) - Sets
    the brightness percentage or color of a light // brightness: The brightness ...

``?`` marks an optional parameter; ``a | b`` is either (enum values, ``anyOf``, a list of
types); ``t[]`` a list of ``t``; ``integer 0..100``, ``>=0``, ``<=100`` a range; a bare word
in a type is that string (a value that is not a plain word, or is a type's name, is
written as JSON: ``"1"``, ``"string"``, ``"a b"``); ``any`` a schema without a type. Each
parameter's description follows the tool's as ``// name: description``. What this
cannot spell (a nested object, a keyword it does not know, ``additionalProperties`` other
than false) is written as that schema's JSON in its place, so no part of a schema is
lost. Parameters keep the order they are given in.

Cache friendliness matters more than anything here: the template renders every message
in order and never looks ahead, so the text of a conversation's first messages is a
byte prefix of the text of the whole conversation. A pinned ``[system + tools]`` prefix
is therefore a token prefix of every later request that starts with the same messages.

This file imports nothing (the benchmarks load it from any venv).
"""

from __future__ import annotations

from pathlib import Path


def _jinja(source: str) -> str:
    """Jinja written a tag a line, joined into one line: each line is stripped, and a line
    that continues a tag's expression is joined with a space. Text the template writes
    sits inside ``{{ }}``, so no line break or indentation reaches the output."""
    out = ""
    for line in filter(None, (line.strip() for line in source.splitlines())):
        joined = not out or (out.endswith("}") and line.startswith("{"))
        out += line if joined else " " + line
    return out


TOOLS_INTRO = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags, one a line "
    "(`?` marks an optional parameter, `a | b` either, `t[]` a list of t, a bare word that "
    "string):\n<tools>"
)
TOOLS_OUTRO = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)

WORD_CHARACTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"
RESERVED_WORDS = ("any", "array", "boolean", "false", "integer", "null", "number")
RESERVED_WORDS += ("object", "string", "true")

TOOL_MACROS = _jinja(
    """
{%- macro hearth_value(v) -%}
    {%- if v is string and v and v.strip(WORD_CHARACTERS) == ''
        and v.lstrip('0123456789') == v and v not in RESERVED_WORDS -%}
        {{- v }}
    {%- else -%}
        {{- v | tojson }}
    {%- endif -%}
{%- endmacro -%}
{%- macro hearth_leaf(s, top) -%}
    {%- set ns = namespace(plain=s is mapping) -%}
    {%- if ns.plain -%}
        {%- for key in s -%}
            {%- if key not in ['type', 'enum', 'minimum', 'maximum']
                and not (top and key == 'description') -%}
                {%- set ns.plain = false -%}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
    {%- set ranged = ns.plain and (s['minimum'] is defined or s['maximum'] is defined) -%}
    {%- if ns.plain and s['enum'] is defined -%}
        {%- if ranged or s['enum'] is string or s['enum'] is mapping
            or s['enum'] is not iterable or not s['enum'] -%}
            {%- set ns.plain = false -%}
        {%- else -%}
            {%- for value in s['enum'] -%}
                {{- hearth_value(value) }}{{- '' if loop.last else ' | ' }}
            {%- endfor -%}
        {%- endif -%}
    {%- elif ns.plain and s['type'] is defined -%}
        {%- if s['type'] is string and (not ranged or s['type'] in ['integer', 'number']) -%}
            {{- s['type'] }}
            {%- if s['minimum'] is defined and s['maximum'] is defined -%}
                {{- ' ' ~ (s['minimum'] | tojson) ~ '..' ~ (s['maximum'] | tojson) }}
            {%- elif s['minimum'] is defined -%}
                {{- ' >=' ~ (s['minimum'] | tojson) }}
            {%- elif s['maximum'] is defined -%}
                {{- ' <=' ~ (s['maximum'] | tojson) }}
            {%- endif -%}
        {%- elif s['type'] is not string and s['type'] is not mapping and s['type'] is iterable
            and s['type'] and not ranged -%}
            {%- for name in s['type'] -%}
                {{- name }}{{- '' if loop.last else ' | ' }}
            {%- endfor -%}
        {%- else -%}
            {%- set ns.plain = false -%}
        {%- endif -%}
    {%- elif ns.plain and not ranged -%}
        {{- 'any' }}
    {%- else -%}
        {%- set ns.plain = false -%}
    {%- endif -%}
    {%- if not ns.plain -%}
        {%- if top and s is mapping and s['description'] is defined -%}
            {{- '{' }}
            {%- for key, value in s.items() if key != 'description' -%}
                {{- key | tojson }}{{- ': ' }}{{- value | tojson }}{{- '' if loop.last else ', ' }}
            {%- endfor -%}
            {{- '}' }}
        {%- else -%}
            {{- s | tojson }}
        {%- endif -%}
    {%- endif -%}
{%- endmacro -%}
{%- macro hearth_array(s, top) -%}
    {%- set ns = namespace(plain=s is mapping and s['type'] is defined and s['type'] == 'array'
        and s['items'] is defined and s['items'] is mapping) -%}
    {%- if ns.plain -%}
        {%- for key in s -%}
            {%- if key not in ['type', 'items'] and not (top and key == 'description') -%}
                {%- set ns.plain = false -%}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
    {%- if ns.plain -%}
        {%- set item = hearth_leaf(s['items'], false) -%}
        {%- if ' ' in item and item != (s['items'] | tojson) -%}
            {{- '(' ~ item ~ ')[]' }}
        {%- else -%}
            {{- item ~ '[]' }}
        {%- endif -%}
    {%- else -%}
        {{- hearth_leaf(s, top) }}
    {%- endif -%}
{%- endmacro -%}
{%- macro hearth_param(s) -%}
    {%- set ns = namespace(plain=s is mapping and s['anyOf'] is defined
        and s['anyOf'] is not string and s['anyOf'] is not mapping
        and s['anyOf'] is iterable and s['anyOf']) -%}
    {%- if ns.plain -%}
        {%- for key in s -%}
            {%- if key not in ['anyOf', 'description'] -%}
                {%- set ns.plain = false -%}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
    {%- if ns.plain -%}
        {%- for option in s['anyOf'] -%}
            {{- hearth_array(option, false) }}{{- '' if loop.last else ' | ' }}
        {%- endfor -%}
    {%- else -%}
        {{- hearth_array(s, true) }}
    {%- endif -%}
{%- endmacro -%}
{%- macro hearth_tool(tool) -%}
    {%- set fn = tool.function if tool.function is defined else tool -%}
    {%- set p = fn.parameters if fn.parameters is defined and fn.parameters is not none else {} -%}
    {%- set props = p['properties'] if p is mapping and p['properties'] is defined else {} -%}
    {%- set required = p['required'] if p is mapping and p['required'] is defined else [] -%}
    {%- set ns = namespace(plain=p is mapping and props is mapping and required is not string
        and required is not mapping and required is iterable) -%}
    {%- if ns.plain -%}
        {%- for key in p -%}
            {%- if key not in ['type', 'properties', 'required', 'additionalProperties'] -%}
                {%- set ns.plain = false -%}
            {%- endif -%}
        {%- endfor -%}
        {%- if p['type'] is defined and p['type'] != 'object' -%}
            {%- set ns.plain = false -%}
        {%- endif -%}
        {%- if p['additionalProperties'] is defined and p['additionalProperties'] != false -%}
            {%- set ns.plain = false -%}
        {%- endif -%}
    {%- endif -%}
    {%- if ns.plain -%}
        {%- for name in required -%}
            {%- if name not in props -%}
                {%- set ns.plain = false -%}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
    {{- fn.name ~ '(' }}
    {%- if ns.plain -%}
        {%- for name, schema in props.items() -%}
            {{- name ~ ('' if name in required else '?') ~ ': ' }}{{- hearth_param(schema) }}
            {{- '' if loop.last else ', ' }}
        {%- endfor -%}
    {%- else -%}
        {{- p | tojson }}
    {%- endif -%}
    {{- ')' }}
    {%- if fn.description -%}
        {{- ' - ' ~ fn.description }}
    {%- endif -%}
    {%- if ns.plain -%}
        {%- for name, schema in props.items()
            if schema is mapping and schema['description'] is defined -%}
            {{- ' // ' ~ name ~ ': ' ~ schema['description'] }}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
""".replace("WORD_CHARACTERS", repr(WORD_CHARACTERS)).replace(
        "RESERVED_WORDS", repr(list(RESERVED_WORDS))
    )
)
"""Jinja macros that write one tool as its compact line (``hearth_tool``); a value is a
bare word where it cannot be read as anything but that string."""

HERMES_CHATML_TEMPLATE = (
    TOOL_MACROS + "{%- if hearth_house is defined and hearth_house %}"
    "{{- hearth_house }}"
    "{%- elif tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0].role == 'system' %}"
    "{{- messages[0].content + '\\n\\n' }}"
    "{%- endif %}"
    "{{- " + repr(TOOLS_INTRO) + " }}"
    "{%- for tool in tools %}{{- '\\n' + hearth_tool(tool) }}{%- endfor %}"
    "{{- " + repr(TOOLS_OUTRO) + " + '<|im_end|>\\n' }}"
    "{%- elif messages and messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}"
    "{%- if not loop.first %}"
    "{{- '<|im_start|>system\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- elif message.role == 'user' %}"
    "{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if message.content %}{{- message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls or [] %}"
    "{%- set fn = tool_call.function if tool_call.function is defined else tool_call %}"
    "{%- if loop.first and message.content %}{{- '\\n' }}{%- endif %}"
    "{%- if not loop.first %}{{- '\\n' }}{%- endif %}"
    '{{- \'<tool_call>\\n{"name": "\' + fn.name + \'", "arguments": \' }}'
    "{%- if fn.arguments is string %}{{- fn.arguments }}"
    "{%- else %}{{- fn.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}"
    "{{- '<|im_start|>user' }}"
    "{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""Jinja source of the Hermes-style ChatML template (used by every model Hearth builds).

``hearth_house``, where a renderer passes it, is this template's own text of the first
message and the tools, rendered before: it is written in their place, so a request of
a known house does not render the tools' lines again (server/prompts.py checks, per
house, that the text is the same both ways before it relies on it)."""


class ChatTemplateFileError(ValueError):
    """A ``--chat-template`` file that cannot be used. The message is one line."""


def read_chat_template(path: Path) -> str:
    """The Jinja source of a ``--chat-template`` file, compiled once to check its syntax.

    Missing, unreadable, empty, not UTF-8 or not valid Jinja: one line naming the file.
    """
    from jinja2 import TemplateError
    from transformers.utils.chat_template_utils import _compile_jinja_template

    where = f"--chat-template {path}"
    try:
        source = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ChatTemplateFileError(f"{where}: no such file") from None
    except IsADirectoryError:
        raise ChatTemplateFileError(f"{where}: is a folder, not a file") from None
    except OSError as err:
        raise ChatTemplateFileError(f"{where}: cannot read it ({err.strerror})") from None
    except UnicodeDecodeError:
        raise ChatTemplateFileError(f"{where}: not UTF-8 text") from None
    if not source.strip():
        raise ChatTemplateFileError(f"{where}: the file is empty")
    try:
        _compile_jinja_template(source)
    except TemplateError as err:
        line = getattr(err, "lineno", None)
        at = f" (line {line})" if line else ""
        raise ChatTemplateFileError(
            f"{where}: not a valid Jinja template{at}: {_first(err)}"
        ) from None
    return source


def _first(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
