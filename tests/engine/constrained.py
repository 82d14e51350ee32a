"""Shared by the constrained-decoding tests: tools a random model can finish (enums and
bounded integers, no free strings or arrays it would never close) and a small checker
of JSON values against those schemas and Home Assistant's (``anyOf``, arrays, numbers;
``jsonschema`` is not a dependency)."""

from __future__ import annotations

import json
from typing import Any

ROOMS = ["Kitchen", "Hall", "Bedroom"]
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "HassTurnOn",
            "description": "Turn on a device",
            "parameters": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "area": {"type": "string", "enum": ROOMS},
                    "brightness": {"type": "integer", "minimum": 0, "maximum": 100},
                },
                "required": ["area"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "HassSetMode",
            "description": "Set a climate mode",
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {
                    "mode": {"type": "string", "enum": ["eco", "comfort", "away"]},
                    "boost": {"type": "boolean"},
                },
                "required": ["mode", "boost"],
                "additionalProperties": False,
            },
        },
    },
]
HOUSE_NAMES = ["Kitchen Light", "Porch Lamp"]


def schema_errors(value: Any, schema: dict[str, Any], path: str = "$") -> list[str]:
    """What in ``value`` breaks ``schema`` (type, enum, range, required, extra keys)."""
    errors: list[str] = []
    if "anyOf" in schema:
        options = [schema_errors(value, option, path) for option in schema["anyOf"]]
        if all(options):
            return [f"{path}: no option of anyOf fits {value!r}: {options}"]
    kind = schema.get("type")
    checks = {
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
    }
    if kind is not None and not checks[kind](value):
        return [f"{path}: not {kind}: {value!r}"]
    if kind == "array" and "items" in schema:
        for i, item in enumerate(value):
            errors.extend(schema_errors(item, schema["items"], f"{path}[{i}]"))
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} not in {schema['enum']}")
    if "minimum" in schema and value < schema["minimum"]:
        errors.append(f"{path}: {value} < {schema['minimum']}")
    if "maximum" in schema and value > schema["maximum"]:
        errors.append(f"{path}: {value} > {schema['maximum']}")
    if kind == "object":
        props = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                errors.append(f"{path}: missing {key!r}")
        for key, item in value.items():
            if key in props:
                errors.extend(schema_errors(item, props[key], f"{path}.{key}"))
            elif schema.get("additionalProperties") is False:
                errors.append(f"{path}: unexpected {key!r}")
    return errors


def call_errors(name: str, arguments: str, tools: list[dict[str, Any]] = TOOLS) -> list[str]:
    """Why a tool call (name, JSON arguments text) is not a valid call of ``tools``."""
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    if name not in schemas:
        return [f"unknown tool {name!r}"]
    try:
        args = json.loads(arguments)
    except ValueError:
        return [f"arguments are not JSON: {arguments!r}"]
    return schema_errors(args, schemas[name])
