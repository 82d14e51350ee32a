"""One dataset home in a real Home Assistant, with Hearth wired in, and how to ask it.

The demo stack's Home Assistant (harness/stack.py) runs from a private copy of ``config/``
whose ``house.yaml`` is replaced: no demo floors, the home's ``_fixtures.yaml`` instead
(``hearth_demo`` builds it: areas, entities with the fixture's ids and states), Hearth
pointed at the engine (through the recording proxy) and the preferred Assist pipeline
on Hearth with "prefer handling commands locally". The engine is shared by all homes.

Home Assistant speaks the home's language (its ``configuration.yaml`` says so before the
first start, so the preferred pipeline is made in it; conversation requests name it
too). A fixture entity the demo cannot build is left out with a warning in Home
Assistant's log (``left_out``); a home the demo cannot build at all stops the start at
once with the logged reason (HomeStartError).

With ``house_scale`` N the demo adds N guest suites to the home (house_scale.py): names
no sentence asks for, in the prompt beside the home's own. They are watched, not reset:
a sentence that moves one is judged wrong, as for any change it did not ask for.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from ..harness.server import EngineProcess
from ..harness.stack import HomeAssistantStartError, Stack
from .data import Home
from .refusals import refusal_patterns
from .setup import set_unit_system, unit_system

AGENT = "conversation.hearth"
STALL_TIMEOUT_S = 120.0  # the most Hearth's options form takes (config_flow_options)
LANGUAGE_LINE = re.compile(r"^(\s+language:) \S+$", re.MULTILINE)
# What Home Assistant logs when the demo integration cannot build the home.
SETUP_FAILED = re.compile(
    r"Invalid demo house in house\.yaml: .*"
    r"|Setup failed for custom integration '?hearth_demo.*"
    r"|Error during setup of component hearth_demo.*"
)
LEFT_OUT = re.compile(r"Fixture entity left out: (.*)")


class HomeStartError(RuntimeError):
    """The home's Home Assistant cannot start (one line: why)."""


def set_language(configuration: Path, language: str) -> None:
    """Make Home Assistant's own language ``language`` in a copied configuration.yaml."""
    text = configuration.read_text()
    new, count = LANGUAGE_LINE.subn(rf"\1 {language}", text, count=1)
    if count != 1:
        raise HomeStartError(f"{configuration}: no `language:` line to set to {language}")
    configuration.write_text(new)


def house_yaml(
    fixtures: Path, engine_url: str, agent_options: Mapping[str, Any] | None = None
) -> str:
    """The demo integration's config for a dataset home (JSON is YAML)."""
    hearth: dict[str, Any] = {
        "engine_url": engine_url,
        "set_pipeline": True,
        "prefer_local": True,
        # Answers are judged, not speed: a token that a loaded host is slow to send is
        # waited for as long as Hearth's options allow, not spoken as "stalled".
        "entry_options": {"stall_timeout": STALL_TIMEOUT_S},
    }
    if agent_options:
        hearth["agent_options"] = dict(agent_options)
    return json.dumps({"hearth": hearth, "fixtures": str(fixtures.resolve())})


@dataclass
class Answer:
    """A reply, how long it took, and which path answered (``local``: HA's matcher);
    ``done``: the targets the conversation result reports done (its intent response's
    ``data.success``: Home Assistant's answer to the turn's last call, which no later
    request carries to the engine)."""

    text: str
    ms: float
    path: str
    done: tuple[str, ...] = ()


class HomeStack:
    """Home Assistant for one home, sharing ``engine``; requests go in over HTTP/WS."""

    def __init__(
        self,
        workdir: Path,
        home: Home,
        engine: EngineProcess,
        engine_url: str,
        agent_options: Mapping[str, Any] | None = None,
        house_scale: int = 0,
    ):
        self.home = home
        self.stack = Stack(workdir, [], engine_url=engine_url, house_scale=house_scale)
        self.stack.engine = engine  # shared: never started or stopped here
        config = workdir / "config"
        (config / "house.yaml").write_text(house_yaml(home.fixtures, engine_url, agent_options))
        set_language(config / "configuration.yaml", home.language)
        set_unit_system(config / "configuration.yaml", unit_system(home.entities))
        self.left_out: list[str] = []  # "<entity id>: <why>", as Home Assistant logged it
        self.exposed: list[str] = []  # the entity ids exposed to Assist, once started
        self.distractors: set[str] = set()  # those of the guest suites (house_scale)
        self.refusals = refusal_patterns(home.language)  # "not done", in its language

    def _log(self) -> str:
        return self.stack.ha.log_text

    def _setup_failed(self) -> str | None:
        found = SETUP_FAILED.search(self._log())
        return f"{self.home.name}: {found.group(0).strip()}" if found else None

    async def start(self, timeout: float = 600) -> HomeStack:
        """Start Home Assistant; return once Hearth's agent and pipeline are wired.

        Raises HomeStartError (one line) when the home cannot be built or Home Assistant
        does not start."""
        try:
            self.stack.ha.start(failed=self._setup_failed)
        except HomeAssistantStartError as err:
            raise HomeStartError(str(err)) from None
        try:
            await self.stack.wait_for(self._agent_or_failed, timeout=timeout)
            await self.stack.wait_for(self._pipeline_wired, timeout=timeout)
            await self.stack.wait_for(self._pinned, timeout=timeout, interval=1)
        except TimeoutError as err:
            raise HomeStartError(f"{self.home.name}: Hearth was not wired in: {err}") from None
        self.left_out = LEFT_OUT.findall(self._log())
        self.exposed = await self.stack.exposed_entities()
        if self.stack.ha.house_scale:
            self.distractors = set(self.exposed) - set(self.home.entities)
        return self

    async def _agent_or_failed(self) -> bool:
        if why := self._setup_failed():
            raise HomeStartError(why)
        return await self.stack.find_state(AGENT) is not None

    async def stop(self) -> None:
        """Stop Home Assistant, then unpin what its agent pinned. The homes of a run take
        turns on one engine, which never evicts a pin: in float32 (a CPU without native
        bf16) four homes' pins held most of the default KV budget, and every request of
        the fifth was refused as busy."""
        self.stack.ha.stop()
        try:
            await self.stack.unpin_all()
        except (aiohttp.ClientError, OSError) as err:
            print(
                f"[{self.home.name}] warning: its pins stay on the engine: {err}", file=sys.stderr
            )
        finally:
            await self.stack.close()

    async def _pipeline_wired(self) -> bool:
        (result,) = await self.stack.ws({"type": "assist_pipeline/pipeline/list"})
        data = result["result"]
        preferred = next(p for p in data["pipelines"] if p["id"] == data["preferred_pipeline"])
        return bool(preferred["conversation_engine"] == AGENT and preferred["prefer_local_intents"])

    async def _pinned(self) -> bool:
        pins = (await self.stack.engine_get("/v1/prefixes"))["data"]
        return bool(pins) and all(p["state"] == "ready" for p in pins)

    # -- state ---------------------------------------------------------------------------
    @property
    def left_out_ids(self) -> set[str]:
        return {line.split(":", 1)[0].strip() for line in self.left_out}

    async def reset(self, states: dict[str, dict[str, Any]]) -> None:
        """Put every built entity of the home in the given fixture states (JSON's
        values: accuracy_setup.passable). Raises ResetRefused where the demo refuses
        one (HTTP 400: a state it cannot take), with its reason."""
        skip = self.left_out_ids
        built = {k: v for k, v in states.items() if k not in skip}
        session = await self.stack._session()
        url = f"{self.stack.ha.url}/api/services/hearth_demo/set_states"
        async with session.post(url, json={"states": built}, headers=self.stack._auth) as resp:
            if resp.status == 400:
                raise ResetRefused(_reason(await resp.text()))
            resp.raise_for_status()

    async def snapshot(self) -> dict[str, dict[str, Any]]:
        """The home's entities and the guest suites' as ``{entity_id: {state, attributes}}``."""
        states = await self.stack.api("GET", "/api/states")
        return {
            s["entity_id"]: {"state": s["state"], "attributes": s["attributes"]}
            for s in states
            if s["entity_id"] in self.home.entities or s["entity_id"] in self.distractors
        }

    # -- requests ------------------------------------------------------------------------
    async def ask_agent(self, text: str, device_id: str | None) -> Answer:
        """Straight to the Hearth agent (``llm`` mode)."""
        extra: dict[str, Any] = {"language": self.home.language}
        if device_id:
            extra["device_id"] = device_id
        started = time.perf_counter()
        result = await self.stack.converse(text, agent_id=AGENT, **extra)
        ms = (time.perf_counter() - started) * 1000
        return Answer(_speech(result), ms, "hearth", done_targets(result))

    async def ask_pipeline(self, text: str, device_id: str | None) -> Answer:
        """Through the preferred Assist pipeline, text in, intent out (``pipeline`` mode)."""
        session = await self.stack._session()
        message = {
            "id": 1,
            "type": "assist_pipeline/run",
            "start_stage": "intent",
            "end_stage": "intent",
            "input": {"text": text},
            "device_id": device_id,
        }
        started = time.perf_counter()
        end: dict[str, Any] | None = None
        async with session.ws_connect(f"{self.stack.ha.url}/api/websocket") as socket:
            await socket.receive_json()
            await socket.send_json({"type": "auth", "access_token": self.stack.ha.token})
            await socket.receive_json()
            await socket.send_json(message)
            while True:
                event = await socket.receive_json()
                if event.get("type") == "result" and not event.get("success"):
                    raise PipelineError(str(event.get("error")))
                kind = (event.get("event") or {}).get("type")
                data = (event.get("event") or {}).get("data") or {}
                if kind == "intent-end":
                    end = data
                elif kind == "error":
                    raise PipelineError(f"{data.get('code')}: {data.get('message')}")
                elif kind == "run-end":
                    break
        ms = (time.perf_counter() - started) * 1000
        if end is None:
            raise PipelineError("the pipeline ended without an intent")
        path = "local" if end.get("processed_locally") else "hearth"
        output = end.get("intent_output") or {}
        return Answer(_speech(output), ms, path, done_targets(output))


class PipelineError(RuntimeError):
    """The Assist pipeline reported an error event."""


class ResetRefused(ValueError):
    """The demo refused a state of the reset (the message: its reason)."""


def _reason(body: str) -> str:
    """Home Assistant's message in an error body (JSON ``message``), else the body."""
    try:
        found = json.loads(body)
    except ValueError:
        return body.strip()[:200]
    return str(found.get("message") if isinstance(found, dict) else found)[:200]


def _speech(result: dict[str, Any]) -> str:
    speech = ((result.get("response") or {}).get("speech") or {}).get("plain") or {}
    return str(speech.get("speech") or "")


def done_targets(result: dict[str, Any]) -> tuple[str, ...]:
    """The ids (else names) of the targets a conversation result reports done (an
    answer's ``success`` is what it read: "what's the weather like" acts on nothing)."""
    response = result.get("response") or {}
    if response.get("response_type") != "action_done":
        return ()
    data = response.get("data") or {}
    success = data.get("success") if isinstance(data, dict) else None
    return tuple(str(t.get("id") or t.get("name")) for t in success or () if isinstance(t, dict))


REQUEST_ERRORS = (aiohttp.ClientError, TimeoutError, PipelineError, ValueError)
