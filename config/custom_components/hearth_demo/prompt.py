"""A response service that renders the Assist LLM API prompt and tools, to size the house.

`hearth_demo.render_prompt` returns what an LLM conversation agent puts in its stable
system prompt for the demo house: the Assist API prompt (instructions and the static
overview of exposed entities), the tools in OpenAI function format, and the worked
examples Hearth's agent pins for this house with those tools (``examples``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import probatio
from homeassistant.core import (
    HomeAssistant,
    ServiceCall,
    ServiceResponse,
    SupportsResponse,
)
from homeassistant.helpers import llm

from custom_components.hearth.prefix.examples import async_house_examples

from .const import ASSISTANT, DOMAIN, SERVICE_RENDER_PROMPT


def _tool_spec(tool: llm.Tool, serializer: Callable[[Any], Any] | None) -> dict[str, Any]:
    """The OpenAI function format, as HA's LLM integrations send it."""
    function: dict[str, Any] = {
        "name": tool.name,
        "parameters": probatio.to_openapi(
            tool.parameters, custom_serializer=serializer, openapi_version="3.1.0"
        ),
    }
    if tool.description:
        function["description"] = tool.description
    return {"type": "function", "function": function}


async def async_render_prompt(hass: HomeAssistant, call: ServiceCall) -> ServiceResponse:
    """Render the Assist API for a request without a satellite (no device, no area)."""
    context = llm.LLMContext(
        platform=DOMAIN,
        context=call.context,
        language=hass.config.language,
        assistant=ASSISTANT,
        device_id=None,
    )
    api = await llm.async_get_api(hass, llm.LLM_API_ASSIST, context)
    tools = sorted(
        (_tool_spec(tool, api.custom_serializer) for tool in api.tools),
        key=lambda spec: spec["function"]["name"],
    )
    examples = await async_house_examples(hass, tools)
    return {"prompt": api.api_prompt, "tools": tools, "examples": list(examples)}


def async_register_services(hass: HomeAssistant) -> None:
    """Register hearth_demo.render_prompt."""

    async def _handle(call: ServiceCall) -> ServiceResponse:
        return await async_render_prompt(hass, call)

    hass.services.async_register(
        DOMAIN,
        SERVICE_RENDER_PROMPT,
        _handle,
        schema=probatio.Schema({}),
        supports_response=SupportsResponse.ONLY,
    )
