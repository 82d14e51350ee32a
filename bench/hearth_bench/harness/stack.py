"""The whole product as processes: an engine and a real Home Assistant with the demo house.

Used by the end-to-end tests and by the prompt capture. Home Assistant runs from a
private copy of ``config/`` (so runs never touch the developer's ``.storage``), on free
loopback ports, with Hearth pointed at the engine through ``HEARTH_ENGINE_URL`` and the
house's guest suites set by ``HEARTH_HOUSE_SCALE`` (house_scale.py; 0: none).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from ..house_scale import environment
from .server import EngineProcess, free_port

ROOT = Path(__file__).resolve().parents[3]
HA_PYTHON = ROOT / ".venv" / "ha" / "bin" / "python"
RUNTIME_FILES = {
    ".storage",
    "deps",
    "tts",
    "blueprints",
    ".HA_VERSION",
    ".ha_run.lock",
    ".demo_password",
    ".demo_token",
}


def copy_config(target: Path) -> Path:
    """A clean copy of the repo's ``config/`` with Hearth linked in by absolute path
    (a copy left by an earlier run in the same ``--workdir`` is replaced)."""

    def ignore(directory: str, names: list[str]) -> set[str]:
        skip = {n for n in names if n in RUNTIME_FILES or n.startswith("home-assistant")}
        if Path(directory).name == "custom_components":
            skip.add("hearth")
        return skip

    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(ROOT / "config", target, ignore=ignore)
    (target / "custom_components" / "hearth").symlink_to(ROOT / "custom_components" / "hearth")
    return target


class HomeAssistantStartError(RuntimeError):
    """Home Assistant did not start (the message says why, in one line)."""


class HomeAssistantProcess:
    def __init__(
        self, config: Path, engine_url: str, port: int | None = None, house_scale: int = 0
    ) -> None:
        self.config = config
        self.house_scale = house_scale
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.engine_url = engine_url
        self.proc: subprocess.Popen[bytes] | None = None
        self.token = ""

    def start(
        self, timeout: float = 300, failed: Callable[[], str | None] | None = None
    ) -> HomeAssistantProcess:
        """Start and wait until Home Assistant runs; ``failed`` (polled while waiting)
        returns why the start cannot succeed, which stops it at once."""
        http_config = ROOT / "scripts" / "lib" / "ha_http_config.py"
        subprocess.run(
            [str(HA_PYTHON), str(http_config), "--config", str(self.config),
             "--host", "127.0.0.1", "--port", str(self.port)],
            check=True,
            capture_output=True,
        )  # fmt: skip
        env = {
            **os.environ,
            "HEARTH_ENGINE_URL": self.engine_url,
            **environment(self.house_scale),
        }
        log = (self.config / "console.log").open("ab")
        self.proc = subprocess.Popen(
            # The `hass` entry point, not `python -m homeassistant`: -m puts the working
            # directory first on sys.path, and the repo's own custom_components/ would
            # then hide the config's hearth_demo integration.
            [str(HA_PYTHON.with_name("hass")), "-c", str(self.config), "--skip-pip"],
            cwd=self.config,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        log.close()
        token_file = self.config / ".demo_token"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise HomeAssistantStartError(
                    f"Home Assistant exited; see {self.config / 'home-assistant.log'}"
                )
            if failed is not None and (why := failed()):
                self.stop()
                raise HomeAssistantStartError(why)
            if token_file.exists() and token_file.read_text().strip():
                self.token = token_file.read_text().strip()
                if self._running():
                    return self
            time.sleep(0.5)
        self.stop()
        raise HomeAssistantStartError(f"Home Assistant did not start in {timeout} s")

    def _running(self) -> bool:
        import json
        import urllib.error
        import urllib.request

        request = urllib.request.Request(
            f"{self.url}/api/config", headers={"Authorization": f"Bearer {self.token}"}
        )
        with (
            contextlib.suppress(OSError, urllib.error.URLError, ValueError),
            urllib.request.urlopen(request, timeout=5) as response,
        ):
            return json.load(response).get("state") == "RUNNING"
        return False

    def stop(self, timeout: float = 120) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    @property
    def log_text(self) -> str:
        path = self.config / "home-assistant.log"
        return path.read_text(errors="replace") if path.exists() else ""


class Stack:
    """Engine + Home Assistant, with REST and WebSocket helpers."""

    def __init__(
        self,
        workdir: Path,
        engine_args: list[str],
        engine_url: str | None = None,
        house_scale: int = 0,
    ) -> None:
        """``engine_url``, if given, is what Home Assistant uses instead of the engine's
        own URL (e.g. a recording proxy in front of the engine); ``house_scale`` guest
        suites are added to the house (house_scale.py)."""
        self.workdir = workdir
        self.store = workdir / "store"
        self.engine_args = [*engine_args, "--prefix-store", str(self.store)]
        self.engine = EngineProcess(self.engine_args, workdir / "engine.log")
        self.ha = HomeAssistantProcess(
            copy_config(workdir / "config"), engine_url or self.engine.url, house_scale=house_scale
        )
        self.session: aiohttp.ClientSession | None = None
        self._ids = itertools.count(1)

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> Stack:
        self.engine.start()
        self.ha.start()
        return self

    def stop(self) -> None:
        self.ha.stop()
        self.engine.stop()

    def restart_engine(self) -> None:
        self.engine = EngineProcess(
            self.engine_args, self.workdir / "engine.log", port=self.engine.port
        )
        self.engine.start()

    # -- HTTP ------------------------------------------------------------------------
    async def _session(self) -> aiohttp.ClientSession:
        if self.session is None or self.session.closed:
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600))
        return self.session

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    @property
    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.ha.token}"}

    async def state(self, entity_id: str) -> dict[str, Any]:
        session = await self._session()
        async with session.get(f"{self.ha.url}/api/states/{entity_id}", headers=self._auth) as resp:
            resp.raise_for_status()
            return dict(await resp.json())

    async def find_state(self, entity_id: str) -> dict[str, Any] | None:
        """The entity's state, or None while it does not exist (404)."""
        try:
            return await self.state(entity_id)
        except aiohttp.ClientResponseError as err:
            if err.status == 404:
                return None
            raise

    async def service(self, domain: str, service: str, **data: Any) -> None:
        session = await self._session()
        url = f"{self.ha.url}/api/services/{domain}/{service}"
        async with session.post(url, json=data, headers=self._auth) as resp:
            resp.raise_for_status()

    async def converse(
        self, text: str, agent_id: str = "conversation.hearth", **extra: Any
    ) -> dict[str, Any]:
        session = await self._session()
        body = {"text": text, "agent_id": agent_id, "language": "en", **extra}
        url = f"{self.ha.url}/api/conversation/process"
        async with session.post(url, json=body, headers=self._auth) as resp:
            resp.raise_for_status()
            return dict(await resp.json())

    async def api(self, method: str, path: str, body: Any = None) -> Any:
        """Call a Home Assistant REST endpoint (``path`` starts with ``/api/``); its JSON."""
        session = await self._session()
        url = f"{self.ha.url}{path}"
        async with session.request(method, url, json=body, headers=self._auth) as resp:
            resp.raise_for_status()
            return await resp.json()

    async def exposed_entities(self) -> list[str]:
        """The entity ids exposed to Assist (conversation agents), sorted."""
        (reply,) = await self.ws({"type": "homeassistant/expose_entity/list"})
        exposed = reply["result"]["exposed_entities"]
        return sorted(e for e, to in exposed.items() if to.get("conversation"))

    async def engine_get(self, path: str) -> dict[str, Any]:
        session = await self._session()
        async with session.get(f"{self.engine.url}{path}") as resp:
            resp.raise_for_status()
            return dict(await resp.json())

    async def unpin_all(self) -> None:
        """Delete every prefix pinned on the engine."""
        session = await self._session()
        for pin in (await self.engine_get("/v1/prefixes"))["data"]:
            async with session.delete(f"{self.engine.url}/v1/prefixes/{pin['name']}") as resp:
                resp.raise_for_status()

    async def ws(self, *messages: dict[str, Any]) -> list[dict[str, Any]]:
        """Send WebSocket commands (authenticated); returns their results in order."""
        session = await self._session()
        results = []
        async with session.ws_connect(f"{self.ha.url}/api/websocket") as socket:
            await socket.receive_json()  # auth_required
            await socket.send_json({"type": "auth", "access_token": self.ha.token})
            reply = await socket.receive_json()
            if reply.get("type") != "auth_ok":
                raise RuntimeError(f"WebSocket auth failed: {reply}")
            for message in messages:
                command = {"id": next(self._ids), **message}
                await socket.send_json(command)
                while True:
                    result = await socket.receive_json()
                    if result.get("id") == command["id"] and result.get("type") == "result":
                        break
                if not result.get("success"):
                    raise RuntimeError(f"{message['type']} failed: {result.get('error')}")
                results.append(result)
        return results

    async def wait_for(self, predicate: Any, timeout: float = 60, interval: float = 0.5) -> Any:
        """Poll ``await predicate()`` until it returns something truthy."""
        deadline = time.monotonic() + timeout
        while True:
            value = await predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"condition not met in {timeout} s")
            await asyncio.sleep(interval)
