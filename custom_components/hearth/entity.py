"""Base entities of the Hearth integration; the LLM entity holds the chat loop."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import Any

from homeassistant.components import conversation
from homeassistant.config_entries import ConfigSubentry
from homeassistant.core import callback
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers import llm
from homeassistant.helpers.entity import Entity
from homeassistant.helpers.update_coordinator import CoordinatorEntity
from homeassistant.util.ulid import ulid_now

from .api import RequestUsage
from .const import (
    CONF_MAX_HISTORY,
    CONF_MAX_TOKENS,
    CONF_READ_FIRST,
    CONF_TEMPERATURE,
    CONF_TOOL_FIRST,
    DEFAULT_MAX_HISTORY,
    DEFAULT_MAX_TOKENS,
    DEFAULT_READ_FIRST,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOOL_FIRST,
    DOMAIN,
    MAX_TOOL_ITERATIONS,
)
from .coordinator import HearthCoordinator
from .data import AgentStats, HearthConfigEntry, TurnUsage
from .engine_device import engine_device_info
from .errors import BACKEND_ERRORS, async_spoken, describe
from .hints import Hint, house_hint
from .house_values import allowed_for, command_values, scoped_arguments, tool_domains
from .prompt import HearthNative, build_messages
from .questions import is_question, live_context_tool
from .request_plan import PrefixChoice, RequestPlan, plan_request
from .speech import MarkupFilter

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


@dataclass
class _Reply:
    """What one streamed engine reply carried besides the deltas."""

    started: float = field(default_factory=time.monotonic)
    content: str = ""
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    raw_usage: Mapping[str, Any] | None = None
    timings: Mapping[str, Any] | None = None  # llama.cpp's per-request figures
    finish_reason: str | None = None
    client_ttft_ms: float | None = None

    def first_output(self) -> None:
        if self.client_ttft_ms is None:
            self.client_ttft_ms = round((time.monotonic() - self.started) * 1000, 3)

    def add_tool_call_delta(self, delta: Mapping[str, Any]) -> None:
        """Merge a (possibly partial, OpenAI-style) tool call delta by index."""
        index = int(delta.get("index", len(self.tool_calls)))
        call = self.tool_calls.setdefault(
            index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
        )
        if delta.get("id"):
            call["id"] = str(delta["id"])
        function = delta.get("function") or {}
        if name := function.get("name"):
            call["function"]["name"] += str(name)
        if (arguments := function.get("arguments")) is not None:
            call["function"]["arguments"] += (
                arguments if isinstance(arguments, str) else json.dumps(arguments)
            )

    @property
    def usage(self) -> RequestUsage | None:
        """What the server reported of this request (None: no ``usage`` was sent)."""
        if self.raw_usage is None:
            return None
        return RequestUsage.from_usage(self.raw_usage, self.timings, self.client_ttft_ms)

    def raw_tool_calls(self) -> list[dict[str, Any]]:
        calls = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        for call in calls:
            call["id"] = call["id"] or f"call_{ulid_now()}"
        return calls


def resolve_tool_name(name: str, available: list[str]) -> str:
    """The HA tool a model means.

    HA namespaces tools (``intent__HassTurnOn``); small models often call the bare
    intent name (``HassTurnOn``). An exact match wins, then a unique ``__`` suffix
    match; otherwise the name is passed through (HA answers "tool not found").
    """
    if name in available:
        return name
    matches = [tool for tool in available if tool.endswith(f"__{name}")]
    return matches[0] if len(matches) == 1 else name


def parse_tool_args(arguments: str) -> dict[str, Any] | None:
    """Tool arguments (a JSON string) as a dict, without empty values; None when they
    are not a JSON object (the call then gets a tool error, see ``invalid_args_result``).

    Small models add empty optional arguments that make intent matching fail.
    """
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    return {k: v for k, v in value.items() if v is not None and v != ""}


def invalid_args_result(call: Mapping[str, Any]) -> conversation.ToolResultContentDeltaDict:
    """The tool result of a call whose arguments are not a JSON object: the tool is not
    run (HA would run it with no arguments); the model reads why and may call again."""
    function = call["function"]
    return {
        "role": "tool_result",
        "tool_call_id": call["id"],
        "tool_name": function["name"],
        "result": llm.ToolResult(
            data={
                "error": "InvalidToolArguments",
                "error_text": (
                    f"The arguments of {function['name']} were not valid JSON (a JSON "
                    f"object was expected): {function['arguments']!r}"
                ),
            },
            error=True,
        ),
    }


def _call_key(call: Mapping[str, Any]) -> str:
    """A tool call's identity within a turn: its name and its parsed arguments (the
    raw text where they are not valid)."""
    function = call["function"]
    arguments = parse_tool_args(function["arguments"])
    key = function["arguments"] if arguments is None else arguments
    return json.dumps([function["name"], key], sort_keys=True, default=str)


def repeat_reply(chat_log: conversation.ChatLog, done: str) -> str | None:
    """The reply when the model only repeats a call: what the last tool result said (an
    intent's speech), else ``done`` for an action that succeeded on every target; None
    (say the failure) otherwise."""
    last = chat_log.content[-1] if chat_log.content else None
    if not isinstance(last, conversation.ToolResultContent):
        return None
    result = last.result.data
    plain = (result.get("speech") or {}).get("plain") or {}
    if isinstance(plain, Mapping) and plain.get("speech"):
        return str(plain["speech"])
    data = result.get("data") or {}
    if (
        result.get("response_type") == "action_done"
        and isinstance(data, Mapping)
        and data.get("success")
        and not data.get("failed")
    ):
        return done
    return None


async def _transform_stream(
    chunks: AsyncGenerator[dict[str, Any]],
    reply: _Reply,
    tool_names: list[str],
    context: str | None,
    markup_only: str,
    *,
    seen_calls: set[str] | None = None,
    repeat_speech: str | None = None,
    about: frozenset[str] | None = None,
) -> AsyncGenerator[
    conversation.AssistantContentDeltaDict | conversation.ToolResultContentDeltaDict
]:
    """Engine chunks as chat log deltas; the raw message ends up in ``native``.

    Tool markup written as text is not spoken (``speech``); a reply that was nothing but
    markup says ``markup_only`` instead. A call the turn already made (same tool, same
    arguments: small models repeat themselves, adding the same item ten times) is not
    run again; when nothing new is left, the reply is what the last tool result said.
    An on/off call by area alone keeps to the domains the request named (``about``,
    house_values.scoped_arguments).
    """
    speech = MarkupFilter()
    yield {"role": "assistant"}
    async with aclosing(chunks):
        async for chunk in chunks:
            if usage := chunk.get("usage"):
                reply.raw_usage = usage
            if timings := chunk.get("timings"):
                reply.timings = timings
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                if text := delta.get("content"):
                    reply.first_output()
                    reply.content += text
                    if spoken := speech.feed(text):
                        yield {"content": spoken}
                for call in delta.get("tool_calls") or ():
                    reply.first_output()
                    reply.add_tool_call_delta(call)
                if finish := choice.get("finish_reason"):
                    reply.finish_reason = finish
    if tail := speech.finish():
        yield {"content": tail}
    made = reply.raw_tool_calls()
    seen_calls = set() if seen_calls is None else seen_calls  # the turn's calls so far
    raw_calls = [call for call in made if _call_key(call) not in seen_calls]
    seen_calls.update(_call_key(call) for call in raw_calls)
    repeated = bool(made) and not raw_calls
    if not raw_calls and not speech.spoken and (repeated or speech.removed):
        said = repeat_speech if repeated and repeat_speech else markup_only
        yield {"content": said}
        if repeated:
            reply.content += said
    invalid: list[dict[str, Any]] = []
    if raw_calls:
        tool_inputs = []
        for call in raw_calls:
            name = call["function"]["name"]
            arguments = parse_tool_args(call["function"]["arguments"])
            if arguments is None:
                invalid.append(call)
                # Not run by the chat log (external): its result is the error below.
                tool_inputs.append(
                    llm.ToolInput(tool_name=name, tool_args={}, id=call["id"], external=True)
                )
                continue
            tool_inputs.append(
                llm.ToolInput(
                    tool_name=resolve_tool_name(name, tool_names),
                    tool_args=scoped_arguments(name, arguments, about),
                    id=call["id"],
                )
            )
        yield {"tool_calls": tool_inputs}
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if raw_calls:
        message["tool_calls"] = raw_calls
    yield {"native": HearthNative(context=context, message=message)}
    for call in invalid:
        yield invalid_args_result(call)


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
    # (questions.py); an AI Task's instructions are no spoken question (ai_task.py).
    _read_first_default = DEFAULT_READ_FIRST

    @property
    def options(self) -> Mapping[str, Any]:
        """The agent's current options (read fresh: they change without a reload)."""
        return self.entry.subentries[self.subentry_id].data

    async def _async_prefix_choice(self, chat_log: conversation.ChatLog) -> PrefixChoice:
        """The stable prefix the requests of this turn start with: the agent's pin for
        the class of the speaking device (device_class.py)."""
        device_id = chat_log.llm_api.llm_context.device_id if chat_log.llm_api else None
        return await self.entry.runtime_data.prefixes.async_prefix_for_request(
            self.subentry_id, device_id
        )

    async def _async_plan(self, chat_log: conversation.ChatLog) -> RequestPlan:
        """Prefix, tools and context message of this turn's requests (request_plan.py)."""
        choice = await self._async_prefix_choice(chat_log)
        first = chat_log.content[0] if chat_log.content else None
        system_prompt = first.content if isinstance(first, conversation.SystemContent) else ""
        return plan_request(self.hass, choice, system_prompt, chat_log.llm_api)

    def _request_body(
        self,
        plan: RequestPlan,
        messages: list[dict[str, Any]],
        response_format: Mapping[str, Any] | None = None,
        first: bool = False,
        *,
        question: bool = False,
        command: bool = False,
        allowed: list[str] | None = None,
    ) -> dict[str, Any]:
        """The chat request; ``first``: the turn's first request (see CONF_TOOL_FIRST);
        ``question``: the turn asks about something (see questions.py); ``command``: it
        reads like a command one of the tools does (it has a hint, see hints.py), which
        the first request must then call: one of ``allowed`` (the tools that act on
        what it names; Hearth's engine only) where given."""
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
            reads = options.get(CONF_READ_FIRST, self._read_first_default)
            if first and question and reads and (live := live_context_tool(plan.tools)):
                body["tool_choice"] = {"type": "function", "function": {"name": live}}
            elif first and command and allowed is not None:
                tools = [{"type": "function", "function": {"name": name}} for name in allowed]
                body["tool_choice"] = {
                    "type": "allowed_tools",
                    "allowed_tools": {"mode": "required", "tools": tools},
                }
            elif first and (command or options.get(CONF_TOOL_FIRST, DEFAULT_TOOL_FIRST)):
                body["tool_choice"] = "required"
        body.update(self.entry.runtime_data.backend.request_extensions(plan.hearth))
        if response_format is not None:
            body["response_format"] = dict(response_format)
        return body

    async def _async_handle_chat_log(
        self,
        chat_log: conversation.ChatLog,
        language: str | None = None,
        response_format: Mapping[str, Any] | None = None,
    ) -> TurnUsage:
        """Run the tool loop for the chat log's last user message.

        Every request starts with the agent's house prefix (pinned in the engine),
        then the history as sent before (without earlier turns' hints), then this
        turn's nearest example (hints.py), context message and user text. Tool calls
        run through HA's LLM API (chat log) and their results go back to the engine, up
        to ``MAX_TOOL_ITERATIONS`` requests.
        ``response_format`` (an AI Task's structure) constrains every reply.
        """
        data = self.entry.runtime_data
        plan = await self._async_plan(chat_log)
        context = plan.context
        max_history = int(self.options.get(CONF_MAX_HISTORY, DEFAULT_MAX_HISTORY))
        tool_names = [tool.name for tool in chat_log.llm_api.tools] if chat_log.llm_api else []
        language = language or self.hass.config.language
        asked = [c for c in chat_log.content if isinstance(c, conversation.UserContent)]
        question = bool(asked) and is_question(asked[-1].content, language)
        # The example nearest to this request (hints.py), where the pin shows examples.
        hint = (
            house_hint(self.hass, plan.tools, language, asked[-1].content)
            if asked and plan.prefix.examples
            else Hint()
        )
        # A command may call only the tools that act on what it names (Hearth's engine
        # takes OpenAI's allowed_tools; the prompt still shows every tool).
        allowed = None
        narrows = data.backend.narrows_tools
        if hint and not question and chat_log.llm_api and narrows:
            domains = tool_domains(self.hass, chat_log.llm_api)
            allowed = allowed_for(plan.tools, domains, hint.domains)
            # ... and its on/off calls may name only things of the domains it names.
            plan = replace(plan, hearth=command_values(self.hass, plan.hearth, hint.domains))
        markup_only = await async_spoken(self.hass, language, "markup_only")
        done = await async_spoken(self.hass, language, "action_done")
        requests: list[RequestUsage] = []
        client_ttfts: list[float | None] = []
        seen_calls: set[str] = set()
        error: Exception | None = None
        try:
            for iteration in range(MAX_TOOL_ITERATIONS):
                messages = build_messages(
                    plan.prefix, chat_log.content, context, max_history, hint.messages
                )
                reply = _Reply()
                stream = _transform_stream(
                    data.backend.chat.async_chat_stream(
                        self._request_body(
                            plan,
                            messages,
                            response_format,
                            iteration == 0,
                            question=question,
                            command=bool(hint) and not question and narrows,
                            allowed=allowed,
                        )
                    ),
                    reply,
                    tool_names,
                    context if iteration == 0 else None,
                    markup_only,
                    seen_calls=seen_calls,
                    repeat_speech=repeat_reply(chat_log, done),
                    about=hint.domains,
                )
                async for _content in chat_log.async_add_delta_content_stream(
                    self.entity_id, stream
                ):
                    pass
                client_ttfts.append(reply.client_ttft_ms)
                if reply.usage is not None:
                    requests.append(reply.usage)
                if not chat_log.unresponded_tool_results:
                    break
        except BACKEND_ERRORS as err:
            error = err
            raise
        finally:
            turn = TurnUsage(agent_id=self.entity_id, requests=tuple(requests))
            self._async_record_turn(turn, error)
            chat_log.async_trace(
                {
                    "hearth": {
                        "pin": plan.pin,
                        "prefix_digest": plan.prefix.digest,
                        "prefix_bytes": len(plan.prefix.data),
                        "context_lines": len(context.splitlines()),
                        "hint": hint.messages[0]["content"] if hint else None,
                        "allowed_tools": allowed,
                        "client_ttft_ms": client_ttfts,
                        **turn.as_dict(),
                    }
                }
            )
        return turn

    @callback
    def _async_record_turn(self, turn: TurnUsage, error: Exception | None) -> None:
        """Push the turn's figures to the sensors; refresh the engine's counters soon."""
        data = self.entry.runtime_data
        stats = data.agents.setdefault(self.subentry_id, AgentStats())
        stats.requests += 1
        if error is not None:
            stats.errors += 1
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
