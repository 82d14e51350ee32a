"""The stable house prefix of an agent: what every request starts with, byte for byte.

The *house prefix* is one system message (the instructions plus the LLM API prompt,
which carries the static context of the exposed entities), the worked examples that
follow it (``prefix/examples.py``, an agent option), a short system message with the lines of
its device class (``house/device_class.py``) and the API's tools sorted by name. It is
rendered with a canonical LLM context (no user, no time, and no device or a device of
the prefix's class, without its area line), so it does not depend on who speaks, from
where or when. The classes' prefixes share every token up to their class lines.
Anything per-request goes into the volatile suffix (see ``turn/prompt.py`` and
``turn/plan.py``). The rendered value, ``HousePrefix``, is ``prefix/value.py``'s. Pinning
it in the engine and keeping it current is the job of ``pins/``; this module only renders.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

import probatio
from homeassistant.components import conversation
from homeassistant.components.ai_task.const import DEFAULT_SYSTEM_PROMPT as AI_TASK_SYSTEM_PROMPT
from homeassistant.const import CONF_LLM_HASS_API, CONF_PROMPT
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import HomeAssistantError, TemplateError
from homeassistant.helpers import llm, template

from ..const import CONF_EXAMPLES, DEFAULT_EXAMPLES, DOMAIN, LOGGER, SUBENTRY_AI_TASK
from ..house.device_class import DeviceClass, split_class_lines, variant_devices
from ..house.diff import HouseSnapshot, capture
from ..house.listing import replace_yaml
from ..house.values import house_values
from ..tool_names import model_tool_names, with_shown_names
from .examples import async_house_examples
from .value import HousePrefix

# Template variables that differ per request (see ChatLog.async_provide_llm_data).
_PER_REQUEST_VARIABLES = re.compile(r"\b(user_name|llm_context)\b")


# JSON Schema keywords whose list is a set: order carries no meaning.
_SET_KEYWORDS = frozenset({"enum", "required"})


def canonical_schema(value: Any) -> Any:
    """``value`` with every set-like list (``enum``, ``required``) sorted.

    HA builds some of these lists from Python sets (the volume step's ``up``/``down``,
    say), whose order changes from one Home Assistant process to the next with string
    hash randomization: unsorted, a mere restart would change the prefix and re-pin it.
    """
    if isinstance(value, dict):
        return {
            key: (
                sorted(item, key=lambda x: (type(x).__name__, str(x)))
                if key in _SET_KEYWORDS
                and isinstance(item, list)
                and all(isinstance(x, (str, int, float, bool)) or x is None for x in item)
                else canonical_schema(item)
            )
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [canonical_schema(item) for item in value]
    return value


def format_tool(
    tool: llm.Tool, custom_serializer: Callable[[Any], Any] | None, name: str | None = None
) -> dict[str, Any]:
    """An HA LLM tool as an OpenAI function tool named ``name`` (default: its own), in
    a canonical form (see above)."""
    spec: dict[str, Any] = {
        "name": name or tool.name,
        "parameters": canonical_schema(
            probatio.to_openapi(
                tool.parameters, custom_serializer=custom_serializer, openapi_version="3.1.0"
            )
        ),
    }
    if tool.description:
        spec["description"] = tool.description
    return {"type": "function", "function": spec}


def render_options(subentry_type: str, data: Mapping[str, Any]) -> Mapping[str, Any]:
    """What a subentry's prefix is rendered from: an agent's options, or for an AI Task
    HA's fixed AI Task instructions and no LLM API (a task that passes one renders its
    own prefix, see ai_task.py)."""
    if subentry_type == SUBENTRY_AI_TASK:
        return ai_task_options([])
    return data


def ai_task_options(api_ids: list[str]) -> dict[str, Any]:
    """Render options of an AI Task prefix with the LLM APIs ``api_ids`` (no worked
    examples: a task generates data, it is not a spoken turn)."""
    return {CONF_PROMPT: AI_TASK_SYSTEM_PROMPT, CONF_LLM_HASS_API: api_ids, CONF_EXAMPLES: False}


def llm_api_ids(hass: HomeAssistant, options: Mapping[str, Any]) -> list[str]:
    """The agent's selected LLM APIs that exist now."""
    selected = options.get(CONF_LLM_HASS_API) or []
    if isinstance(selected, str):
        selected = [selected]
    available = {api.id for api in llm.async_get_apis(hass)}
    return [api_id for api_id in selected if api_id in available]


def canonical_llm_context(hass: HomeAssistant, device_id: str | None = None) -> llm.LLMContext:
    """The LLM context of the prefix: no user, the house's language, and no device or
    one device of the prefix's class (house/device_class.py)."""
    return llm.LLMContext(
        platform=DOMAIN,
        context=None,
        language=hass.config.language,
        assistant=conversation.DOMAIN,
        device_id=device_id,
    )


def _render_static_instructions(
    hass: HomeAssistant, source: str, llm_context: llm.LLMContext
) -> str | None:
    """The instructions as HA renders them, or None if they vary per request.

    Instructions that read the time, states, the user or the LLM context (device)
    stay out of the prefix; the per-request system prompt still has them, so they
    reach the model through the volatile suffix.
    """
    if _PER_REQUEST_VARIABLES.search(source):
        return None
    variables = {
        "ha_name": hass.config.location_name,
        "user_name": None,
        "llm_context": llm_context,
    }
    tpl = template.Template(source, hass)
    info = tpl.async_render_to_info(variables, parse_result=False)
    if (
        info.exception is not None
        or info.has_time
        or info.all_states
        or info.all_states_lifecycle
        or info.entities
        or info.domains
        or info.domains_lifecycle
    ):
        return None
    try:
        text: str = tpl.async_render(variables, parse_result=False)
    except TemplateError:
        return None
    return text


async def async_render_prefix(
    hass: HomeAssistant,
    options: Mapping[str, Any],
    cls: DeviceClass = DeviceClass.NONE,
    device_id: str | None = None,
    max_chars: int | None = None,
) -> HousePrefix:
    """Render an agent's house prefix from its options (same text HA would render).

    For a device class other than ``NONE``, ``device_id`` is a device of that class:
    HA renders the class's lines and tools for it, and its area line is left out (it
    goes to the context message), so any device of the class gets the same prefix.
    The lines in which the classes in use differ close the prefix (``class_lines``).

    The house is listed compactly (``house/listing.py``). Where the prefix's data would
    be longer than ``max_chars``, its listing leaves out what matters least
    (``HouseSnapshot.left_out``; ``pins/renders.py`` sizes ``max_chars`` from the model's
    context).
    """
    llm_context = canonical_llm_context(hass, None if cls is DeviceClass.NONE else device_id)
    house = capture(hass)
    parts: list[str] = []
    source = options.get(CONF_PROMPT) or llm.DEFAULT_INSTRUCTIONS_PROMPT
    if (instructions := _render_static_instructions(hass, source, llm_context)) is not None:
        parts.append(instructions)
    tools: tuple[dict[str, Any], ...] = ()
    class_lines = ""
    listed = False
    if api_ids := llm_api_ids(hass, options):
        try:
            api = await llm.async_get_api(hass, api_ids, llm_context)
        except HomeAssistantError as err:
            LOGGER.warning("Cannot prepare the LLM API %s: %s", api_ids, err)
        else:
            shown = model_tool_names(tool.name for tool in api.tools)
            api_prompt, class_lines = await _async_split_classes(
                hass,
                api_ids,
                house,
                with_shown_names(api.api_prompt, shown),
                shown,
                cls=cls,
                device_id=device_id,
            )
            listed = bool(house.listing) and api_prompt.count(house.listing) == 1
            parts.append(api_prompt)
            tools = tuple(
                sorted(
                    (
                        format_tool(tool, api.custom_serializer, shown[tool.name])
                        for tool in api.tools
                    ),
                    key=lambda spec: str(spec["function"]["name"]),
                )
            )
    hearth = house_values(hass, tools) if tools else None
    examples: tuple[dict[str, Any], ...] = ()
    if tools and options.get(CONF_EXAMPLES, DEFAULT_EXAMPLES):
        examples = await async_house_examples(hass, tools, hass.config.language)
    prefix = HousePrefix(
        system="\n".join(parts),
        tools=tools,
        examples=examples,
        class_lines=class_lines,
        hearth=hearth,
        house=house if tools else None,
    )
    if max_chars is None or not listed or len(prefix.data) <= max_chars:
        return prefix
    return _fitted(prefix, house, max_chars)


def _fitted(prefix: HousePrefix, house: HouseSnapshot, max_chars: int) -> HousePrefix:
    """``prefix`` with its house listing cut so that its data fits ``max_chars``
    (``house_listing.fit``: read-only things first, the last areas first). The worked
    examples stay unless the prefix cannot fit with them even listing nothing: a small
    model needs them for every command, and a thing left out only for those naming it."""
    rest = len(prefix.data) - _json_len(house.listing)
    if rest > max_chars and prefix.examples:
        prefix = dataclasses.replace(prefix, examples=())
        rest = len(prefix.data) - _json_len(house.listing)
        if rest + _json_len(house.listing) <= max_chars:
            return prefix
    fitted = house.fitted(lambda listing: rest + _json_len(listing) <= max_chars)
    return dataclasses.replace(
        prefix, system=prefix.system.replace(house.listing, fitted.listing, 1), house=fitted
    )


def _json_len(text: str) -> int:
    """The length of ``text`` in the prefix's data (a JSON string, less its quotes)."""
    return len(json.dumps(text, ensure_ascii=False)) - 2


async def _async_split_classes(
    hass: HomeAssistant,
    api_ids: list[str],
    house: HouseSnapshot,
    prompt: str,
    shown: Mapping[str, str],
    *,
    cls: DeviceClass,
    device_id: str | None,
) -> tuple[str, str]:
    """``prompt`` (the API prompt for ``cls``) with ``house`` listed, as the lines that
    every class shares, and its class's own lines (``device_class.split_class_lines``)."""

    def listed(text: str) -> str:
        return replace_yaml(with_shown_names(text, shown), house.yaml, house.listing)

    prompt = replace_yaml(prompt, house.yaml, house.listing)
    renders: dict[str | None, str] = {device_id if cls is not DeviceClass.NONE else None: prompt}
    for other in (None, *variant_devices(hass)):
        if other not in renders:
            api = await llm.async_get_api(hass, api_ids, canonical_llm_context(hass, other))
            renders[other] = listed(api.api_prompt)
    return split_class_lines(prompt, renders[None], renders.values())
