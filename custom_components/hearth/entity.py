"""Base entities of the Hearth integration; the LLM entity holds the chat loop."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing
from typing import Any

from homeassistant.components import conversation
from homeassistant.config_entries import ConfigSubentry
from homeassistant.core import callback
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers.entity import Entity
from homeassistant.helpers.update_coordinator import CoordinatorEntity

from .backend.api import RequestUsage
from .backend.chat import EngineStalled
from .backend.coordinator import HearthCoordinator
from .const import (
    CONF_MAX_HISTORY,
    CONF_MAX_TOKENS,
    CONF_TEMPERATURE,
    DEFAULT_MAX_HISTORY,
    DEFAULT_MAX_TOKENS,
    DEFAULT_READ_FIRST,
    DEFAULT_TEMPERATURE,
    DOMAIN,
)
from .data import AgentStats, HearthConfigEntry, TurnUsage
from .engine_device import engine_device_info
from .errors import BACKEND_ERRORS, describe, is_context_exceeded
from .pins.model import PrefixChoice
from .turn.context_fit import ContextFit, LeftOut, async_started
from .turn.plan import RequestPlan, plan_request
from .turn.policy import Capabilities, TurnPolicy
from .turn.prepare import async_prepare_turn, say
from .turn.prompt import build_messages
from .turn.stream import Reply, transform_stream

MANUFACTURER = "Hearth"


def agent_device_info(
    entry: HearthConfigEntry, subentry: ConfigSubentry, model: str = "Conversation agent"
) -> dr.DeviceInfo:
    """The service device of an agent or AI task (subentry), served by the engine's device."""
    info = dr.DeviceInfo(
        identifiers={(DOMAIN, subentry.subentry_id)},
        name=subentry.title,
        manufacturer=MANUFACTURER,
        model=model,
        entry_type=dr.DeviceEntryType.SERVICE,
    )
    if (engine_device_id := entry.runtime_data.engine_device_id) is not None:
        info["via_device_id"] = engine_device_id  # the engine device is registered first
    return info


class HearthCoordinatorEntity(CoordinatorEntity[HearthCoordinator]):
    """An entity of the engine's service device, fed by the coordinator."""

    _attr_has_entity_name = True

    def __init__(self, entry: HearthConfigEntry, key: str) -> None:
        """Attach to the engine device of ``entry``."""
        coordinator = entry.runtime_data.coordinator
        super().__init__(coordinator)
        self.entry = entry
        self._attr_unique_id = f"{entry.entry_id}_{key}"
        self._attr_device_info = engine_device_info(entry)


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

    # Whether a question's turn reads the house first when the options do not say
    # (language/questions.py); an AI Task's instructions are no spoken question (ai_task.py).
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

    def _request_body(
        self,
        plan: RequestPlan,
        messages: list[dict[str, Any]],
        policy: TurnPolicy,
        iteration: int,
        response_format: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Request ``iteration`` of a turn run by ``policy`` (turn/policy.py)."""
        options = self.options
        body: dict[str, Any] = {
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": float(options.get(CONF_TEMPERATURE, DEFAULT_TEMPERATURE)),
            "max_tokens": int(options.get(CONF_MAX_TOKENS, DEFAULT_MAX_TOKENS)),
        }
        if plan.tools:
            body["tools"] = list(plan.tools)
            if (choice := policy.tool_choice(iteration, True)) is not None:
                body["tool_choice"] = choice
        body.update(self.entry.runtime_data.backend.request_extensions(policy.values))
        if response_format is not None:
            body["response_format"] = dict(response_format)
        return body

    async def _async_start(
        self,
        chat_log: conversation.ChatLog,
        plan: RequestPlan,
        fit: ContextFit,
        *,
        policy: TurnPolicy,
        iteration: int,
        response_format: Mapping[str, Any] | None,
    ) -> tuple[AsyncGenerator[dict[str, Any]], RequestPlan]:
        """Send request ``iteration`` and wait for its first chunk; returns the reply's
        chunks and the plan it was sent with.

        A request over the model's context is sent again with less (turn/context_fit.py):
        without the conversation's earlier turns, then with the agent's prefix pinned
        without worked examples. Nothing of a refused request reached the chat log, so
        none of its calls ran and none of its words were said.
        """
        data = self.entry.runtime_data
        while True:
            messages = build_messages(
                plan.prefix, chat_log.content, plan.context, fit.max_history, policy.hint
            )
            body = self._request_body(plan, messages, policy, iteration, response_format)
            try:
                return await async_started(data.backend.chat.async_chat_stream(body)), plan
            except BACKEND_ERRORS as err:
                if not is_context_exceeded(err):
                    raise
                alone = build_messages(plan.prefix, chat_log.content, plan.context, 0, policy.hint)
                step = fit.next_step(
                    err,
                    history=len(alone) < len(messages),
                    examples=bool(plan.prefix.examples),
                    max_tokens=int(body["max_tokens"]),
                    context_length=data.coordinator.context_length,
                )
                if step is LeftOut.EXAMPLES:
                    await data.prefixes.async_leave_out_examples(
                        self.subentry_id, _device_id(chat_log)
                    )
                    plan = await self._async_plan(chat_log, without_examples=True)

    async def _async_handle_chat_log(
        self,
        chat_log: conversation.ChatLog,
        language: str | None = None,
        response_format: Mapping[str, Any] | None = None,
    ) -> TurnUsage:
        """Run the tool loop for the chat log's last user message, as the turn policy
        says (turn/policy.py: what each request carries, at most ``max_requests``).

        Every request starts with the agent's house prefix (pinned in the engine),
        then the history as sent before (without earlier turns' hints), then this
        turn's context message, nearest example and user text. Tool calls run through
        HA's LLM API (chat log); after an action the turn says what HA reported
        (turn/result_speech.py). ``response_format`` (an AI Task's structure) constrains
        every reply, and the model's reply is then the answer. A request over the
        model's context is sent again with less (``_async_start``, turn/context_fit.py).
        """
        data = self.entry.runtime_data
        plan = await self._async_plan(chat_log)
        fit = ContextFit(int(self.options.get(CONF_MAX_HISTORY, DEFAULT_MAX_HISTORY)))
        tool_names = [tool.name for tool in chat_log.llm_api.tools] if chat_log.llm_api else []
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
        policy = turn.policy
        requests: list[RequestUsage] = []
        client_ttfts: list[float | None] = []
        first_speech: list[float | None] = []
        seen_calls: set[str] = set()
        error: Exception | None = None
        try:
            for iteration in range(policy.max_requests):
                failure = turn.error_speech(self.hass, chat_log.content)
                reply = Reply()  # its time to the first token counts the requests sent again
                chunks, plan = await self._async_start(
                    chat_log,
                    plan,
                    fit,
                    policy=policy,
                    iteration=iteration,
                    response_format=response_format,
                )
                # ``chunks`` is closed even where the chat log stops before reading it.
                async with aclosing(chunks):
                    stream = transform_stream(
                        chunks,
                        reply,
                        tool_names,
                        plan.context if iteration == 0 else None,
                        turn.fallback if turn.spoken else None,
                        seen_calls=seen_calls,
                        repeat_speech=turn.speech(self.hass, chat_log.content) or failure,
                        resolve=turn.resolve,
                        refuse=turn.refusal,
                        instead=failure,
                        asks=turn.asks,
                        early=not policy.command,  # a command ends with what HA reports
                    )
                    async for _content in chat_log.async_add_delta_content_stream(
                        self.entity_id, stream
                    ):
                        pass
                client_ttfts.append(reply.client_ttft_ms)
                first_speech.append(reply.first_speech_ms)
                if reply.usage is not None:
                    requests.append(reply.usage)
                if not chat_log.unresponded_tool_results:
                    break
                if (said := turn.speech(self.hass, chat_log.content)) is not None:
                    say(chat_log, self.entity_id, said)  # what HA reports was done
                    break
        except BACKEND_ERRORS as err:
            error = err
            raise
        finally:
            usage = TurnUsage(agent_id=self.entity_id, requests=tuple(requests))
            self._async_record_turn(usage, error)
            chat_log.async_trace(
                {
                    "hearth": {
                        "pin": plan.pin,
                        "prefix_digest": plan.prefix.digest,
                        "prefix_bytes": len(plan.prefix.data),
                        "context_lines": len(plan.context.splitlines()),
                        **policy.as_trace(),
                        **fit.as_trace(),
                        "client_ttft_ms": client_ttfts,
                        # per request: when its first word reached the chat log (ms)
                        "first_speech_ms": first_speech,
                        **usage.as_dict(),
                    }
                }
            )
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
        if not turn.requests:
            return
        self.entry.async_create_background_task(
            self.hass, data.coordinator.async_request_refresh(), f"{DOMAIN} refresh after turn"
        )


def _device_id(chat_log: conversation.ChatLog) -> str | None:
    """The device the turn was spoken at (None: no device, or no LLM API)."""
    return chat_log.llm_api.llm_context.device_id if chat_log.llm_api else None
