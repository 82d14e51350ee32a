"""Was a request answered right? The format's rule, on Home Assistant's real states.

Before a request the home's entities are read; the expected states are those with the
test's ``expect_changes`` laid over them. After the request every entity of the home
must match the expected state, attribute by attribute: the expected change happened and
nothing else changed. Values compare loosely, as the format does (lists by items, then
equal, then equal as text; a volume written as a percentage on HA's 0-1 scale).
Ignored: the test's ``ignore_changes`` and attributes that only follow the state (a
cover's ``is_closed``; a light's colour attributes, which Home Assistant reports only
while it is on; a player's track metadata).

A request that expects changes is also wrong when the reply says "Sorry" (as in the
format's evaluation: that exact word, capitalised, which is what Assist says). A question
(no ``expect_changes``) is right when nothing changed and the reply contains one of the
``expect_response`` substrings (case-insensitive), if the test gives any. With
``expect_tool_call``, a request the model answered must also have called that tool (by
name, or by the ``..__name`` form Home Assistant gives intent tools); Home Assistant's
own matcher calls no tools, so its answers are judged by the rest.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .data import EntityState, Task

DERIVED_ATTRIBUTES = frozenset(
    {
        "is_closed",
        "is_opening",
        "is_closing",
        "color_mode",
        "hs_color",
        "rgb_color",
        "rgbw_color",
        "rgbww_color",
        "xy_color",
        "color_temp",
        "color_temp_kelvin",
        "media_title",
        "media_artist",
        "media_album_name",
    }
)


def same(a: Any, b: Any) -> bool:
    """Loose equality: sequences by items; enums, numbers and text by their text."""
    if isinstance(a, list | tuple) or isinstance(b, list | tuple):
        return isinstance(a, list | tuple) and isinstance(b, list | tuple) and list(a) == list(b)
    if isinstance(a, enum.Enum) or isinstance(b, enum.Enum):
        return str(getattr(a, "value", a)) == str(getattr(b, "value", b))
    return a == b or str(a) == str(b)


def flatten(state: Mapping[str, Any]) -> dict[str, Any]:
    """``{state, attributes}`` as one mapping (``state`` next to the attribute names)."""
    flat = dict(state.get("attributes") or {})
    if state.get("state") is not None:
        flat["state"] = state["state"]
    return flat


def expected_states(
    before: Mapping[str, Mapping[str, Any]], changes: Mapping[str, EntityState]
) -> dict[str, dict[str, Any]]:
    """The states before, with the expected changes applied (flattened)."""
    expected = {entity_id: flatten(state) for entity_id, state in before.items()}
    for entity_id, change in changes.items():
        entry = expected.setdefault(entity_id, {})
        entry.update(change.attributes)
        if change.state is not None:
            entry["state"] = change.state
    return expected


def on_scale(key: str, expected: Any, got: Any) -> Any:
    """``expected`` on Home Assistant's scale: a ``volume_level`` written as a
    percentage (above 1) is compared as HA's 0-1 (the demo takes either)."""
    if key != "volume_level" or isinstance(expected, bool):
        return expected
    try:
        level, now = float(expected), float(got)
    except (TypeError, ValueError):
        return expected
    return level / 100 if level > 1 >= now else expected


def differences(
    expected: Mapping[str, Any], got: Mapping[str, Any], ignored: set[str]
) -> dict[str, dict[str, Any]]:
    """``{key: {expected, got}}`` for each key that differs."""
    keys = (set(expected) | set(got)) - ignored - DERIVED_ATTRIBUTES
    return {
        key: {"expected": expected.get(key), "got": got.get(key)}
        for key in sorted(keys)
        if not same(on_scale(key, expected.get(key), got.get(key)), got.get(key))
    }


@dataclass
class Verdict:
    """The judgement of one request; ``why`` is empty when it is right."""

    correct: bool
    why: list[str] = field(default_factory=list)
    unexpected: dict[str, Any] = field(default_factory=dict)


def called(wanted: str, tools: Sequence[str]) -> bool:
    """``wanted`` is among the called tools, with or without a ``..__`` namespace."""
    bare = wanted.rsplit("__", 1)[-1]
    return any(tool.rsplit("__", 1)[-1] == bare for tool in tools)


def judge(
    task: Task,
    before: Mapping[str, Mapping[str, Any]],
    after: Mapping[str, Mapping[str, Any]],
    reply: str,
    tools: Sequence[str] | None = None,
) -> Verdict:
    """Judge one request from the home's states before and after it, its reply, and the
    tools the model called (None: no model answered, Home Assistant's matcher did)."""
    expected = expected_states(before, task.expect_changes or {})
    unexpected = {}
    for entity_id in sorted(set(expected) | set(after)):
        ignored = task.ignore_changes.get(entity_id, set())
        got = flatten(after.get(entity_id, {}))
        if diff := differences(expected.get(entity_id, {}), got, ignored):
            unexpected[entity_id] = diff
    why = [f"{entity_id}: {diff}" for entity_id, diff in unexpected.items()]
    if task.expect_changes and "Sorry" in reply:
        why.append("the reply says sorry")
    if task.expect_response and not any(
        want.lower() in reply.lower() for want in task.expect_response
    ):
        why.append(f"the reply has none of {list(task.expect_response)}")
    if task.expect_tool and tools is not None and not called(task.expect_tool, tools):
        why.append(f"{task.expect_tool} was not called (called: {list(tools)})")
    return Verdict(not why, why, unexpected)
