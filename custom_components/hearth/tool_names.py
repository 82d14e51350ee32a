"""The names the model sees for Home Assistant's tools."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping


def bare_name(name: str) -> str:
    """A tool's name without HA's namespace (``HassTurnOn`` for ``intent__HassTurnOn``)."""
    return name.rsplit("__", 1)[-1]


def model_tool_names(names: Iterable[str]) -> dict[str, str]:
    """HA tool name -> the name the model sees.

    HA namespaces its tools (``climate__HassClimateSetTemperature``,
    ``intent__HassSetPosition``). A small model picks a tool token by token, and with
    most names starting ``intent`` it picks by that prefix. So each tool is shown by its
    bare name where that is unique among ``names`` (the same name twice keeps both full
    names); a call by the bare name runs HA's tool (``entity.resolve_tool_name``). On
    the accuracy bench this took the default model from 35 to 45 of 71 (README,
    "Accuracy")."""
    names = list(names)
    bare = [bare_name(name) for name in names]
    return {
        name: short if short and bare.count(short) == 1 else name
        for name, short in zip(names, bare, strict=True)
    }


def with_shown_names(text: str, shown: Mapping[str, str]) -> str:
    """``text`` (HA's API prompt) naming each tool as the model sees it: HA's prompt says
    "Use intent__HassTurnOn to lock", and the model is shown ``HassTurnOn``."""
    for name, seen in sorted(shown.items(), key=lambda item: -len(item[0])):
        if name != seen:
            text = re.sub(rf"\b{re.escape(name)}\b", seen, text)
    return text
