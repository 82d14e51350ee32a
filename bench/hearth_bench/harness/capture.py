"""Capture the household fixture: the prompts the Hearth plugin really sends for the demo house.

``scripts/bench household --capture`` (or ``python -m hearth_bench.harness.capture``) starts the
``tiny-tools`` engine, a recording proxy in front of it and a real Home Assistant running
the demo house (``config/``, private copy) that talks to the engine through the proxy.
It then drives Home Assistant over its public APIs only:

* agent 1 is ``conversation.hearth`` (created by the demo wiring); agent 2, the
  *automation* agent with its own instructions, is added through the subentry flow (REST);
* two voice satellites in different areas: the demo house's entities have no devices, so
  two existing service devices (Backup, and the Hearth engine device) are placed in the
  Kitchen and the Bedroom (``config/device_registry/update``) and their ids are sent as
  ``device_id``; the plugin's context message then carries the area, as for a satellite;
* a multi-turn chat (one ``conversation_id``) and automation events for agent 2;
* two entity renames (``config/entity_registry/update``) and the re-pins they cause.

The fixture (``bench/fixtures/household.json``) keeps each agent's pinned prefix (messages
and tools) initially and after each rename, and every chat request as the suffix after
that prefix; the capture checks that each request starts with the prefix, tools included.
With ``--house-scale N`` the house has N guest suites more (house_scale.py), and the
fixture goes where ``--fixture`` says (``scripts/bench household --house-scale N``: the
cache, scaled_fixture.py); its metadata says N and how many entities were exposed. The
plugin fits a house too big for the model's context to it, so ``scripts/bench household``
captures a scaled house with the model it replays (``--model``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import hashlib
import itertools
import json
import re
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from ..house_scale import add_argument as add_house_scale
from ..house_scale import describe
from .fixture import (
    CAPTURE_COMMAND,
    FIXTURE,
    Agent,
    Fixture,
    Prefix,
    Sample,
    summary,
    write_fixture,
)
from .proxy import Recorded, RecordingProxy
from .server import free_port
from .stack import ROOT, Stack

CAPTURE_MODEL = "tiny-tools"
# The plugin's satellite class pins: ``<agent pin>.<class>`` (device_class.py).
PIN_CLASSES = ("no_timers", "timers")
# What the plugin logs when a prefix cannot fit the model (a house too big for it).
TOO_LONG = re.compile(r"Could not pin the prefix (\S+) .*context_length_exceeded.*")

AGENT_1 = "conversation.hearth"
AUTOMATION_TITLE = "Automation"
AUTOMATION_PROMPT = (
    "You are the automation assistant of this home. Home Assistant automations send you"
    " events (motion, doors, arrivals, the weather). Decide what to change in the house,"
    " act with the tools, and answer with one short sentence for the logbook."
)


@dataclass(frozen=True)
class Satellite:
    role: str
    device: tuple[str, str]  # a device registry identifier of the stand-in device
    area_id: str
    utterances: tuple[str, ...]


SATELLITES = (
    Satellite(
        "satellite_a",
        ("backup", "backup_manager"),
        "kitchen",
        (
            "turn on the kitchen light",
            "turn off the lights",
            "dim the island lights to 30 percent",
            "is the back door locked",
        ),
    ),
    Satellite(
        "satellite_b",
        ("hearth", "{entry_id}"),
        "bedroom",
        (
            "turn off the bedroom light",
            "close the blinds",
            "set the temperature to 19 degrees",
            "what's the temperature in here",
        ),
    ),
)
CHAT_TURNS = (
    "hello, who are you?",
    "which lights are on in the living room?",
    "turn off the living room floor lamp",
    "and the big light too, thanks",
)
AUTOMATION_EVENTS = (
    "Motion detected in the hallway at 23:40 while everyone is in bed.",
    "The front door was unlocked and opened; the first person arrived home.",
    "Rain is starting; the awning and the skylights may be open.",
)
RENAMES = (
    ("light.desk_lamp", "Study Desk Lamp"),
    ("light.mirror_light", "Bathroom Mirror Light"),
)


# --------------------------------------------------------------------- driving HA


@dataclass
class Turn:
    """One ``conversation.process`` call and the chat requests it caused."""

    role: str
    agent: str  # agent key
    turn: int
    records: list[Recorded]
    response: dict[str, Any]


class Capture:
    """A live stack behind a recording proxy, and the conversations driven through it."""

    def __init__(self, stack: Stack, proxy: RecordingProxy) -> None:
        self.stack = stack
        self.proxy = proxy
        self.turns: list[Turn] = []
        self.entry_id = ""
        self.pins: dict[str, str] = {}  # agent key -> pin name
        self.entities: dict[str, str] = {}  # agent key -> conversation entity id
        self.rename_marks: list[int] = []  # proxy record count at each rename

    # -- set-up -------------------------------------------------------------------
    async def hearth_entry(self) -> None:
        entries = (await self.stack.ws({"type": "config_entries/get", "domain": "hearth"}))[0]
        loaded = [e for e in entries["result"] if e["state"] == "loaded"]
        if len(loaded) != 1:
            raise RuntimeError(f"expected one loaded Hearth entry, got {entries['result']}")
        self.entry_id = loaded[0]["entry_id"]

    async def subentries(self) -> list[dict[str, Any]]:
        reply = await self.stack.ws(
            {"type": "config_entries/subentries/list", "entry_id": self.entry_id}
        )
        return list(reply[0]["result"])

    async def add_automation_agent(self) -> None:
        """Agent 2 through Hearth's own subentry flow, over REST, as the UI does."""
        flow = await self.stack.api(
            "POST",
            "/api/config/config_entries/subentries/flow",
            {"handler": [self.entry_id, "conversation"]},
        )
        if flow.get("type") != "form":
            raise RuntimeError(f"subentry flow did not show its form: {flow}")
        result = await self.stack.api(
            "POST",
            f"/api/config/config_entries/subentries/flow/{flow['flow_id']}",
            {"name": AUTOMATION_TITLE, "prompt": AUTOMATION_PROMPT, "llm_hass_api": ["assist"]},
        )
        if result.get("type") != "create_entry":
            raise RuntimeError(f"subentry flow did not create the agent: {result}")

    async def find_agents(self) -> bool:
        """Map both agents to their pin name and conversation entity; False until both exist."""
        subentries = {s["title"]: s["subentry_id"] for s in await self.subentries()}
        registry = (await self.stack.ws({"type": "config/entity_registry/list"}))[0]["result"]
        by_unique_id = {
            e["unique_id"]: e["entity_id"]
            for e in registry
            if e["platform"] == "hearth" and e["entity_id"].startswith("conversation.")
        }
        agent_1 = next((u for u, e in by_unique_id.items() if e == AGENT_1), None)
        automation = subentries.get(AUTOMATION_TITLE)
        if agent_1 is None or automation not in by_unique_id:
            return False
        self.pins = {"hearth": f"hearth.{agent_1}", "automation": f"hearth.{automation}"}
        self.entities = {"hearth": AGENT_1, "automation": by_unique_id[automation]}
        return True

    async def place_satellites(self) -> dict[str, str]:
        """Put the stand-in satellite devices in their areas; role -> device id."""
        devices = (await self.stack.ws({"type": "config/device_registry/list"}))[0]["result"]
        placed = {}
        for satellite in SATELLITES:
            wanted = [satellite.device[0], satellite.device[1].format(entry_id=self.entry_id)]
            device = next((d for d in devices if wanted in d["identifiers"]), None)
            if device is None:
                raise RuntimeError(f"no device {wanted} for {satellite.role}")
            await self.stack.ws(
                {
                    "type": "config/device_registry/update",
                    "device_id": device["id"],
                    "area_id": satellite.area_id,
                }
            )
            placed[satellite.role] = device["id"]
        return placed

    # -- waiting ------------------------------------------------------------------
    async def settle(self, after: int = 0, quiet: float = 4.0, timeout: float = 900) -> None:
        """Every pin ready, each agent PUT since record ``after``, then ``quiet`` s of calm.

        The plugin re-pins after a 2 s debounce; ``quiet`` is longer, so once nothing has
        been PUT for that long, the pins are those of the house as it is now.
        """
        deadline = time.monotonic() + timeout
        while True:
            pins = (await self.stack.engine_get("/v1/prefixes"))["data"]
            ready = {p["name"] for p in pins if p["state"] == "ready"}
            put = {
                r.path.rsplit("/", 1)[-1] for r in self.proxy.records[after:] if r.method == "PUT"
            }
            last = max((r.time for r in self.proxy.records if r.method == "PUT"), default=0.0)
            wanted = set(self.pins.values())
            if wanted <= ready and wanted <= put and time.time() - last > quiet:
                return
            if too_long := too_long_pins(self.stack.ha.log_text, wanted - ready):
                raise RuntimeError(f"the house does not fit the model: {too_long[0]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"pins not settled: ready {ready}, put {put}")
            await asyncio.sleep(0.5)

    # -- conversations ------------------------------------------------------------
    async def converse(self, role: str, agent: str, text: str, turn: int, **extra: Any) -> Turn:
        before = len(self.proxy.records)
        response = await self.stack.converse(text, agent_id=self.entities[agent], **extra)
        records = [r for r in self.proxy.records[before:] if r.method == "POST"]
        answered = (response.get("response") or {}).get("response_type") == "query_answer"
        if not records and not answered:  # HA answers the questions it reads (ha_answer.py)
            raise RuntimeError(f"{role}: '{text}' sent no request to the engine: {response}")
        captured = Turn(role, agent, turn, records, response)
        self.turns.append(captured)
        return captured

    async def rename(self, entity_id: str, name: str) -> None:
        mark = len(self.proxy.records)
        self.rename_marks.append(mark)
        await self.stack.ws(
            {"type": "config/entity_registry/update", "entity_id": entity_id, "name": name}
        )
        await self.settle(after=mark)


def too_long_pins(log: str, pins: set[str]) -> list[str]:
    """The plugin's log lines that say one of ``pins`` is longer than the model's context."""
    return [m.group(0) for m in TOO_LONG.finditer(log) if m.group(1) in pins]


async def drive(capture: Capture) -> dict[str, str]:
    """The whole household session; returns the satellites' device ids."""
    stack = capture.stack
    await stack.wait_for(_exists(stack, AGENT_1), timeout=120)
    await capture.hearth_entry()
    devices = await capture.place_satellites()
    await capture.add_automation_agent()
    await stack.wait_for(capture.find_agents, timeout=120)
    await capture.settle(after=0)
    await _conversations(capture, devices, after_rename=None)
    for n, (entity_id, name) in enumerate(RENAMES, start=1):
        await capture.rename(entity_id, name)
        await _conversations(capture, devices, after_rename=n)
    return devices


def _exists(stack: Stack, entity_id: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        try:
            await stack.state(entity_id)
        except aiohttp.ClientResponseError as err:
            if err.status == 404:
                return False
            raise
        return True

    return check


async def _conversations(
    capture: Capture, devices: dict[str, str], after_rename: int | None
) -> None:
    """Before the renames: every utterance; after each, one per role (new prefix check)."""
    first = after_rename is None
    for satellite in SATELLITES:
        for text in satellite.utterances if first else satellite.utterances[:1]:
            await capture.converse(
                satellite.role, "hearth", text, 1, device_id=devices[satellite.role]
            )
    conversation_id = None
    for turn, text in enumerate(CHAT_TURNS if first else CHAT_TURNS[:1], start=1):
        extra = {"conversation_id": conversation_id} if conversation_id else {}
        result = await capture.converse("chat", "hearth", text, turn, **extra)
        conversation_id = result.response["conversation_id"]
    for text in AUTOMATION_EVENTS if first else AUTOMATION_EVENTS[:1]:
        await capture.converse("automation", "automation", text, 1)


# --------------------------------------------------------------------- building


def build_fixture(capture: Capture, meta: dict[str, Any]) -> Fixture:
    """Each agent's pin, plus each satellite class pin the plugin made for it (an agent
    ``hearth.no_timers`` beside ``hearth``: a satellite's requests start from that one)."""
    agents: dict[str, Agent] = {}
    variants: dict[str, list[Agent]] = {}
    put = {r.path.removeprefix("/v1/prefixes/") for r in capture.proxy.records if r.method == "PUT"}
    for key, pin in capture.pins.items():
        names = [(key, pin)] + [
            (f"{key}.{cls}", f"{pin}.{cls}") for cls in PIN_CLASSES if f"{pin}.{cls}" in put
        ]
        for name, pin_name in names:
            agents[name] = Agent(
                name, capture.entities[key], pin_name, _prefixes(capture, pin_name)
            )
            variants.setdefault(key, []).append(agents[name])
    superseded = {a.key: _superseded(capture, a.pin) for a in agents.values()}
    samples = []
    for turn in capture.turns:
        for iteration, record in enumerate(turn.records):
            mine = variants[turn.agent]
            samples.append(_sample(turn, mine, iteration, record, superseded))
    return Fixture(meta=meta, agents=agents, samples=samples)


def _prefixes(capture: Capture, pin: str) -> list[Prefix]:
    """The agent's prefix before the first rename and after each rename (last PUT of each)."""
    bounds = [0, *capture.rename_marks, len(capture.proxy.records)]
    labels = ["initial", *(f"after rename {n}: {e} -> {name!r}" for n, (e, name) in
                           enumerate(RENAMES, start=1))]  # fmt: skip
    prefixes = []
    for label, (start, end) in zip(labels, itertools.pairwise(bounds), strict=True):
        puts = [
            r
            for r in capture.proxy.records[start:end]
            if r.method == "PUT" and r.path == f"/v1/prefixes/{pin}" and r.status == 200
        ]
        if not puts:
            raise RuntimeError(f"no successful PUT of {pin} in the '{label}' phase")
        body = puts[-1].body
        prefixes.append(Prefix(label, body["messages"], body.get("tools", [])))
    return prefixes


def _superseded(capture: Capture, pin: str) -> list[tuple[int, Prefix]]:
    """Every successful PUT of ``pin`` with its phase (0: before the first rename): the
    plugin also re-pins a house too big for the model within a phase, once it has
    learned how many tokens the house takes, so a request may start with an earlier one."""
    marks = capture.rename_marks
    return [
        (
            sum(seq >= mark for mark in marks),
            Prefix("", r.body["messages"], r.body.get("tools", [])),
        )
        for seq, r in enumerate(capture.proxy.records)
        if r.method == "PUT" and r.path == f"/v1/prefixes/{pin}" and r.status == 200
    ]


def _sample(
    turn: Turn,
    agents: list[Agent],
    iteration: int,
    record: Recorded,
    superseded: dict[str, list[tuple[int, Prefix]]] | None = None,
) -> Sample:
    body = dict(record.body)
    messages = body.pop("messages")
    tools = body.pop("tools", [])

    def starts(prefix: Prefix) -> bool:
        return messages[: len(prefix.messages)] == prefix.messages and tools == prefix.tools

    # The longest pinned prefix the request starts with: a re-pin after a rename keeps the
    # earlier pin's messages and adds one (house_delta.py), so both match.
    matches = [
        (len(prefix.messages), agent.key, index)
        for agent in agents
        for index, prefix in enumerate(agent.prefixes)
        if starts(prefix)
    ]
    if not matches and superseded:  # else a PUT its phase replaced (its suffix is the same)
        matches = [
            (len(prefix.messages), agent.key, phase)
            for agent in agents
            for phase, prefix in superseded.get(agent.key, [])
            if starts(prefix)
        ]
    if matches:
        n, key, index = max(matches)
        return Sample(turn.role, key, index, turn.turn, iteration, messages[n:], body)
    raise RuntimeError(
        f"a {turn.role} request (turn {turn.turn}) does not start with any pinned prefix of"
        f" {agents[0].entity_id}: the plugin sent a prompt that its pin cannot serve"
    )


async def capture_metadata(stack: Stack, model: str = CAPTURE_MODEL) -> dict[str, Any]:
    config = await stack.api("GET", "/api/config")
    house = (ROOT / "config" / "house.yaml").read_bytes()
    rooms = stack.ha.house_scale
    command = CAPTURE_COMMAND + (f" --house-scale {rooms}" if rooms else "")
    return {
        "captured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "capture_command": command + (f" --model {model}" if model != CAPTURE_MODEL else ""),
        "capture_model": model,
        "ha_version": config.get("version"),
        "house_yaml_sha256": hashlib.sha256(house).hexdigest(),
        "house_scale": rooms,
        "exposed_entities": len(await stack.exposed_entities()),
        "satellites": {
            s.role: {
                "area_id": s.area_id,
                "device": "/".join(s.device).replace("{entry_id}", "<entry>"),
                "stand_in": True,
            }
            for s in SATELLITES
        },
        "renames": [{"entity_id": e, "name": n} for e, n in RENAMES],
        "notes": (
            "The demo house has no devices of its own: two service devices stand in for"
            f" the satellites. Assistant replies in the history come from {model}."
        ),
    }


async def capture_fixture(
    workdir: Path, model: str = CAPTURE_MODEL, house_scale: int = 0
) -> Fixture:
    """Run a live stack behind the proxy, drive the household, return the fixture."""
    proxy_port = free_port()
    stack = Stack(
        workdir,
        ["--model", model],
        engine_url=f"http://127.0.0.1:{proxy_port}",
        house_scale=house_scale,
    )
    proxy = await RecordingProxy(stack.engine.url, port=proxy_port).start()
    try:
        await asyncio.to_thread(stack.engine.start)
        await asyncio.to_thread(stack.ha.start)
        capture = Capture(stack, proxy)
        try:
            await drive(capture)
        finally:
            records = [r.__dict__ for r in proxy.records]
            (workdir / "records.json").write_text(json.dumps(records, indent=1))
        meta = await capture_metadata(stack, model)
        return build_fixture(capture, meta)
    finally:
        await stack.close()
        await asyncio.to_thread(stack.stop)
        await proxy.stop()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hearth_bench.harness.capture", description=__doc__
    )
    parser.add_argument("--fixture", type=Path, default=FIXTURE)
    parser.add_argument("--workdir", type=Path, default=None, help="keep logs here")
    parser.add_argument(
        "--model",
        default=CAPTURE_MODEL,
        help=f"the engine's model ({CAPTURE_MODEL}: scripted replies; the plugin fits a house"
        " too big for a model's context to it, so a big house's prompts depend on the model)",
    )
    add_house_scale(parser, "the demo house")
    args = parser.parse_args(argv)
    if args.house_scale and args.fixture.resolve() == FIXTURE.resolve():
        parser.error(f"--house-scale needs a --fixture other than the committed {FIXTURE.name}")
    started = time.monotonic()
    print(f"capturing the household of {describe(args.house_scale, None)}", flush=True)
    with tempfile.TemporaryDirectory(prefix="hearth-capture-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        try:
            fixture = asyncio.run(capture_fixture(workdir, args.model, args.house_scale))
        except (RuntimeError, TimeoutError, aiohttp.ClientError) as err:
            print(f"capture failed: {err} (logs in {workdir})", file=sys.stderr)
            return 1
    size = write_fixture(fixture, args.fixture)
    print(f"wrote {args.fixture} ({size / 1024:.0f} KiB) in {time.monotonic() - started:.0f} s")
    print(summary(fixture))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
