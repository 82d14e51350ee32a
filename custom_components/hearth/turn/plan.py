"""What a request sends besides its history: the prefix, its tools and its context.

HA renders a system prompt and a tool list for every request; Hearth sends a pinned
prefix instead and must not lose anything HA would have given the model:

- lines of HA's prompt that the prefix lacks (the time, the satellite's area, the
  ``extra_system_prompt``) go to the turn's context message (``turn/prompt.py``);
- while a re-pin is pending, the pinned prefix describes an older house. Its static
  context lines are not re-sent; the context message states the changes as sentences
  instead (``house/diff.py``), and tools HA offers now that the pinned prefix lacks (a
  new script, say) are offered after the prefix's tools, so the prefix's tokens still
  come first. A tool of the prefix that HA no longer offers is named as gone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from homeassistant.core import HomeAssistant
from homeassistant.helpers import llm

from ..house.diff import describe_changes
from ..house.listing import replace_yaml
from ..house.values import house_values
from ..pins.model import PrefixChoice
from ..prefix.render import format_tool
from ..prefix.value import HousePrefix
from ..tool_names import model_tool_names, with_shown_names
from .prompt import volatile_lines


@dataclass(frozen=True, slots=True)
class RequestPlan:
    """The fixed parts of every request of a turn."""

    prefix: HousePrefix
    tools: tuple[dict[str, Any], ...]
    hearth: dict[str, Any] | None
    context: str
    pin: str | None


def tool_name(tool: dict[str, Any]) -> str:
    """The name of an OpenAI function tool."""
    return str((tool.get("function") or {}).get("name", ""))


def plan_request(
    hass: HomeAssistant,
    choice: PrefixChoice,
    system_prompt: str,
    llm_api: llm.APIInstance | None,
) -> RequestPlan:
    """The prefix, tools, grammar values and context message of a request.

    ``system_prompt`` and ``llm_api`` are what HA prepared for this request (no API:
    no tools to compare).
    """
    sent = choice.sent
    told: frozenset[str] = frozenset()
    if (choice.stale or sent.base is not None) and choice.fresh.house is not None:
        told = choice.fresh.house.listing_lines  # told as sentences (below, or in the prefix)
    if llm_api is not None:  # the pin names tools as the model sees them (tool_names.py)
        system_prompt = with_shown_names(
            system_prompt, model_tool_names(tool.name for tool in llm_api.tools)
        )
    if (house := choice.fresh.house) is not None:  # listed as the pin lists it
        system_prompt = replace_yaml(system_prompt, house.yaml, house.listing)
    lines = volatile_lines(system_prompt, sent.stable_text, told)
    if choice.stale and sent.house is not None and choice.fresh.house is not None:
        lines += describe_changes(sent.house, choice.fresh.house)
    tools = list(sent.tools)
    if llm_api is not None:
        offered = {tool_name(tool) for tool in sent.tools}
        shown = model_tool_names(tool.name for tool in llm_api.tools)
        now = set(shown.values())
        tools += sorted(
            (
                format_tool(tool, llm_api.custom_serializer, shown[tool.name])
                for tool in llm_api.tools
                if shown[tool.name] not in offered
            ),
            key=tool_name,
        )
        lines += [f"The tool {name} is no longer available." for name in sorted(offered - now)]
    if tuple(tools) == choice.fresh.tools:
        hearth = choice.fresh.hearth  # computed with the render
    else:
        hearth = house_values(hass, tools) if tools else None
    return RequestPlan(
        prefix=sent, tools=tuple(tools), hearth=hearth, context="\n".join(lines), pin=choice.pin
    )
