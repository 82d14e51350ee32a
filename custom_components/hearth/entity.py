"""Base entities of the Hearth integration; the LLM entity adapts Home Assistant's chat
log to a turn (turn/prepare.py: understand, decide, call, speak; turn/run.py: the
requests) and records what the turn used."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from homeassistant.components import conversation
from homeassistant.config_entries import ConfigSubentry
from homeassistant.core import callback
from homeassistant.helpers.entity import Entity

from .backend.chat import EngineStalled
from .const import (
    CONF_MAX_HISTORY,
    DEFAULT_MAX_HISTORY,
    DEFAULT_READ_FIRST,
    DOMAIN,
)
from .data import AgentStats, HearthConfigEntry, TurnUsage
from .engine_device import agent_device_info
from .errors import BACKEND_ERRORS, describe
from .pins.model import PrefixChoice
from .turn.context_fit import ContextFit
from .turn.decide import Capabilities
from .turn.plan import RequestPlan, plan_request
from .turn.prepare import async_prepare_turn
from .turn.run import Agent, TurnRun, async_run_turn


class HearthLLMEntity(Entity):
    """A Hearth LLM entity: a conversation agent or an AI Task (one per subentry)."""

    _attr_has_entity_name = True
    _attr_name = None
    _device_model = "Conversation agent"

    def __init__(self, entry: HearthConfigEntry, subentry: ConfigSubentry) -> None:
        """Initialize the agent of ``subentry``."""
        self.entry = entry
        self.subentry_id = subentry.subentry_id
        self._attr_unique_id = subentry.subentry_id
        self._attr_device_info = agent_device_info(entry, subentry, self._device_model)

    @property
    def available(self) -> bool:
        """Unavailable while the engine does not answer its polls."""
        return self.entry.runtime_data.coordinator.last_update_success

    async def async_added_to_hass(self) -> None:
        """Follow the engine's polls (availability)."""
        await super().async_added_to_hass()
        coordinator = self.entry.runtime_data.coordinator
        self.async_on_remove(coordinator.async_add_listener(self.async_write_ha_state))

    # Whether a question reads the house first where the options do not say (ai_task.py: no)
    _read_first_default = DEFAULT_READ_FIRST

    @property
    def options(self) -> Mapping[str, Any]:
        """The agent's current options (read fresh: they change without a reload)."""
        return self.entry.subentries[self.subentry_id].data

    async def _async_prefix_choice(self, chat_log: conversation.ChatLog) -> PrefixChoice:
        """The stable prefix the requests of this turn start with: the agent's pin for
        the class of the speaking device (house/device_class.py)."""
        return await self.entry.runtime_data.prefixes.async_prefix_for_request(
            self.subentry_id, _device_id(chat_log)
        )

    async def _async_plan(
        self, chat_log: conversation.ChatLog, without_examples: bool = False
    ) -> RequestPlan:
        """Prefix, tools and context message of this turn's requests (turn/plan.py);
        ``without_examples``: never a pinned prefix that still has worked examples (its
        re-pin without them failed), the fresh render instead."""
        choice = await self._async_prefix_choice(chat_log)
        if without_examples and choice.sent.examples:
            choice = PrefixChoice(choice.fresh, choice.fresh, None)
        first = chat_log.content[0] if chat_log.content else None
        system_prompt = first.content if isinstance(first, conversation.SystemContent) else ""
        return plan_request(self.hass, choice, system_prompt, chat_log.llm_api)

    async def _async_handle_chat_log(
        self,
        chat_log: conversation.ChatLog,
        language: str | None = None,
        response_format: Mapping[str, Any] | None = None,
    ) -> TurnUsage:
        """Run the turn of the chat log's last user message (turn/prepare.py, then
        turn/run.py; ``response_format``: an AI Task's structure); record its usage."""
        data = self.entry.runtime_data
        plan = await self._async_plan(chat_log)
        history = int(self.options.get(CONF_MAX_HISTORY, DEFAULT_MAX_HISTORY))
        run = TurnRun(plan, ContextFit(history))
        turn = await async_prepare_turn(
            self.hass,
            chat_log,
            plan,
            language=language or self.hass.config.language,
            options=self.options,
            caps=Capabilities.of(data.backend.narrows_tools),
            read_first=self._read_first_default,
            spoken=response_format is None,
        )

        async def without_examples() -> RequestPlan:
            await data.prefixes.async_leave_out_examples(self.subentry_id, _device_id(chat_log))
            return await self._async_plan(chat_log, without_examples=True)

        agent = Agent(
            self.hass, self.entity_id, lambda: self.options, data.coordinator, without_examples
        )
        error: Exception | None = None
        try:
            await async_run_turn(chat_log, agent, turn, run, response_format=response_format)
        except BACKEND_ERRORS as err:
            error = err
            raise
        finally:
            usage = TurnUsage(agent_id=self.entity_id, requests=tuple(run.requests))
            self._async_record_turn(usage, error)
            chat_log.async_trace({"hearth": {**run.as_trace(turn), **usage.as_dict()}})
        return usage

    @callback
    def _async_record_turn(self, turn: TurnUsage, error: Exception | None) -> None:
        """Push the turn's figures to the sensors; refresh the engine's counters soon."""
        data = self.entry.runtime_data
        stats = data.agents.setdefault(self.subentry_id, AgentStats())
        stats.requests += 1
        if error is not None:
            stats.errors += 1
            stats.stalls += isinstance(error, EngineStalled)
            stats.last_error = describe(error)
        if turn.requests:
            stats.last_turn = data.last_turn = turn
            data.coordinator.requests.record(turn.requests)
        data.coordinator.async_update_listeners()
        if turn.requests:
            self.entry.async_create_background_task(
                self.hass, data.coordinator.async_request_refresh(), f"{DOMAIN} refresh after turn"
            )


def _device_id(chat_log: conversation.ChatLog) -> str | None:
    """The device the turn was spoken at (None: no device, or no LLM API)."""
    return chat_log.llm_api.llm_context.device_id if chat_log.llm_api else None
