"""Chat templates installed into the models Hearth prepares.

The default model (SmolLM2) ships a ChatML template that ignores ``tools``. Hearth
installs a Hermes-style ChatML template instead: tools are listed as JSON in the system
turn, the model answers with ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``
blocks, and tool results come back as ``<tool_response>`` blocks in a user turn (the
Qwen2.5 convention).

Cache friendliness matters more than anything here: the template renders every message
in order and never looks ahead, so the text of a conversation's first messages is a
byte prefix of the text of the whole conversation. A pinned ``[system + tools]`` prefix
is therefore a token prefix of every later request that starts with the same messages.
"""

from __future__ import annotations

from pathlib import Path

TOOLS_INTRO = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_OUTRO = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)

HERMES_CHATML_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0].role == 'system' %}"
    "{{- messages[0].content + '\\n\\n' }}"
    "{%- endif %}"
    "{{- " + repr(TOOLS_INTRO) + " }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
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
"""Jinja source of the Hermes-style ChatML template (used by every model Hearth builds)."""


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
