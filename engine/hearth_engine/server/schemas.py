"""Request validation (voluptuous) for the chat and prefix routes."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import voluptuous as vol
from aiohttp import web

from ..constraints.limits import DEFAULT_LIMITS, schema_bytes
from .errors import APIError, bad_request

# \Z, not $: "$" also matches before a final newline, which would let "name\n" through.
PIN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}\Z")
TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}\Z")
MAX_STOP = 4
MAX_STOP_LEN = 256
MAX_JSON_DEPTH = 64


def _strict_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise vol.Invalid("expected an integer")
    return value


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise vol.Invalid("expected a finite number")
    return float(value)


class UnsupportedError(vol.Invalid):
    """A parameter of OpenAI's API that Hearth does not implement (asking for it is a 400
    with code ``unsupported_parameter``, never silently ignored)."""

    code = "unsupported_parameter"


def _no_logprobs(value: Any) -> Any:
    """``logprobs``/``top_logprobs``: only their "off" values (no log probabilities)."""
    if value is None or value is False:
        return value
    raise UnsupportedError("log probabilities are not supported")


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise vol.Invalid("expected a string or a list of strings")
    if len(items) > MAX_STOP:
        raise vol.Invalid(f"at most {MAX_STOP} stop sequences")
    if any(len(s) > MAX_STOP_LEN for s in items):
        raise vol.Invalid(f"stop sequences are limited to {MAX_STOP_LEN} characters")
    return tuple(s for s in items if s)


def _content(value: Any) -> Any:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        for part in value:
            if not isinstance(part, dict) or part.get("type") not in ("text", "input_text"):
                raise vol.Invalid("only text content parts are supported")
            if not isinstance(part.get("text"), str):
                raise vol.Invalid("a text part needs a string 'text'")
        return value
    raise vol.Invalid("expected a string, null or a list of text parts")


def _json_depth(value: Any, depth: int = 0) -> int:
    if depth > MAX_JSON_DEPTH:
        raise vol.Invalid(f"nested deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, dict):
        return max((_json_depth(v, depth + 1) for v in value.values()), default=depth)
    if isinstance(value, list):
        return max((_json_depth(v, depth + 1) for v in value), default=depth)
    return depth


def _shallow(value: Any) -> Any:
    _json_depth(value)
    return value


TOOL_CALL = vol.Schema(
    {
        vol.Optional("id"): str,
        vol.Optional("type", default="function"): "function",
        vol.Optional("index"): _strict_int,
        vol.Required("function"): {
            vol.Required("name"): str,
            vol.Optional("arguments", default="{}"): vol.Any(str, dict),
        },
    }
)

MESSAGE = vol.Schema(
    {
        vol.Required("role"): vol.In(["system", "developer", "user", "assistant", "tool"]),
        vol.Optional("content"): _content,
        vol.Optional("name"): str,
        vol.Optional("tool_calls"): vol.Any(None, [TOOL_CALL]),
        vol.Optional("tool_call_id"): str,
    },
    extra=vol.REMOVE_EXTRA,
)

TOOL = vol.Schema(
    {
        vol.Required("type"): "function",
        vol.Required("function"): vol.Schema(
            {
                vol.Required("name"): vol.All(
                    str, vol.Match(TOOL_NAME_RE, msg="invalid tool name")
                ),
                vol.Optional("description"): str,
                vol.Optional("parameters"): vol.All(dict, _shallow),
                vol.Optional("strict"): bool,
            }
        ),
    }
)


def _tools(value: Any) -> Any:
    """The tools list within the grammar limits (docs/api.md): their count and the bytes
    of their parameter schemas together."""
    if value is None:
        return None
    limits = DEFAULT_LIMITS
    if isinstance(value, list) and len(value) > limits.max_tools:
        raise vol.Invalid(
            f"{len(value)} tools; at most {limits.max_tools} ({limits.named('max_tools')})"
        )
    tools = vol.Schema([TOOL])(value)
    size = sum(schema_bytes(t["function"].get("parameters", {})) for t in tools)
    if size > limits.max_schema_bytes:
        raise vol.Invalid(
            f"the tools' parameter schemas are {size} bytes of JSON; at most "
            f"{limits.max_schema_bytes} ({limits.named('max_schema_bytes')})"
        )
    return tools


SCHEMA_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")
ARGUMENT_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}\Z")
MAX_ARGUMENTS = 32  # narrowed argument names per request
MAX_ARGUMENT_TOOLS = 512
MAX_VALUES = 10_000  # values per argument
MAX_VALUE_LEN = 256


def _response_format(value: Any) -> dict[str, Any] | None:
    """OpenAI's ``response_format``: text, json_object, or json_schema (structured outputs)."""
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") not in (
        "text",
        "json_object",
        "json_schema",
    ):
        raise vol.Invalid("expected {'type': 'text' | 'json_object' | 'json_schema'}")
    if value["type"] != "json_schema":
        if set(value) != {"type"}:
            raise vol.Invalid(f"unexpected keys for type {value['type']!r}")
        return {"type": value["type"]}
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise vol.Invalid("type 'json_schema' needs a 'json_schema' object")
    unknown = set(spec) - {"name", "description", "schema", "strict"}
    if unknown:
        raise vol.Invalid(f"json_schema: unexpected keys {sorted(unknown)}")
    if not isinstance(spec.get("name"), str) or not SCHEMA_NAME_RE.match(spec["name"]):
        raise vol.Invalid("json_schema.name: 1-64 letters, digits, '_' or '-'")
    schema = spec.get("schema", {})
    if not isinstance(schema, dict):
        raise vol.Invalid("json_schema.schema must be a JSON schema object")
    _json_depth(schema)
    limits = DEFAULT_LIMITS
    if (size := schema_bytes(schema)) > limits.max_schema_bytes:
        raise vol.Invalid(
            f"json_schema.schema is {size} bytes of JSON; at most {limits.max_schema_bytes}"
            f" ({limits.named('max_schema_bytes')})"
        )
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise vol.Invalid("json_schema.strict must be a boolean")
    return {"type": "json_schema", "json_schema": {**spec, "schema": schema}}


# What the ``hearth`` request field takes, as ``/v1/stats`` lists it: a client can tell
# an engine that takes an empty list (an argument left out) from an older one.
HEARTH_EXTENSIONS = (
    "argument_values",
    "argument_tools",
    "empty_argument_values",
    "required_arguments",
)


def _argument_values(value: Any) -> dict[str, list[str]]:
    """``hearth.argument_values``: tool argument name -> the string values it may take."""
    if not isinstance(value, dict):
        raise vol.Invalid("expected an object of argument name -> list of strings")
    if len(value) > MAX_ARGUMENTS:
        raise vol.Invalid(f"at most {MAX_ARGUMENTS} argument names")
    out: dict[str, list[str]] = {}
    for name, values in value.items():
        if not ARGUMENT_NAME_RE.match(name):
            raise vol.Invalid(f"{name!r} is not a valid argument name")
        if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
            raise vol.Invalid(f"{name}: expected a list of non-empty strings")
        if len(values) > MAX_VALUES:
            raise vol.Invalid(f"{name}: at most {MAX_VALUES} values")
        if any(len(v) > MAX_VALUE_LEN for v in values):
            raise vol.Invalid(f"{name}: values are limited to {MAX_VALUE_LEN} characters")
        out[name] = list(dict.fromkeys(values))
    return out


def _hearth(value: Any) -> dict[str, Any] | None:
    """Hearth's request extension (docs/api.md): constraints from the house that are
    never rendered into the prompt."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise vol.Invalid("expected an object")
    known = ["argument_tools", "argument_values", "required_arguments"]
    unknown = set(value) - set(known)
    if unknown:
        raise vol.Invalid(f"unknown keys {sorted(unknown)}; known: {known}")
    out: dict[str, Any] = {}
    if value.get("argument_values") is not None:
        out["argument_values"] = _argument_values(value["argument_values"])
    if value.get("argument_tools") is not None:
        out["argument_tools"] = _argument_tools(value["argument_tools"])
    if value.get("required_arguments") is not None:
        out["required_arguments"] = _required_arguments(value["required_arguments"])
    return out


def _required_arguments(value: Any) -> tuple[str, ...]:
    """``hearth.required_arguments``: arguments a call must give (``Tool.arg`` or ``arg``)."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise vol.Invalid("required_arguments: expected a list of argument names")
    if len(value) > MAX_ARGUMENTS:
        raise vol.Invalid(f"required_arguments: at most {MAX_ARGUMENTS} names")
    for name in value:
        if not ARGUMENT_NAME_RE.match(name):
            raise vol.Invalid(f"required_arguments: {name!r} is not a valid argument name")
    return tuple(sorted(set(value)))


def _argument_tools(value: Any) -> tuple[str, ...]:
    """``hearth.argument_tools``: the tools that bare ``argument_values`` keys narrow."""
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise vol.Invalid("argument_tools: expected a list of tool names")
    if len(value) > MAX_ARGUMENT_TOOLS:
        raise vol.Invalid(f"argument_tools: at most {MAX_ARGUMENT_TOOLS} tools")
    return tuple(sorted(set(value)))


_NAMED_TOOL = vol.Schema(
    {vol.Required("type"): "function", vol.Required("function"): {vol.Required("name"): str}}
)
TOOL_CHOICE = vol.Any(
    vol.In(["auto", "none", "required"]),
    _NAMED_TOOL,
    # OpenAI's allowed tools: call only these (the prompt still shows every tool).
    vol.Schema(
        {
            vol.Required("type"): "allowed_tools",
            vol.Required("allowed_tools"): {
                vol.Required("mode"): vol.In(["auto", "required"]),
                vol.Required("tools"): vol.All([_NAMED_TOOL], vol.Length(min=1)),
            },
        }
    ),
)

CHAT_REQUEST = vol.Schema(
    {
        vol.Required("messages"): vol.All(
            [MESSAGE], vol.Length(min=1, msg="messages must not be empty")
        ),
        vol.Optional("model"): str,
        vol.Optional("tools"): _tools,
        vol.Optional("tool_choice"): TOOL_CHOICE,
        vol.Optional("parallel_tool_calls"): bool,
        vol.Optional("stream", default=False): bool,
        vol.Optional("stream_options"): vol.Any(None, {vol.Optional("include_usage"): bool}),
        vol.Optional("max_tokens"): vol.Any(None, vol.All(_strict_int, vol.Range(min=1))),
        # vLLM's extension: no end-of-sequence token before this many tokens.
        vol.Optional("min_tokens"): vol.Any(None, vol.All(_strict_int, vol.Range(min=0))),
        vol.Optional("max_completion_tokens"): vol.Any(
            None, vol.All(_strict_int, vol.Range(min=1))
        ),
        vol.Optional("temperature"): vol.Any(None, vol.All(_number, vol.Range(min=0, max=2))),
        vol.Optional("top_p"): vol.Any(
            None, vol.All(_number, vol.Range(min=0, max=1, min_included=False))
        ),
        vol.Optional("seed"): vol.Any(
            None, vol.All(_strict_int, vol.Range(min=-(2**63), max=2**64 - 1))
        ),
        vol.Optional("stop"): _stop,
        vol.Optional("n"): vol.All(_strict_int, vol.In([1], msg="only n=1 is supported")),
        vol.Optional("logprobs"): _no_logprobs,
        vol.Optional("top_logprobs"): _no_logprobs,
        vol.Optional("user"): str,
        vol.Optional("cache_salt"): vol.All(str, vol.Length(max=128)),
        vol.Optional("response_format"): _response_format,
        vol.Optional("hearth"): _hearth,
    },
    extra=vol.ALLOW_EXTRA,
)

PIN_REQUEST = vol.Schema(
    {
        vol.Required("messages"): vol.All(
            [MESSAGE], vol.Length(min=1, msg="messages must not be empty")
        ),
        vol.Optional("tools"): _tools,
        vol.Optional("hearth"): _hearth,
    },
    extra=vol.ALLOW_EXTRA,
)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json(raw: bytes) -> Any:
    """Strict JSON (no NaN/Infinity); any failure is a 400."""
    if not raw:
        raise bad_request("the request body is empty; send a JSON object", code="invalid_json")
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as err:
        detail = str(err) if isinstance(err, ValueError) else "nested too deeply"
        raise bad_request(
            f"the request body is not valid JSON: {detail}", code="invalid_json"
        ) from None


async def read_json(request: web.Request) -> Any:
    """The request body as strict JSON; a body that cannot be read or parsed is a 400.

    A body the HTTP layer cannot decode (a corrupt ``Content-Encoding``, a broken chunk)
    is the client's error, not the server's (it was a 500 with a logged traceback). The
    connection is closed afterwards: its framing cannot be trusted any more.
    """
    try:
        raw = await request.read()
    except web.RequestPayloadError as err:
        # The rest of the body is unreadable too: mark it finished, or aiohttp tries to
        # drain it after the response, meets the same error and logs it with a traceback.
        request.content.feed_eof()
        lines = str(err).strip().splitlines()
        detail = f": {lines[-1].strip()}" if lines else ""
        raise APIError(
            400,
            f"the request body cannot be read{detail}",
            code="invalid_json",
            close=True,
        ) from None
    return parse_json(raw)


def validate(schema: vol.Schema, data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise bad_request("the request body must be a JSON object", code="invalid_json")
    try:
        result: dict[str, Any] = schema(data)
        return result
    except vol.MultipleInvalid as err:
        first = err.errors[0]
        param = ".".join(str(p) for p in first.path) or None
        code = UnsupportedError.code if isinstance(first, UnsupportedError) else "invalid_value"
        message = f"{param}: {first.msg}" if param else first.msg
        raise bad_request(message, param=param, code=code) from None
    except RecursionError:
        raise bad_request("the request is nested too deeply") from None


def check_pin_name(name: str) -> str:
    if not PIN_NAME_RE.match(name):
        raise APIError(
            400,
            "invalid prefix name: use 1-128 letters, digits, '_', '-', '.', ':' "
            "(starting with a letter or digit)",
            param="name",
            code="invalid_name",
        )
    return name


def check_tool_references(messages: list[dict[str, Any]]) -> None:
    """A tool result must answer a tool call made earlier in the conversation."""
    known: set[str] = set()
    for i, message in enumerate(messages):
        for call in message.get("tool_calls") or []:
            if call.get("id"):
                known.add(call["id"])
        if message["role"] == "tool":
            ref = message.get("tool_call_id")
            if ref is not None and ref not in known:
                raise bad_request(
                    f"messages.{i}.tool_call_id: {ref!r} does not match any earlier tool call",
                    param=f"messages.{i}.tool_call_id",
                )
