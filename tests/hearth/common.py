"""Helpers for the Hearth integration tests: a real engine process, entries, traces.

The tests talk to a real Hearth engine process (``hearth_engine serve --model
tiny-tools`` from the engine venv) on a free loopback port: one shared engine for
the session, one with an API key for the auth tests, and private engines for the
tests that stop and restart one. ``tiny-tools`` answers deterministically (see
tests below), so a real tool loop can run in Home Assistant. Nothing in the
integration is mocked unless a test says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest.mock import patch

from aiohttp import web
from homeassistant.components import conversation
from homeassistant.components.conversation import trace as conversation_trace
from homeassistant.config_entries import ConfigSubentryData
from homeassistant.const import CONF_API_KEY, CONF_URL
from homeassistant.core import Context, HomeAssistant
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.hearth.backend.api import HearthClient
from custom_components.hearth.backend.chat import ChatClient
from custom_components.hearth.const import (
    CONF_EXAMPLES,
    CONF_READ_FIRST,
    DOMAIN,
    RECOMMENDED_CONVERSATION_OPTIONS,
    SUBENTRY_CONVERSATION,
)

ROOT = Path(__file__).resolve().parents[2]
ENGINE_PYTHON = Path(os.environ.get("HEARTH_ENGINE_PYTHON", ROOT / ".venv/engine/bin/python"))
ENGINE_MODEL = "tiny-tools"
ENGINE_KEY = "hk-hearth-test-3f9a1c"
START_TIMEOUT_S = 240.0  # a cold start on a busy 2-core machine (first torch import)

KITCHEN_LIGHT = "light.kitchen_light"
KITCHEN_SWITCH = "input_boolean.kitchen_light_power"


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class EngineProcess:
    """A ``hearth_engine serve`` subprocess on a fixed port (restartable)."""

    port: int
    log_path: Path
    api_key: str | None = None
    kv_cache_mb: int = 256
    model: str = ENGINE_MODEL  # a name the engine knows, or a model folder
    args: tuple[str, ...] = ()  # more ``serve`` arguments
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        cmd = [
            str(ENGINE_PYTHON),
            "-m",
            "hearth_engine",
            "serve",
            "--model",
            self.model,
            # A fixed dtype: ``auto`` picks bfloat16 on CPUs with AVX512-BF16/AMX, and
            # the tests check tiny-tools' exact replies.
            "--dtype",
            "float32",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--kv-cache-mb",
            str(self.kv_cache_mb),
            "--threads",
            "1",
        ]
        if self.api_key:
            cmd += ["--api-key", self.api_key]
        cmd += self.args
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
        self.wait_ready()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"engine exited:\n{self.log()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"engine not ready:\n{self.log()[-3000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def request(self, method: str, path: str) -> Any:
        """A blocking request to the engine (for assertions and clean-up)."""
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        req = urllib.request.Request(f"{self.url}{path}", method=method, headers=headers)
        with urllib.request.urlopen(req, timeout=30) as response:
            return json.loads(response.read())

    def pins(self) -> dict[str, dict[str, Any]]:
        return {pin["name"]: pin for pin in self.request("GET", "/v1/prefixes")["data"]}

    def delete_pins(self) -> None:
        for name in self.pins():
            with contextlib.suppress(urllib.error.HTTPError):
                self.request("DELETE", f"/v1/prefixes/{name}")


def agent_options(**overrides: Any) -> dict[str, Any]:
    """Options of a conversation subentry: the recommended ones, but without worked
    examples or reading the house first for questions unless asked (``CONF_EXAMPLES``,
    ``CONF_READ_FIRST``): the tests read requests by message index and script tiny-tools
    by its last message; test_examples.py and test_questions.py cover those."""
    off = {CONF_EXAMPLES: False, CONF_READ_FIRST: False}
    return {**RECOMMENDED_CONVERSATION_OPTIONS, **off, **overrides}


def make_entry(
    url: str,
    api_key: str | None = None,
    *,
    entry_options: dict[str, Any] | None = None,
    **options: Any,
) -> MockConfigEntry:
    """A Hearth entry as the config flow makes it ("Hearth engine" with the default
    conversation agent "Hearth"); ``options``: the agent's, ``entry_options``: the
    entry's."""
    data = {CONF_URL: url}
    if api_key:
        data[CONF_API_KEY] = api_key
    return MockConfigEntry(
        domain=DOMAIN,
        title="Hearth engine",
        data=data,
        options=entry_options or {},
        unique_id=url,
        subentries_data=[
            ConfigSubentryData(
                data=agent_options(**options),
                subentry_type=SUBENTRY_CONVERSATION,
                title="Hearth",
                unique_id=None,
            )
        ],
    )


async def async_setup_entry(hass: HomeAssistant, entry: MockConfigEntry) -> None:
    """Add and set up ``entry``; wait until every agent's prefix is pinned."""
    entry.add_to_hass(hass)
    assert await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done(wait_background_tasks=True)


def function_tool(name: str, *arguments: str) -> dict[str, Any]:
    """An OpenAI function tool ``name`` that takes string ``arguments`` (in that order)."""
    properties = {arg: {"type": "string"} for arg in arguments}
    return {
        "type": "function",
        "function": {"name": name, "parameters": {"properties": properties}},
    }


def hearth_traces() -> list[dict[str, Any]]:
    """The ``hearth`` details of the recent conversation traces, oldest first."""
    return [
        event["data"]["hearth"]
        for trace in conversation_trace.async_get_traces()
        for event in trace.as_dict()["events"]
        if event["event_type"] == conversation_trace.ConversationTraceEventType.AGENT_DETAIL
        and "hearth" in (event["data"] or {})
    ]


async def converse(
    hass: HomeAssistant,
    text: str,
    conversation_id: str | None = None,
    *,
    agent_id: str = "conversation.hearth",
    device_id: str | None = None,
    extra_system_prompt: str | None = None,
) -> conversation.ConversationResult:
    """One turn through Home Assistant's conversation API."""
    return await conversation.async_converse(
        hass,
        text,
        conversation_id,
        Context(),
        agent_id=agent_id,
        device_id=device_id,
        extra_system_prompt=extra_system_prompt,
    )


def speech(result: conversation.ConversationResult) -> str:
    """The plain speech of a conversation result."""
    return str(result.response.speech["plain"]["speech"])


class ChatSpy:
    """Records the bodies the integration sends to ``/v1/chat/completions``.

    A pass-through wrapper, not a mock: every request still reaches the engine.
    """

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.replies: list[str] = []  # the streamed text of each reply
        self._original = ChatClient.async_chat_stream

    def __enter__(self) -> ChatSpy:
        spy = self

        async def wrapper(client: ChatClient, body: Any) -> Any:
            spy.bodies.append(json.loads(json.dumps(body)))
            spy.replies.append("")
            async for chunk in spy._original(client, body):
                for choice in chunk.get("choices") or ():
                    spy.replies[-1] += (choice.get("delta") or {}).get("content") or ""
                yield chunk

        self._patch = patch.object(ChatClient, "async_chat_stream", wrapper)
        self._patch.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._patch.stop()


class PutSpy:
    """Records each ``PUT /v1/prefixes/{name}`` (its name and body); every call still
    reaches the engine (a pass-through, not a mock)."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.bodies: list[dict[str, Any]] = []

    def __enter__(self) -> PutSpy:
        original = HearthClient.async_put_prefix
        spy = self

        async def wrapper(client: HearthClient, name: str, body: Any) -> dict[str, Any]:
            spy.names.append(name)
            spy.bodies.append(body)
            return await original(client, name, body)

        self._patch = patch.object(HearthClient, "async_put_prefix", wrapper)
        self._patch.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._patch.stop()


class LoopbackServer:
    """A real aiohttp server on a loopback port for the tests' stand-in servers;
    subclasses add their routes in ``add_routes``."""

    def __init__(self) -> None:
        self.port = free_port()
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add_routes(self, app: web.Application) -> None:
        raise NotImplementedError

    async def start(self) -> None:
        app = web.Application()
        self.add_routes(app)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
