"""The conversation platform: one agent per ``conversation`` subentry (thin; see entity.py)."""

from __future__ import annotations

from typing import Literal

from homeassistant.components import conversation
from homeassistant.components.conversation.models import AbstractConversationAgent
from homeassistant.const import CONF_LLM_HASS_API, CONF_PROMPT, MATCH_ALL
from homeassistant.core import HomeAssistant
from homeassistant.helpers import intent
from homeassistant.helpers.dispatcher import async_dispatcher_connect
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback

from .const import DOMAIN, LOGGER, SIGNAL_AGENT_OPTIONS_UPDATED, SUBENTRY_CONVERSATION
from .data import HearthConfigEntry
from .entity import HearthLLMEntity
from .errors import BACKEND_ERRORS, async_spoken, describe, error_key, is_auth_error
from .prefix.render import llm_api_ids
from .turn.ha_answer import async_ha_answer

# Conversations run concurrently: the engine batches them (and queues beyond its limit).
PARALLEL_UPDATES = 0


async def async_setup_entry(
    hass: HomeAssistant,
    entry: HearthConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    """Set up one conversation entity per conversation subentry."""
    for subentry in entry.subentries.values():
        if subentry.subentry_type != SUBENTRY_CONVERSATION:
            continue
        async_add_entities(
            [HearthConversationEntity(entry, subentry)],
            config_subentry_id=subentry.subentry_id,
        )


class HearthConversationEntity(
    conversation.ConversationEntity,
    AbstractConversationAgent,
    HearthLLMEntity,
):
    """Hearth conversation agent."""

    _attr_supports_streaming = True
    _failing = False  # the last turn failed (logged once until one works again)

    @property
    def supported_features(self) -> conversation.ConversationEntityFeature:
        """CONTROL when an LLM API is selected (options change without a reload)."""
        if self.options.get(CONF_LLM_HASS_API):
            return conversation.ConversationEntityFeature.CONTROL
        return conversation.ConversationEntityFeature(0)

    @property
    def supported_languages(self) -> list[str] | Literal["*"]:
        """Any language: the model decides."""
        return MATCH_ALL

    async def async_added_to_hass(self) -> None:
        """Register as an agent; follow option changes."""
        await super().async_added_to_hass()
        conversation.async_set_agent(self.hass, self.entry, self)
        self.async_on_remove(
            async_dispatcher_connect(
                self.hass,
                SIGNAL_AGENT_OPTIONS_UPDATED.format(self.subentry_id),
                self.async_write_ha_state,
            )
        )

    async def async_will_remove_from_hass(self) -> None:
        """Unregister the agent."""
        conversation.async_unset_agent(self.hass, self.entry)
        await super().async_will_remove_from_hass()

    async def _async_handle_message(
        self,
        user_input: conversation.ConversationInput,
        chat_log: conversation.ChatLog,
    ) -> conversation.ConversationResult:
        """Answer one user turn; engine errors become a spoken, translated error."""
        options = self.options
        try:
            await chat_log.async_provide_llm_data(
                user_input.as_llm_context(DOMAIN),
                llm_api_ids(self.hass, options),
                options.get(CONF_PROMPT),
                user_input.extra_system_prompt,
            )
        except conversation.ConverseError as err:
            return err.as_conversation_result()
        # An agent that may read the house first lets HA answer what its sentences ask.
        if chat_log.llm_api is not None and (
            answered := await async_ha_answer(self.hass, user_input, chat_log)
        ):
            return answered

        try:
            await self._async_handle_chat_log(chat_log, user_input.language)
        except BACKEND_ERRORS as err:
            # Logged when turns start failing and when they work again, not every turn.
            if not self._failing:
                LOGGER.warning("Hearth engine request failed: %s", err)
            else:
                LOGGER.debug("Hearth engine request failed again: %s", err)
            self._failing = True
            if is_auth_error(err):
                self.entry.async_start_reauth(self.hass)
            return await self._async_error_result(
                user_input, chat_log, error_key(err), describe(err)
            )
        if self._failing:
            LOGGER.info("Hearth engine requests work again")
            self._failing = False

        if chat_log.unresponded_tool_results:
            return await self._async_error_result(user_input, chat_log, "tool_loop_limit")
        return conversation.async_get_result_from_chat_log(user_input, chat_log)

    async def _async_error_result(
        self,
        user_input: conversation.ConversationInput,
        chat_log: conversation.ChatLog,
        key: str,
        error: str = "",
    ) -> conversation.ConversationResult:
        response = intent.IntentResponse(language=user_input.language)
        response.async_set_error(
            intent.IntentResponseErrorCode.UNKNOWN,
            await async_spoken(self.hass, user_input.language, key, error),
        )
        return conversation.ConversationResult(
            response=response, conversation_id=chat_log.conversation_id
        )
