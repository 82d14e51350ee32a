"""The AI Task platform: ``ai_task.generate_data`` through Hearth (one per subentry).

A task runs through the same request path as a conversation turn (turn/run.py): a
stable prefix first (HA's AI Task instructions, plus an LLM API's prompt and tools when a
caller passes one), then the volatile context (date and time) and the task's
instructions. When the task asks for a structure, the request carries an OpenAI
``json_schema`` response format, so the engine's grammar only lets the model write JSON
that fits it; the reply is still parsed and validated against HA's own schema, and a
reply that does not fit (cut short by the token limit, say) fails with a clear error.
The engine reads text only, so attachments are not offered (HA refuses them).
"""

from __future__ import annotations

import json
from typing import Any, override

import probatio
from homeassistant.components import ai_task, conversation
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers import llm
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback
from homeassistant.util import slugify

from .const import DOMAIN, LOGGER, SUBENTRY_AI_TASK
from .data import HearthConfigEntry
from .entity import HearthLLMEntity
from .errors import BACKEND_ERRORS, as_ha_error, is_auth_error
from .pins.model import PrefixChoice
from .prefix.render import ai_task_options, async_render_prefix, canonical_schema
from .turn.prompt import HearthNative

# Tasks run concurrently: the engine batches them (and queues beyond its limit).
PARALLEL_UPDATES = 0

# ``format`` values the engine's JSON schema compiler knows. HA's selectors add their
# own (``entity_id``, ``RFC 5646``, ...), which the engine refuses; ``format`` is an
# annotation in JSON Schema, so dropping it keeps the schema's meaning.
SUPPORTED_FORMATS = frozenset(
    {"date", "date-time", "duration", "email", "hostname", "ipv4", "ipv6", "time", "uri", "uuid"}
)
# HA formats the grammar can still enforce, as a pattern: an entity selector's value is
# then an entity ID by construction (HA's validation would refuse anything else).
# The same rule as ``valid_entity_id``, without look-arounds: lower-case words joined
# by single underscores, on both sides of the dot.
_WORDS = "[a-z0-9]+(_[a-z0-9]+)*"
FORMAT_PATTERNS = {"entity_id": f"^{_WORDS}\\.{_WORDS}$"}
_MAX_SCHEMA_NAME = 64  # OpenAI's limit on ``json_schema.name``


async def async_setup_entry(
    hass: HomeAssistant,
    entry: HearthConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    """Set up one AI Task entity per ``ai_task_data`` subentry."""
    for subentry in entry.subentries.values():
        if subentry.subentry_type != SUBENTRY_AI_TASK:
            continue
        async_add_entities(
            [HearthTaskEntity(entry, subentry)],
            config_subentry_id=subentry.subentry_id,
        )


def response_format(
    name: str, structure: probatio.Schema, llm_api: llm.APIInstance | None
) -> dict[str, Any]:
    """The OpenAI ``json_schema`` response format of a task's structure.

    Converted the way HA core's LLM integrations convert it (``probatio.to_openapi``
    with the selector serializer), in the canonical form the prefix's tools use.
    """
    schema = probatio.to_openapi(
        structure,
        custom_serializer=llm_api.custom_serializer if llm_api else llm.selector_serializer,
        openapi_version="3.1.0",
    )
    return {
        "type": "json_schema",
        "json_schema": {
            "name": (slugify(name) or "data")[:_MAX_SCHEMA_NAME],
            "schema": canonical_schema(engine_formats(schema)),
            "strict": True,
        },
    }


def engine_formats(value: Any) -> Any:
    """``value`` with every string ``format`` the engine knows, or as a pattern, or dropped."""
    if isinstance(value, list):
        return [engine_formats(item) for item in value]
    if not isinstance(value, dict):
        return value
    result = {key: engine_formats(item) for key, item in value.items()}
    fmt = result.get("format")
    if isinstance(fmt, str) and fmt not in SUPPORTED_FORMATS:
        del result["format"]
        if fmt in FORMAT_PATTERNS:
            result.setdefault("pattern", FORMAT_PATTERNS[fmt])
    return result


def parse_structured(text: str, structure: probatio.Schema) -> Any:
    """The reply as data that fits ``structure``; a translated error otherwise."""
    try:
        data = json.loads(text)
        structure(data)
    except (ValueError, probatio.Invalid) as err:
        raise HomeAssistantError(
            translation_domain=DOMAIN,
            translation_key="invalid_structured_reply",
            translation_placeholders={"error": str(err)},
        ) from err
    return data


class HearthTaskEntity(ai_task.AITaskEntity, HearthLLMEntity):
    """A Hearth AI Task entity: generates text or structured data."""

    _attr_supported_features = ai_task.AITaskEntityFeature.GENERATE_DATA
    _device_model = "AI Task"
    _read_first_default = False  # instructions, not a spoken question
    _failing = False  # the last task failed (logged once until one works again)

    @override
    async def _async_prefix_choice(self, chat_log: conversation.ChatLog) -> PrefixChoice:
        """HA's fixed AI Task instructions, plus the prompt and tools of the task's API.

        Rendered by the same code as an agent's house prefix, so it is byte-identical
        for every task; the date and time of HA's prompt travel in the context message.
        Without an API it is the subentry's pin (pins/manager.py); a task that passes an API
        gets its own render, unpinned (the engine's prefix cache still reuses it).
        """
        if chat_log.llm_api is None:
            return await self.entry.runtime_data.prefixes.async_prefix_for_request(self.subentry_id)
        prefix = await async_render_prefix(self.hass, ai_task_options([chat_log.llm_api.api.id]))
        return PrefixChoice(prefix, prefix, None)

    @override
    async def _async_generate_data(
        self,
        task: ai_task.GenDataTask,
        chat_log: conversation.ChatLog,
    ) -> ai_task.GenDataTaskResult:
        """Run the task; parse and validate the reply when a structure is asked for."""
        if task.attachments:  # not offered (no SUPPORT_ATTACHMENTS); HA checks it first
            raise HomeAssistantError(
                translation_domain=DOMAIN, translation_key="attachments_unsupported"
            )
        fmt = (
            response_format(task.name, task.structure, chat_log.llm_api) if task.structure else None
        )
        try:
            await self._async_handle_chat_log(chat_log, response_format=fmt)
        except BACKEND_ERRORS as err:
            # Logged when tasks start failing and when they work again, not every task.
            if not self._failing:
                LOGGER.warning("Hearth engine request failed for an AI Task: %s", err)
            else:
                LOGGER.debug("Hearth engine request failed again for an AI Task: %s", err)
            self._failing = True
            if is_auth_error(err):
                self.entry.async_start_reauth(self.hass)
            raise as_ha_error(err) from err
        if self._failing:
            LOGGER.info("Hearth engine requests work again for AI Tasks")
            self._failing = False
        if chat_log.unresponded_tool_results:
            raise HomeAssistantError(translation_domain=DOMAIN, translation_key="tool_loop_limit")
        text = _reply_text(chat_log)
        data = parse_structured(text, task.structure) if task.structure else text
        return ai_task.GenDataTaskResult(conversation_id=chat_log.conversation_id, data=data)


def _reply_text(chat_log: conversation.ChatLog) -> str:
    """The text of the last reply as the engine wrote it.

    The chat log's content is what would be spoken (tool markup filtered out); the
    ``native`` message is the exact text, which is what a structure is parsed from.
    """
    last = chat_log.content[-1]
    if not isinstance(last, conversation.AssistantContent):
        raise HomeAssistantError(translation_domain=DOMAIN, translation_key="no_reply")
    if isinstance(last.native, HearthNative):
        return str(last.native.message.get("content") or "")
    return last.content or ""
