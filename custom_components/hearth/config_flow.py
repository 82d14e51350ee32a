"""Config flow: the engine (URL + optional API key), its conversation agents and AI Tasks.

The engine may be a Hearth engine or another OpenAI-compatible server (llama.cpp, vLLM,
SGLang): the flow probes it (``backend/kinds.py``) and says what it found. On Home Assistant
OS the engine add-on announces itself through the Supervisor (``config_flow_hassio.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import probatio
from homeassistant.config_entries import (
    ConfigEntry,
    ConfigFlowResult,
    ConfigSubentryFlow,
    OptionsFlow,
    SubentryFlowResult,
)
from homeassistant.const import CONF_API_KEY, CONF_LLM_HASS_API, CONF_NAME, CONF_PROMPT, CONF_URL
from homeassistant.core import HomeAssistant, callback
from homeassistant.helpers import config_validation as cv
from homeassistant.helpers import llm
from homeassistant.helpers.selector import (
    BooleanSelector,
    NumberSelector,
    NumberSelectorConfig,
    NumberSelectorMode,
    SelectOptionDict,
    SelectSelector,
    SelectSelectorConfig,
    TemplateSelector,
    TextSelector,
    TextSelectorConfig,
    TextSelectorType,
)

from .backend.base import Backend
from .config_flow_hassio import HassioDiscoveryFlow
from .config_flow_options import HearthOptionsFlow
from .const import (
    CONF_EXAMPLES,
    CONF_MAX_HISTORY,
    CONF_MAX_TOKENS,
    CONF_READ_FIRST,
    CONF_REPIN_DEBOUNCE,
    CONF_TEMPERATURE,
    CONF_TOOL_FIRST,
    DEFAULT_AI_TASK_NAME,
    DEFAULT_CONVERSATION_NAME,
    DEFAULT_URL,
    DOMAIN,
    RECOMMENDED_AI_TASK_OPTIONS,
    RECOMMENDED_CONVERSATION_OPTIONS,
    SUBENTRY_AI_TASK,
    SUBENTRY_CONVERSATION,
)
from .engine_entry import (
    async_create_engine_entry,
    async_entry_for_url,
    async_validate,
    engine_data,
    normalize_url,
)
from .names import address, async_strings, distinct, hearth_titles
from .prefix.render import llm_api_ids

STEP_USER_SCHEMA = probatio.Schema(
    {
        probatio.Required(CONF_URL, default=DEFAULT_URL): TextSelector(
            TextSelectorConfig(type=TextSelectorType.URL)
        ),
        probatio.Optional(CONF_API_KEY): TextSelector(
            TextSelectorConfig(type=TextSelectorType.PASSWORD)
        ),
    }
)
STEP_REAUTH_SCHEMA = probatio.Schema(
    {
        probatio.Optional(CONF_API_KEY): TextSelector(
            TextSelectorConfig(type=TextSelectorType.PASSWORD)
        ),
    }
)

# Numeric agent options: (key, cast); NumberSelector answers floats.
_NUMBER_OPTIONS: tuple[tuple[str, type], ...] = (
    (CONF_MAX_HISTORY, int),
    (CONF_TEMPERATURE, float),
    (CONF_MAX_TOKENS, int),
    (CONF_REPIN_DEBOUNCE, float),
)


class HearthConfigFlow(HassioDiscoveryFlow, domain=DOMAIN):
    """Add a Hearth engine."""

    VERSION = 1
    MINOR_VERSION = 1

    async def async_step_user(self, user_input: dict[str, Any] | None = None) -> ConfigFlowResult:
        """Ask for the engine URL and API key; validate them."""
        errors: dict[str, str] = {}
        if user_input is not None:
            url, api_key, error, server = await self._async_check_input(user_input)
            if error is None and server is not None:
                await self.async_set_unique_id(normalize_url(url))
                self._abort_if_unique_id_configured()
                if async_entry_for_url(self.hass, url) is not None:  # e.g. the add-on's
                    return self.async_abort(reason="already_configured")
                return await async_create_engine_entry(self, url, api_key, server)
            errors["base"] = error
        return self.async_show_form(
            step_id="user",
            data_schema=self.add_suggested_values_to_schema(STEP_USER_SCHEMA, user_input or {}),
            errors=errors,
        )

    async def async_step_reconfigure(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Change the engine URL or API key."""
        entry = self._get_reconfigure_entry()
        errors: dict[str, str] = {}
        if user_input is not None:
            url, api_key, error, _server = await self._async_check_input(user_input)
            if error is None:
                # The same server keeps its unique id (an add-on's entry stays the
                # add-on's); another server makes it the entry of that URL.
                unique_id = entry.unique_id
                if normalize_url(url) != normalize_url(entry.data[CONF_URL]):
                    unique_id = normalize_url(url)
                    if async_entry_for_url(self.hass, url) is not None or (
                        self.hass.config_entries.async_entry_for_domain_unique_id(DOMAIN, unique_id)
                    ):
                        return self.async_abort(reason="already_configured")
                return self._async_update_engine(
                    entry, unique_id=unique_id, data=engine_data(url, api_key)
                )
            errors["base"] = error
        return self.async_show_form(
            step_id="reconfigure",
            data_schema=self.add_suggested_values_to_schema(
                STEP_USER_SCHEMA, user_input or dict(entry.data)
            ),
            errors=errors,
        )

    async def async_step_reauth(self, entry_data: Mapping[str, Any]) -> ConfigFlowResult:
        """The engine refused the API key (401)."""
        return await self.async_step_reauth_confirm()

    async def async_step_reauth_confirm(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Ask for a new API key."""
        entry = self._get_reauth_entry()
        errors: dict[str, str] = {}
        if user_input is not None:
            api_key = (user_input.get(CONF_API_KEY) or "").strip() or None
            error, _server = await async_validate(self.hass, entry.data[CONF_URL], api_key)
            if error is None:
                return self._async_update_engine(
                    entry, data=engine_data(entry.data[CONF_URL], api_key)
                )
            errors["base"] = error
        return self.async_show_form(
            step_id="reauth_confirm",
            data_schema=STEP_REAUTH_SCHEMA,
            description_placeholders={CONF_URL: entry.data[CONF_URL]},
            errors=errors,
        )

    def _async_update_engine(self, entry: ConfigEntry, **changes: Any) -> ConfigFlowResult:
        """Update the entry and abort; the entry reloads with the new settings.

        A loaded entry reloads from its update listener; one that failed to set up
        (e.g. a refused key) has no listener, so it is reloaded here.
        """
        loaded = bool(entry.update_listeners)
        result = self.async_update_and_abort(entry, **changes)
        if not loaded:
            self.hass.config_entries.async_schedule_reload(entry.entry_id)
        return result

    async def _async_check_input(
        self, user_input: Mapping[str, Any]
    ) -> tuple[str, str | None, str | None, Backend | None]:
        """(url, api key, error key or None, the server) for a user/reconfigure form."""
        api_key = (user_input.get(CONF_API_KEY) or "").strip() or None
        raw_url = str(user_input[CONF_URL]).strip()
        try:
            url = str(cv.url(raw_url)).rstrip("/")
        except probatio.Invalid:
            return raw_url, api_key, "invalid_url", None
        return url, api_key, *await async_validate(self.hass, url, api_key)

    @staticmethod
    @callback
    def async_get_options_flow(config_entry: ConfigEntry) -> OptionsFlow:
        """The engine entry's options: the stall time."""
        return HearthOptionsFlow()

    @classmethod
    @callback
    def async_get_supported_subentry_types(
        cls, config_entry: ConfigEntry
    ) -> dict[str, type[ConfigSubentryFlow]]:
        """Conversation agents and AI Tasks are subentries."""
        return {
            SUBENTRY_CONVERSATION: ConversationFlowHandler,
            SUBENTRY_AI_TASK: AITaskFlowHandler,
        }


class _OptionsSubentryFlow(ConfigSubentryFlow):
    """Add or reconfigure a subentry through one options form (``set_options``)."""

    recommended: Mapping[str, Any]
    default_name: str
    default_name_key: str | None = None  # ``common.<key>``: the default name translated
    numbers: tuple[tuple[str, type], ...]  # (key, cast): NumberSelector answers floats

    @property
    def _is_new(self) -> bool:
        return self.source == "user"

    def _schema(self, options: Mapping[str, Any], name: str) -> probatio.Schema:
        raise NotImplementedError

    async def _async_default_name(self) -> str:
        """The default name in the install's language, unless another Hearth device
        has it (then with the server's address)."""
        name = self.default_name
        if self.default_name_key is not None:
            name = (await async_strings(self.hass)).get(
                f"component.{DOMAIN}.common.{self.default_name_key}", name
            )
        return distinct(name, address(self._get_entry().data[CONF_URL]), hearth_titles(self.hass))

    async def async_step_set_options(
        self, user_input: dict[str, Any] | None = None
    ) -> SubentryFlowResult:
        """Show the form (recommended or current options), then create or update."""
        if user_input is None:
            options: Mapping[str, Any] = (
                self.recommended if self._is_new else self._get_reconfigure_subentry().data
            )
            name = await self._async_default_name() if self._is_new else self.default_name
            return self.async_show_form(
                step_id="set_options", data_schema=self._schema(options, name)
            )
        data = dict(user_input)
        title = str(data.pop(CONF_NAME, self.default_name))
        for key, cast in self.numbers:
            data[key] = cast(data.get(key, self.recommended[key]))
        if self._is_new:
            return self.async_create_entry(title=title, data=data)
        return self.async_update_and_abort(
            self._get_entry(), self._get_reconfigure_subentry(), data=data
        )

    async_step_user = async_step_set_options
    async_step_reconfigure = async_step_set_options


class ConversationFlowHandler(_OptionsSubentryFlow):
    """Add or reconfigure a conversation agent: instructions, LLM APIs, history,
    sampling, tool-first and re-pin debounce."""

    recommended = RECOMMENDED_CONVERSATION_OPTIONS
    default_name = DEFAULT_CONVERSATION_NAME
    numbers = _NUMBER_OPTIONS

    def _schema(self, options: Mapping[str, Any], name: str) -> probatio.Schema:
        return agent_options_schema(self.hass, options, is_new=self._is_new, name=name)


class AITaskFlowHandler(_OptionsSubentryFlow):
    """Add or reconfigure an AI Task entity (``ai_task.generate_data``): sampling and
    reply length; each task brings its own instructions."""

    recommended = RECOMMENDED_AI_TASK_OPTIONS
    default_name = DEFAULT_AI_TASK_NAME
    default_name_key = "default_ai_task_name"
    numbers = ((CONF_TEMPERATURE, float), (CONF_MAX_TOKENS, int))

    def _schema(self, options: Mapping[str, Any], name: str) -> probatio.Schema:
        return ai_task_options_schema(options, is_new=self._is_new, name=name)


def _temperature_selector() -> NumberSelector:
    return NumberSelector(
        NumberSelectorConfig(min=0, max=2, step=0.05, mode=NumberSelectorMode.SLIDER)
    )


def _max_tokens_selector() -> NumberSelector:
    return NumberSelector(
        NumberSelectorConfig(min=1, max=8192, step=1, mode=NumberSelectorMode.BOX)
    )


def ai_task_options_schema(
    options: Mapping[str, Any], *, is_new: bool, name: str = DEFAULT_AI_TASK_NAME
) -> probatio.Schema:
    """Form of an AI Task's options, pre-filled with ``options``."""
    schema: dict[Any, Any] = {}
    if is_new:
        schema[probatio.Required(CONF_NAME, default=name)] = str

    def suggested(key: str) -> dict[str, Any]:
        return {"suggested_value": options.get(key, RECOMMENDED_AI_TASK_OPTIONS[key])}

    schema[probatio.Optional(CONF_TEMPERATURE, description=suggested(CONF_TEMPERATURE))] = (
        _temperature_selector()
    )
    schema[probatio.Optional(CONF_MAX_TOKENS, description=suggested(CONF_MAX_TOKENS))] = (
        _max_tokens_selector()
    )
    return probatio.Schema(schema)


def agent_options_schema(
    hass: HomeAssistant,
    options: Mapping[str, Any],
    *,
    is_new: bool,
    name: str = DEFAULT_CONVERSATION_NAME,
) -> probatio.Schema:
    """Form of an agent's options, pre-filled with ``options``."""
    schema: dict[Any, Any] = {}
    if is_new:
        schema[probatio.Required(CONF_NAME, default=name)] = str

    def suggested(key: str) -> dict[str, Any]:
        return {"suggested_value": options.get(key, RECOMMENDED_CONVERSATION_OPTIONS[key])}

    schema.update(
        {
            probatio.Optional(CONF_PROMPT, description=suggested(CONF_PROMPT)): TemplateSelector(),
            probatio.Optional(
                CONF_LLM_HASS_API,
                description={"suggested_value": llm_api_ids(hass, options)},
            ): SelectSelector(
                SelectSelectorConfig(
                    options=[
                        SelectOptionDict(label=api.name, value=api.id)
                        for api in llm.async_get_apis(hass)
                    ],
                    multiple=True,
                )
            ),
            probatio.Optional(CONF_MAX_HISTORY, description=suggested(CONF_MAX_HISTORY)): (
                NumberSelector(
                    NumberSelectorConfig(min=0, max=100, step=1, mode=NumberSelectorMode.BOX)
                )
            ),
            probatio.Optional(CONF_TEMPERATURE, description=suggested(CONF_TEMPERATURE)): (
                _temperature_selector()
            ),
            probatio.Optional(CONF_MAX_TOKENS, description=suggested(CONF_MAX_TOKENS)): (
                _max_tokens_selector()
            ),
            probatio.Optional(CONF_TOOL_FIRST, description=suggested(CONF_TOOL_FIRST)): (
                BooleanSelector()
            ),
            probatio.Optional(CONF_EXAMPLES, description=suggested(CONF_EXAMPLES)): (
                BooleanSelector()
            ),
            probatio.Optional(CONF_READ_FIRST, description=suggested(CONF_READ_FIRST)): (
                BooleanSelector()
            ),
            probatio.Optional(CONF_REPIN_DEBOUNCE, description=suggested(CONF_REPIN_DEBOUNCE)): (
                NumberSelector(
                    NumberSelectorConfig(
                        min=0,
                        max=300,
                        step=0.1,
                        unit_of_measurement="s",
                        mode=NumberSelectorMode.BOX,
                    )
                )
            ),
        }
    )
    return probatio.Schema(schema)
