"""The served model's context, known to the agents (``backend/server_info.py``,
``coordinator.context_length``): what each kind of server reports, the engine entry's
option where the server reports none, and diagnostics.

The answer shapes are the servers' own (Hearth's ``/v1/models``, vLLM's and SGLang's
``ModelCard``, llama.cpp's ``/v1/models`` and ``/props``). Hearth's engine and llama.cpp
are also asked for real (here and in ``test_llama_cpp.py``); vLLM and SGLang need a GPU,
so ``FakeServer`` (``test_other_servers.py``) stands in for their HTTP surface.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.hearth.backend.server_info import (
    ServerKind,
    model_context_length,
    props_context_length,
)
from custom_components.hearth.const import CONF_CONTEXT_LENGTH, CONF_STALL_TIMEOUT
from custom_components.hearth.diagnostics import async_get_config_entry_diagnostics

from .common import async_setup_entry, make_entry
from .test_other_servers import VLLM_METRICS, FakeServer

HEARTH_MODEL = {
    "id": "tiny-tools",
    "object": "model",
    "created": 1764500000,
    "owned_by": "hearth",
    "context_length": 32768,
}
VLLM_MODEL = {
    "id": "Qwen/Qwen2.5-3B-Instruct",
    "object": "model",
    "created": 1764500000,
    "owned_by": "vllm",
    "root": "Qwen/Qwen2.5-3B-Instruct",
    "parent": None,
    "max_model_len": 8192,
    "permission": [{"id": "modelperm-1", "object": "model_permission", "allow_sampling": True}],
}
SGLANG_MODEL = {
    "id": "default",
    "object": "model",
    "created": 1764500000,
    "owned_by": "sglang",
    "root": "default",
    "parent": None,
    "max_model_len": 16384,
}
LLAMA_CPP_MODEL = {
    "id": "smollm2",
    "aliases": [],
    "tags": [],
    "object": "model",
    "created": 1764500000,
    "owned_by": "llamacpp",
    "meta": {"vocab_type": 2, "n_vocab": 49152, "n_ctx": 4096, "n_ctx_train": 8192},
}
LLAMA_CPP_PROPS = {
    "default_generation_settings": {"params": {"n_predict": -1}, "n_ctx": 4096},
    "total_slots": 2,
    "model_alias": "smollm2",
}


@pytest.mark.parametrize(
    ("model", "tokens"),
    [
        (HEARTH_MODEL, 32768),
        (VLLM_MODEL, 8192),
        (SGLANG_MODEL, 16384),
        (LLAMA_CPP_MODEL, 4096),  # the context per slot, not the trained one
        ({"id": "gpt-x", "object": "model", "owned_by": "someone"}, None),
        ({"id": "m", "context_length": True}, None),
        ({"id": "m", "context_length": "8192"}, None),
        ({"id": "m", "max_model_len": 0}, None),
        ({"id": "m", "max_model_len": -1}, None),
        ({"id": "m", "max_model_len": 8192.5}, None),
        ({"id": "m", "max_model_len": None, "meta": {"n_ctx": 2048}}, 2048),
        ({"id": "m", "meta": "n_ctx"}, None),
        (None, None),
        ([HEARTH_MODEL], None),
    ],
)
def test_the_context_a_model_entry_tells(model: Any, tokens: int | None) -> None:
    assert model_context_length(model) == tokens


@pytest.mark.parametrize(
    ("props", "tokens"),
    [
        (LLAMA_CPP_PROPS, 4096),
        ({"default_generation_settings": {}, "total_slots": 4}, None),
        ({"default_generation_settings": [], "total_slots": 4}, None),
        ({"default_generation_settings": {"n_ctx": "4096"}}, None),
        ("not props", None),
        (None, None),
    ],
)
def test_the_context_llama_cpp_props_tell(props: Any, tokens: int | None) -> None:
    assert props_context_length(props) == tokens


async def _options_form(hass: HomeAssistant, entry: MockConfigEntry) -> dict[str, Any]:
    result = await hass.config_entries.options.async_init(entry.entry_id)
    assert result["type"] is FlowResultType.FORM
    return dict(result)


def _fields(form: dict[str, Any]) -> list[str]:
    return [str(key) for key in form["data_schema"].schema]


async def _configure(hass: HomeAssistant, form: dict[str, Any], data: dict[str, Any]) -> None:
    result = await hass.config_entries.options.async_configure(form["flow_id"], data)
    await hass.async_block_till_done(wait_background_tasks=True)
    assert result["type"] is FlowResultType.CREATE_ENTRY


async def test_the_engine_reports_its_model_context(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    """The real engine serving tiny-tools reports its context (32,768 tokens): the
    agents go by it, diagnostics show it, and the options form does not ask for it."""
    data = entry.runtime_data
    assert data.backend.info.kind is ServerKind.HEARTH
    assert data.backend.info.context_length == 32768
    assert data.coordinator.context_length == 32768
    diagnostics = await async_get_config_entry_diagnostics(hass, entry)
    assert diagnostics["engine"]["context_length"] == 32768
    assert diagnostics["engine"]["server"]["context_length"] == 32768
    form = await _options_form(hass, entry)
    assert _fields(form) == [CONF_STALL_TIMEOUT]
    hass.config_entries.options.async_abort(form["flow_id"])


@pytest.fixture
async def plain(socket_enabled: None) -> AsyncIterator[FakeServer]:
    """An OpenAI-compatible server that tells neither its kind nor its model's context."""
    server = FakeServer("someone", "http_requests_total 3\n")
    await server.start()
    yield server
    await server.stop()


async def test_a_server_that_does_not_tell_takes_the_option(
    hass: HomeAssistant, house: None, plain: FakeServer
) -> None:
    """Unknown until the entry's option says it; the option applies at once (no reload:
    the pins stay) and an empty field makes it unknown again."""
    entry = make_entry(plain.url)
    await async_setup_entry(hass, entry)
    loaded = entry.runtime_data
    assert loaded.backend.info.kind is ServerKind.OPENAI
    assert loaded.backend.info.context_length is None
    assert loaded.coordinator.context_length is None

    form = await _options_form(hass, entry)
    assert _fields(form) == [CONF_STALL_TIMEOUT, CONF_CONTEXT_LENGTH]
    await _configure(hass, form, {CONF_STALL_TIMEOUT: 25, CONF_CONTEXT_LENGTH: 8192})
    assert entry.options == {CONF_STALL_TIMEOUT: 25.0, CONF_CONTEXT_LENGTH: 8192}
    assert entry.runtime_data is loaded
    assert loaded.coordinator.context_length == 8192
    diagnostics = await async_get_config_entry_diagnostics(hass, entry)
    assert diagnostics["engine"]["context_length"] == 8192
    assert diagnostics["engine"]["server"]["context_length"] is None  # not reported

    form = await _options_form(hass, entry)
    (key,) = (key for key in form["data_schema"].schema if key == CONF_CONTEXT_LENGTH)
    assert key.description == {"suggested_value": 8192}  # shown as set
    await _configure(hass, form, {CONF_STALL_TIMEOUT: 25})  # the field emptied
    assert entry.options == {CONF_STALL_TIMEOUT: 25.0}
    assert loaded.coordinator.context_length is None


async def test_what_the_server_reports_wins_over_the_option(
    hass: HomeAssistant, house: None, socket_enabled: None
) -> None:
    """vLLM reports ``max_model_len``: that is the context, whatever an option kept from
    an earlier server at the same address says, and the form does not ask for it."""
    server = FakeServer("vllm", VLLM_METRICS)
    server.model = dict(VLLM_MODEL)
    await server.start()
    try:
        entry = make_entry(server.url, entry_options={CONF_CONTEXT_LENGTH: 2048})
        await async_setup_entry(hass, entry)
        assert entry.runtime_data.backend.info.kind is ServerKind.VLLM
        assert entry.runtime_data.coordinator.context_length == 8192
        form = await _options_form(hass, entry)
        assert _fields(form) == [CONF_STALL_TIMEOUT]
        await _configure(hass, form, {CONF_STALL_TIMEOUT: 30})
        assert entry.options == {CONF_STALL_TIMEOUT: 30.0, CONF_CONTEXT_LENGTH: 2048}
    finally:
        await server.stop()
