"""Fixtures for the Hearth integration tests.

The tests talk to a real Hearth engine process (``hearth_engine serve --model
tiny-tools`` from the engine venv) on a free loopback port: one shared engine for
the session, one with an API key for the auth tests, and private engines for the
tests that stop and restart one. ``tiny-tools`` answers deterministically, so a
real tool loop runs in Home Assistant. Nothing in the integration is mocked unless
a test says so.
"""

from __future__ import annotations

# Must come first: otherwise ``custom_components`` resolves to the test plugin's own
# testing_config folder (see docs toolchain.md).
import custom_components.hearth  # noqa: F401  # isort: skip

import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from unittest.mock import PropertyMock, patch

import pytest
import pytest_socket
from homeassistant.core import HomeAssistant
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import entity_registry as er
from homeassistant.setup import async_setup_component
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.hearth.const import CONF_REPIN_DEBOUNCE

from .common import (
    ENGINE_KEY,
    ENGINE_MODEL,
    ENGINE_PYTHON,
    KITCHEN_LIGHT,
    KITCHEN_SWITCH,
    EngineProcess,
    PutSpy,
    async_setup_entry,
    free_port,
    make_entry,
)


@contextmanager
def sockets_allowed() -> Iterator[None]:
    """Allow sockets in a session fixture (pytest-socket blocks them outside
    ``socket_enabled``, which only function-scoped fixtures can use)."""
    saved = socket.socket
    pytest_socket.enable_socket()
    try:
        yield
    finally:
        socket.socket = saved  # type: ignore[misc]


def _launch(
    tmp_path_factory: pytest.TempPathFactory,
    api_key: str | None,
    kv_cache_mb: int = 256,
    model: str = ENGINE_MODEL,
    args: tuple[str, ...] = (),
) -> EngineProcess:
    if not ENGINE_PYTHON.exists():
        pytest.fail(f"engine venv not found at {ENGINE_PYTHON} (run scripts/setup)")
    with sockets_allowed():
        engine = EngineProcess(
            free_port(),
            tmp_path_factory.mktemp("engine") / "engine.log",
            api_key=api_key,
            kv_cache_mb=kv_cache_mb,
            model=model,
            args=args,
        )
        engine.start()
    return engine


@pytest.fixture(scope="session")
def shared_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    """One engine for the whole session (no API key)."""
    engine = _launch(tmp_path_factory, None)
    yield engine
    engine.stop()


@pytest.fixture(scope="session")
def keyed_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    """An engine that requires ``ENGINE_KEY``."""
    engine = _launch(tmp_path_factory, ENGINE_KEY)
    yield engine
    engine.stop()


@pytest.fixture
def engine(shared_engine: EngineProcess, socket_enabled: None) -> Iterator[EngineProcess]:
    """The shared engine; the pins a test made are dropped afterwards."""
    yield shared_engine
    if shared_engine.proc is not None and shared_engine.proc.poll() is None:
        shared_engine.delete_pins()


@pytest.fixture
def keyed(keyed_engine: EngineProcess, socket_enabled: None) -> Iterator[EngineProcess]:
    """The engine with an API key (``ENGINE_KEY``); pins dropped afterwards."""
    yield keyed_engine
    keyed_engine.delete_pins()


@pytest.fixture
def private_engine_factory(
    tmp_path_factory: pytest.TempPathFactory, socket_enabled: None
) -> Iterator[Callable[..., EngineProcess]]:
    """Engines of a single test (stopped at the end), for stop/restart tests."""
    started: list[EngineProcess] = []

    def factory(
        api_key: str | None = None,
        kv_cache_mb: int = 256,
        model: str = ENGINE_MODEL,
        args: tuple[str, ...] = (),
    ) -> EngineProcess:
        engine = _launch(tmp_path_factory, api_key, kv_cache_mb, model, args)
        started.append(engine)
        return engine

    yield factory
    for engine in started:
        engine.stop()


@pytest.fixture
def entity_registry_enabled_by_default() -> Iterator[None]:
    """Every entity enabled, including those disabled by default (as in HA core's tests)."""
    with patch(
        "homeassistant.helpers.entity.Entity.entity_registry_enabled_default",
        new_callable=PropertyMock,
        return_value=True,
    ):
        yield


@pytest.fixture(autouse=True)
def auto_enable_custom_integrations(enable_custom_integrations: None) -> None:
    """Load ``custom_components.hearth``."""


@pytest.fixture
async def house(hass: HomeAssistant) -> None:
    """A small real house: a template light "Kitchen Light" (backed by an
    input_boolean) in the Kitchen, plus a Living Room; the light is exposed to Assist."""
    await async_setup_house(hass)


async def async_setup_house(hass: HomeAssistant, **booleans: str) -> None:
    """The ``house`` fixture's house, with ``booleans`` more input_booleans (object id ->
    name) beside the light's power."""
    assert await async_setup_component(hass, "homeassistant", {})
    config = {"kitchen_light_power": {"name": "Power"}}
    config |= {object_id: {"name": name} for object_id, name in booleans.items()}
    assert await async_setup_component(hass, "input_boolean", {"input_boolean": config})
    assert await async_setup_component(
        hass,
        "template",
        {
            "template": [
                {
                    "light": [
                        {
                            "name": "Kitchen Light",
                            "unique_id": "kitchen_light",
                            "state": f"{{{{ is_state('{KITCHEN_SWITCH}', 'on') }}}}",
                            "turn_on": {
                                "action": "input_boolean.turn_on",
                                "target": {"entity_id": KITCHEN_SWITCH},
                            },
                            "turn_off": {
                                "action": "input_boolean.turn_off",
                                "target": {"entity_id": KITCHEN_SWITCH},
                            },
                        }
                    ]
                }
            ]
        },
    )
    await hass.async_block_till_done()
    areas = ar.async_get(hass)
    kitchen = areas.async_create("Kitchen")
    areas.async_create("Living Room")
    er.async_get(hass).async_update_entity(KITCHEN_LIGHT, area_id=kitchen.id)
    await hass.async_block_till_done()


@pytest.fixture
async def entry(hass: HomeAssistant, house: None, engine: EngineProcess) -> MockConfigEntry:
    """A loaded Hearth entry on the shared engine, its prefix pinned."""
    config_entry = make_entry(engine.url, **{CONF_REPIN_DEBOUNCE: 2.0})
    await async_setup_entry(hass, config_entry)
    return config_entry


@pytest.fixture
def puts() -> Iterator[PutSpy]:
    """The prefix PUTs of the test (``PutSpy``)."""
    with PutSpy() as spy:
        yield spy
