"""``scripts/bench household``: a simulated household replayed against three engines.

The prompts come from ``bench/fixtures/household.json``: what the Hearth plugin really
sent for the demo house (``--capture`` records it again through a live Home Assistant).
``--house-scale N`` replays the demo house with N guest suites added instead: its fixture
is captured the same way on first use and kept in the cache (scaled_fixture.py).
A trace fixed by ``--seed`` mixes two voice satellites in different areas, a chat user
whose history grows turn by turn (the engine's own replies are re-sent, as the plugin
does), automations calling the second agent, bursts of 2-4 simultaneous requests, two
entity renames (each re-pins both agents, ``--repin-delay`` after the change, like the
plugin's debounce; as the plugin does, requests keep the pinned prefix until the renamed
one is pinned) and state changes, which send nothing. (The plugin also moves the changed
lines into the context message meanwhile; the replay leaves them out: a few tokens.)
A sampled tool round (a turn's request after a tool ran) follows its turn's earlier
requests, each sent and counted, with the server's own tool calls in its history as the
plugin sends them: a server that keeps what it computed reuses it, as it would in a
home. (Before 2026-12-03 such a round was sent alone, with the capture model's calls:
about 80 more tokens to prefill, which a home never sees.)

The same trace runs against a fresh engine process per configuration:

* ``hearth``: ``--cache-mode radix``, each agent's prefix pinned at start and on renames;
* ``no_cache``: ``--cache-mode none``, no pins;
* ``last_prompt``: ``--cache-mode last_prompt`` (one slot, like llama.cpp), no pins;
* ``hearth_container`` (only with ``--configs``): as ``hearth``, against the add-on's
  image (``scripts/image``) run with podman through its own launcher, with the API key
  it made: ``--configs hearth hearth_container`` shows what packaging costs.
* ``hearth_fresh_prefix`` (only with ``--configs``): as ``hearth``, but requests switch to
  the renamed prefix at once (the plugin before it kept the pinned prefix during re-pins:
  every request then cold-prefilled most of the house).
* ``external`` (``--engine-url URL``): any OpenAI-compatible server already running
  (llama.cpp's ``llama-server``, vLLM, SGLang...), not started or stopped here, driven as
  the plugin drives it: the same messages and tools (it renders them with its own chat
  template), no ``hearth`` body fields, and instead of pins a priming request per agent
  (``max_tokens`` 1) at start and after each rename's debounce, requests keeping the
  primed prefix until then; on llama.cpp ``cache_prompt``. Its row is named after the
  server kind ``/props``, ``/metrics`` or ``/v1/models`` reveal. Cached tokens come from
  ``usage.prompt_tokens_details.cached_tokens``, else llama.cpp's ``timings.cache_n``;
  a server that sends neither gets ``n/a``, never 0. ``--engine-url`` alone runs only
  this row; with ``--configs`` it is added to the built-in ones.
* ``external_unprimed`` (``--configs``, with ``--engine-url``): the same server as Home
  Assistant's own clients drive it: no priming, each request sends the house as it is.

On this 2-core CPU the default model's house prompt is ~5,400 tokens: a cold request
costs ~30 s, so the default 12 requests take about 20 minutes for the three configs.

TTFT is measured by the client (streaming: request sent -> first content or tool-call
chunk). Beside it: the client's first chunk of any kind (Hearth sends it with the
engine's first token), and Hearth's own split of that time (``usage.hearth``): waiting
for the prepare thread, preparing (render, tokenize, grammar), the engine's queue,
prefill, and the part of queue and prefill spent behind pin work. So a gap has a name:
``client gap`` is the first chunk minus the server's time to its first token (network
and HTTP), and ``call decode`` is the first words minus the first chunk (a constrained
tool call is sent name first, its arguments once complete). ``re-pin prefilled`` is the
share of the re-pins' tokens the engine computed (each re-pin PUT's
``prefilled_tokens``): the plugin re-pins a renamed house as the pinned bytes plus a
message that tells the change. The re-pin stall ratio is the p95 TTFT of requests
issued while a re-pin is in flight over that of the other requests; configurations
without pins use the requests the ``hearth`` run found in those windows (same trace
positions).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from .client import (
    PinRefusedError,
    Reply,
    Server,
    StatsPoller,
    get_json,
    probe_server,
    put_pin,
    server_stats,
    stream_chat,
)
from .common import percentile, print_table, write_json
from .container import ContainerEngine, build_image
from .harness.fixture import FIXTURE, Fixture, FixtureMissingError, Sample, house_of, load_fixture
from .harness.server import EngineProcess
from .house_scale import add_argument as add_house_scale
from .scaled_fixture import fixture_path

ROLES = ("satellite_a", "satellite_b", "chat", "automation")
ROLE_WEIGHTS = (0.3, 0.3, 0.25, 0.15)
# name -> (cache mode, pins, requests switch to a renamed prefix only once it is pinned)
CONFIGS = {
    "hearth": ("radix", True, True),
    "no_cache": ("none", False, False),
    "last_prompt": ("last_prompt", False, False),
    "hearth_fresh_prefix": ("radix", True, False),
    # Hearth as ``hearth``, but the engine is the add-on's image run with podman
    # (scripts/image): what packaging costs, side by side with ``hearth``.
    "hearth_container": ("radix", True, True),
    # Hearth with every token a grammar forces decoded one step each (before jump-forward).
    "hearth_no_jump_forward": ("radix", True, True),
    # --engine-url: the server as the plugin drives it: each agent's prefix primed at start
    # and after each rename (max_tokens 1), requests on the primed prefix until then; on
    # llama.cpp cache_prompt.
    "external": ("server", True, True),
    # --engine-url, as Home Assistant's own clients drive it: no priming; each request
    # sends the house as it is now.
    "external_unprimed": ("server", False, False),
}
CONFIG_ARGS = {"hearth_no_jump_forward": ("--no-jump-forward",)}  # engine flags of a config
EXTERNAL = "external"
CONTAINER = "hearth_container"
CONTAINER_KERNELS = (
    Path(os.environ.get("HEARTH_CACHE_DIR") or Path.home() / ".cache" / "hearth")
    / "image"
    / "kernels"
)
EXTERNALS = ("external", "external_unprimed")
PRIMING_TEXT = "Hello"  # the user message after the prefix in a priming request
DEFAULT_CONFIGS = ["hearth", "no_cache", "last_prompt"]
GOAL_HIT_RATE = 0.97
GOAL_VS_NO_CACHE = 0.2
GOAL_VS_LAST_PROMPT = 0.5
GOAL_STALL = 2.0
# Tokens an earlier round of a turn may take (its tool call must be whole to go on).
CALL_TOKENS = 64


# ------------------------------------------------------------------------ trace


@dataclass(frozen=True)
class Call:
    """One request of the trace: a role and a sample of it (for chat: the turn, 1-based)."""

    role: str
    sample: int


@dataclass(frozen=True)
class Step:
    kind: str  # request | burst | rename | states
    calls: tuple[Call, ...] = ()
    rename: int = 0  # 1-based rename number (the prefix version to switch to)
    state_changes: int = 0


def make_trace(
    seed: int, requests: int, pools: dict[str, int], chat_turns: int, renames: int
) -> list[Step]:
    """Steps run one after another; a burst's requests go out together."""
    rng = random.Random(seed)
    rename_at = [round(requests * (k + 1) / (renames + 1)) for k in range(renames)]
    steps: list[Step] = []
    sent = 0
    chat_turn = 0
    while sent < requests:
        if len(rename_at) > 0 and sent >= rename_at[0]:
            rename_at.pop(0)
            steps.append(Step("rename", rename=renames - len(rename_at)))
            continue
        if rng.random() < 0.5:
            steps.append(Step("states", state_changes=rng.randint(1, 8)))
        size = min(rng.randint(2, 4) if rng.random() < 0.3 else 1, requests - sent)
        roles = rng.sample(ROLES, size) if size > 1 else rng.choices(ROLES, ROLE_WEIGHTS)
        calls = []
        for role in roles:
            if role == "chat":
                chat_turn = chat_turn % chat_turns + 1
                calls.append(Call(role, chat_turn))
            else:
                calls.append(Call(role, rng.randrange(pools[role])))
        steps.append(Step("burst" if size > 1 else "request", tuple(calls)))
        sent += size
    return steps


def trace_summary(trace: Sequence[Step]) -> dict[str, Any]:
    calls = [c for s in trace for c in s.calls]
    return {
        "requests": len(calls),
        "by_role": {r: sum(c.role == r for c in calls) for r in ROLES},
        "bursts": sum(s.kind == "burst" for s in trace),
        "renames": sum(s.kind == "rename" for s in trace),
        "state_changes": sum(s.state_changes for s in trace),
    }


# ------------------------------------------------------------------------ replay


@dataclass
class Record:
    """One trace request as run against one configuration."""

    step: int
    index: int
    role: str
    agent: str
    prefix: int
    issued_s: float
    in_repin: bool
    in_debounce: bool
    ttft_ms: float
    total_ms: float
    prompt_tokens: int
    cached_tokens: int | None
    engine_ttft_ms: float | None
    prefill_ms: float | None
    queue_ms: float | None
    error: str | None
    first_chunk_ms: float = 0.0
    # Hearth's split of its time to the first token (``SPLIT``); empty for other servers.
    split: dict[str, float] = field(default_factory=dict)

    @property
    def key(self) -> tuple[int, int]:
        return (self.step, self.index)


@dataclass(frozen=True)
class Settings:
    model: str
    max_tokens: int
    repin_delay: float
    kv_cache_mb: int | None
    workdir: Path
    engine_url: str | None = None  # the ``external`` configuration's server
    one_at_a_time: bool = False  # a burst's requests go out one after another


class Household:
    """The fixture's requests, as the trace asks for them."""

    def __init__(self, fixture: Fixture) -> None:
        self.fixture = fixture
        self.pools = {
            role: [s for s in fixture.of_role(role) if s.prefix == 0]
            for role in ROLES
            if role != "chat"
        }
        self.chat_turns = chat_turns(fixture)

    def earlier_rounds(self, sample: Sample) -> list[Sample]:
        """The captured requests of ``sample``'s turn before it (iterations 0 to k - 1),
        each one's messages the start of the next one's; [] for a first request, or
        where one of them is missing (then the request is replayed as captured)."""
        rounds = []
        for iteration in range(sample.iteration):
            found = [
                s
                for s in self.fixture.of_role(sample.role)
                if (s.agent, s.prefix, s.turn, s.iteration)
                == (sample.agent, sample.prefix, sample.turn, iteration)
                and sample.suffix[: len(s.suffix)] == s.suffix
                and s.suffix[-1].get("role") != "assistant"
            ]
            if not found:
                return []
            rounds.append(found[0])
        return rounds

    def pool_sizes(self) -> dict[str, int]:
        return {role: len(pool) for role, pool in self.pools.items()}

    def versions(self) -> int:
        return min(len(a.prefixes) for a in self.fixture.agents.values())

    def sample(self, call: Call) -> Sample:
        return self.pools[call.role][call.sample]


def chat_turns(fixture: Fixture) -> list[tuple[str | None, str]]:
    """(context message or None, user text) of each turn of the longest captured chat."""
    chats = [s for s in fixture.of_role("chat") if s.prefix == 0 and s.iteration == 0]
    if not chats:
        raise FixtureMissingError("the fixture has no chat requests: capture it again")
    longest = max(chats, key=lambda s: s.turn)
    turns: list[tuple[str | None, str]] = []
    context = None
    for message in longest.suffix:
        if message["role"] == "system":
            context = message["content"]
        elif message["role"] == "user":
            turns.append((context, message["content"]))
            context = None
    return turns


class Replay:
    """The trace against one fresh engine process of one configuration."""

    def __init__(self, household: Household, name: str, settings: Settings) -> None:
        self.household = household
        self.name = name
        self.settings = settings
        self.cache_mode, self.pins, self.switch_after_pin = CONFIGS[name]
        self.version = 0  # the house as it is now (renames so far)
        self.pinned = dict.fromkeys(household.fixture.agents, 0)  # version pinned per agent
        self.locks = {key: asyncio.Lock() for key in household.fixture.agents}
        self.repins_running = 0
        self.debounce_running = 0
        self.repin_windows: list[tuple[float, float]] = []
        self.repin_tokens: list[tuple[int, int]] = []  # (prefilled, tokens) per re-pin PUT
        self.pin_ms: list[float] = []
        self.history: list[dict[str, Any]] = []
        self.records: list[Record] = []
        self.state_changes = 0
        self.t0 = 0.0
        self.server = Server("hearth", None)  # the external configuration probes its own

    @property
    def label(self) -> str:
        """The table's name: ``external (llama.cpp)`` for an external server."""
        return f"{self.name} ({self.server.kind})" if self.name in EXTERNALS else self.name

    def engine_args(self) -> list[str]:
        args = ["--model", self.settings.model, "--cache-mode", self.cache_mode]
        args += ["--max-queue", "256", *CONFIG_ARGS.get(self.name, ())]
        if self.settings.kv_cache_mb:
            args += ["--kv-cache-mb", str(self.settings.kv_cache_mb)]
        return args

    async def run(self, trace: Sequence[Step]) -> dict[str, Any]:
        if self.name in EXTERNALS:
            return await self.run_external(trace)
        log = self.settings.workdir / f"engine-{self.name}.log"
        engine: EngineProcess | ContainerEngine
        if self.name == CONTAINER:
            engine = await asyncio.to_thread(self._start_container)
        else:
            engine = EngineProcess(self.engine_args(), log)
            await asyncio.to_thread(engine.start)
        headers = engine.headers if isinstance(engine, ContainerEngine) else None
        started = time.monotonic()
        timeout = aiohttp.ClientTimeout(total=3600)
        try:
            async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
                poller = await self._prepare(session, engine.url)
                try:
                    repins = await self._run_steps(session, engine.url, trace)
                    await asyncio.gather(*repins)
                finally:
                    await poller.stop()
                stats = await get_json(session, f"{engine.url}/v1/stats")
        finally:
            if isinstance(engine, ContainerEngine):
                await asyncio.to_thread(engine.stop, log)
            else:
                await asyncio.to_thread(engine.stop)
        return {
            "wall_s": round(time.monotonic() - started, 1),
            "stats": stats,
            "peaks": poller.peaks,
            "pin_ms": self.pin_ms,
            "repin_tokens": self.repin_tokens,
            "repin_windows_s": [(round(a, 2), round(b, 2)) for a, b in self.repin_windows],
            "state_changes": self.state_changes,
        }

    def _start_container(self) -> ContainerEngine:
        """The image through its own launcher (the add-on's options as the environment),
        its kernels built for this CPU before the trace starts, as they are here."""
        env = {"HEARTH_MODEL": self.settings.model}
        if self.settings.kv_cache_mb:
            env["HEARTH_KV_CACHE_MB"] = str(self.settings.kv_cache_mb)
        data = self.settings.workdir / "container-data"
        kernels = CONTAINER_KERNELS  # kept between runs, like this machine's own
        engine = ContainerEngine(build_image(), data, env, kernels=kernels).start()
        if engine.wait_kernels() != "active":
            engine.stop(self.settings.workdir / f"engine-{self.name}.log")
            raise RuntimeError("the container's kernels did not build; see its log")
        return engine

    async def run_external(self, trace: Sequence[Step]) -> dict[str, Any]:
        """The trace against a server that is already running: no pins, no /v1/stats."""
        url = (self.settings.engine_url or "").rstrip("/")
        started = time.monotonic()
        timeout = aiohttp.ClientTimeout(total=3600)
        # A connection per request: reusing a pooled connection right after a streamed
        # answer failed at once against llama-server (ServerDisconnectedError, 2 of 6).
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            self.server = await probe_server(session, url)
            print(f"  {url}: {self.server.kind}, model {self.server.model}", flush=True)
            warm = await stream_chat(session, url, self._external_body({
                "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
            }))  # fmt: skip
            if warm.error is not None:
                raise RuntimeError(f"{url} refused a chat request: {warm.error}")
            if self.pins:
                await self._pin_all(session, url, initial=True)  # the plugin's priming
            self.t0 = time.perf_counter()
            repins = await self._run_steps(session, url, trace)
            await asyncio.gather(*repins)
            stats = await server_stats(session, url, self.server.kind)
        return {
            "label": self.label,
            "wall_s": round(time.monotonic() - started, 1),
            "stats": stats,
            "peaks": None,
            "pin_ms": self.pin_ms,
            "repin_windows_s": [(round(a, 2), round(b, 2)) for a, b in self.repin_windows],
            "state_changes": self.state_changes,
        }

    def _external_body(self, body: dict[str, Any]) -> dict[str, Any]:
        """The body for another server: its model name, no Hearth extensions; on
        llama.cpp (driven like the plugin) ``cache_prompt``."""
        if self.server.kind != "hearth":
            body = {k: v for k, v in body.items() if k != "hearth"}
        if self.server.kind == "llama.cpp" and self.name == EXTERNAL:
            body = {**body, "cache_prompt": True}
        return {**body, "model": self.server.model} if self.server.model else body

    async def _prepare(self, session: aiohttp.ClientSession, url: str) -> StatsPoller:
        """Warm torch up on an unrelated prompt, pin like the plugin, start polling."""
        await stream_chat(
            session, url, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        )
        if self.pins:
            await self._pin_all(session, url, initial=True)
        self.t0 = time.perf_counter()
        return StatsPoller(session, url).start()

    async def _pin_all(
        self, session: aiohttp.ClientSession, url: str, *, initial: bool = False
    ) -> None:
        agents = self.household.fixture.agents
        await asyncio.gather(*(self._pin(session, url, k, initial) for k in agents))

    async def _pin(self, session: aiohttp.ClientSession, url: str, key: str, initial: bool) -> None:
        """PUT the agent's prefix of the house as it is now; one PUT per agent at a time.

        Like the plugin (a lock per agent, then a fresh render): a re-pin that finds the
        prefix already pinned sends nothing.
        """
        async with self.locks[key]:
            version = self.version
            if not initial and self.pinned[key] == version:
                return
            agent = self.household.fixture.agents[key]
            started = time.perf_counter()
            if self.name == EXTERNAL:
                await self._prime(session, url, key, agent.prefixes[version])
            else:
                info = await put_pin(session, url, agent.pin, agent.prefixes[version].body())
                if not initial and "prefilled_tokens" in info:
                    self.repin_tokens.append((int(info["prefilled_tokens"]), int(info["tokens"])))
            self.pin_ms.append(round((time.perf_counter() - started) * 1000, 1))
            self.pinned[key] = version

    async def _prime(self, session: aiohttp.ClientSession, url: str, key: str, prefix: Any) -> None:
        """The plugin's priming request (priming.py): the prefix, a short user message,
        one token, so the server caches the prefix before the next real request."""
        body = {
            "messages": [*prefix.messages, {"role": "user", "content": PRIMING_TEXT}],
            "max_tokens": 1,
            "temperature": 0.0,
        }
        if prefix.tools:
            body["tools"] = list(prefix.tools)
        reply = await stream_chat(session, url, self._external_body(body))
        if reply.error is not None:
            raise RuntimeError(f"priming {key} refused: {reply.error}")

    def _serving(self, agent: str) -> int:
        """The prefix version a request of ``agent`` is sent with now.

        The plugin keeps the pinned prefix until the re-pin is ready (``hearth``);
        ``hearth_fresh_prefix`` switches at once, as the plugin once did.
        """
        return self.pinned[agent] if self.switch_after_pin else self.version

    async def _run_steps(
        self, session: aiohttp.ClientSession, url: str, trace: Sequence[Step]
    ) -> list[asyncio.Task[None]]:
        repins: list[asyncio.Task[None]] = []
        for number, step in enumerate(trace):
            if step.kind == "states":
                self.state_changes += step.state_changes
            elif step.kind == "rename":
                self.version = min(step.rename, self.household.versions() - 1)
                repins.append(asyncio.create_task(self._repin(session, url)))
            elif self.settings.one_at_a_time:
                for i, c in enumerate(step.calls):
                    await self._call(session, url, number, i, c)
            else:
                await asyncio.gather(
                    *(self._call(session, url, number, i, c) for i, c in enumerate(step.calls))
                )
        return repins

    async def _repin(self, session: aiohttp.ClientSession, url: str) -> None:
        """The plugin's re-pin: after the debounce, PUT every agent's renamed prefix."""
        self.debounce_running += 1
        await asyncio.sleep(self.settings.repin_delay)
        self.debounce_running -= 1
        if not self.pins:
            return
        self.repins_running += 1
        start = time.perf_counter() - self.t0
        try:
            await self._pin_all(session, url)
        finally:
            self.repins_running -= 1
            self.repin_windows.append((start, time.perf_counter() - self.t0))

    async def _call(
        self, session: aiohttp.ClientSession, url: str, step: int, index: int, call: Call
    ) -> None:
        agent, version, body, chat_entry = self._body(call)
        if chat_entry is None:
            body = await self._after_earlier_rounds(
                session, url, (step, index), call, version, body
            )
        reply = await self._send(session, url, step, index, call.role, agent, version, body)
        if chat_entry is not None and reply.error is None:
            self.history += [*chat_entry, {"role": "assistant", "content": reply.text}]

    async def _after_earlier_rounds(
        self,
        session: aiohttp.ClientSession,
        url: str,
        at: tuple[int, int],
        call: Call,
        version: int,
        body: dict[str, Any],
    ) -> dict[str, Any]:
        """A tool round's request (iteration k > 0) as the plugin sends it: after the
        turn's earlier requests, each sent and recorded here, with the server's own tool
        calls in its history in place of the captured ones (and the captured results), so
        the server may reuse what it computed for them. Where the server answered without
        a call, or with another number of calls, the turn would have gone otherwise: the
        request goes as captured."""
        sample = self.household.sample(call)
        rounds = self.household.earlier_rounds(sample)
        if not rounds:
            return body
        messages: list[dict[str, Any]] | None = None
        for earlier, later in zip(rounds, [*rounds[1:], sample], strict=True):
            lead = self.household.fixture.body(earlier, version=version)
            if messages is not None:
                lead = {**lead, "messages": messages}
            whole = max(self.settings.max_tokens, CALL_TOKENS)  # the call must be whole
            reply = await self._send(
                session, url, *at, call.role, sample.agent, version, lead, max_tokens=whole
            )
            captured = later.suffix[len(earlier.suffix)]
            calls = captured.get("tool_calls") or []
            if reply.error is not None or len(reply.tool_calls) != len(calls) or not calls:
                return body
            ids = {old["id"]: new["id"] for old, new in zip(calls, reply.tool_calls, strict=True)}
            results = [
                {**m, "tool_call_id": ids.get(m.get("tool_call_id"), m.get("tool_call_id"))}
                for m in later.suffix[len(earlier.suffix) + 1 :]
            ]
            own = {"role": "assistant", "content": reply.text, "tool_calls": reply.tool_calls}
            messages = [*lead["messages"], own, *results]
        return {**body, "messages": messages}

    async def _send(
        self,
        session: aiohttp.ClientSession,
        url: str,
        step: int,
        index: int,
        role: str,
        agent: str,
        version: int,
        body: dict[str, Any],
        *,
        max_tokens: int | None = None,
    ) -> Reply:
        """Send one request (``--max-tokens`` unless told) and record it."""
        issued = time.perf_counter() - self.t0
        in_repin, in_debounce = self.repins_running > 0, self.debounce_running > 0
        body = {**body, "max_tokens": max_tokens or self.settings.max_tokens}
        if self.name in EXTERNALS:
            body = self._external_body(body)
        reply = await stream_chat(session, url, body)
        engine = reply.engine
        self.records.append(
            Record(
                step, index, role, agent, version, round(issued, 3), in_repin,
                in_debounce, round(reply.ttft_ms, 2), round(reply.total_ms, 2),
                reply.prompt_tokens, reply.cached_tokens, engine.get("ttft_ms"),
                engine.get("prefill_ms"), engine.get("queue_ms"), reply.error,
                round(reply.first_chunk_ms, 2),
                {k: float(engine[k]) for k in SPLIT if engine.get(k) is not None},
            )
        )  # fmt: skip
        return reply

    def _body(self, call: Call) -> tuple[str, int, dict[str, Any], list[dict[str, Any]] | None]:
        """(agent key, prefix version, request body, the chat turn's new messages or None)."""
        fixture = self.household.fixture
        if call.role != "chat":
            sample = self.household.sample(call)
            version = self._serving(sample.agent)
            return sample.agent, version, fixture.body(sample, version=version), None
        if call.sample == 1:
            self.history = []  # a new conversation
        context, text = self.household.chat_turns[call.sample - 1]
        entry = [{"role": "system", "content": context}] if context else []
        entry.append({"role": "user", "content": text})
        version = self._serving("hearth")
        prefix = fixture.agents["hearth"].prefixes[version]
        options = fixture.of_role("chat")[0].options
        body = {
            **options,
            "messages": [*prefix.messages, *self.history, *entry],
            "tools": prefix.tools,
        }
        return "hearth", version, body, entry


# ------------------------------------------------------------------------ report


def summarize(
    name: str, run: dict[str, Any], records: list[Record], window: set[tuple[int, int]]
) -> dict[str, Any]:
    ok = [r for r in records if r.error is None]
    reported = [r for r in ok if r.cached_tokens is not None]
    prompt = sum(r.prompt_tokens for r in reported)
    cached = sum(r.cached_tokens or 0 for r in reported)
    unknown = bool(ok) and not reported  # the server reports no cached tokens at all
    peaks = run["peaks"] or {}  # None: an external server reports no KV counters
    ttft = [r.ttft_ms for r in ok]
    engine_ttft = [r.engine_ttft_ms for r in ok if r.engine_ttft_ms is not None]
    in_window = [r.ttft_ms for r in ok if r.key in window]
    idle = [r.ttft_ms for r in ok if r.key not in window]
    debounce = [r.ttft_ms for r in ok if r.in_debounce and r.key not in window]
    stats = run["stats"]
    stall = (
        round(percentile(in_window, 0.95) / percentile(idle, 0.95), 3)
        if in_window and idle
        else None
    )
    repinned = run.get("repin_tokens") or []
    repin_total = sum(tokens for _, tokens in repinned)
    return {
        "config": run.get("label", name),
        "cache_mode": CONFIGS[name][0],
        "pins": CONFIGS[name][1],
        "switch_after_pin": CONFIGS[name][2],
        "requests": len(records),
        "errors": len(records) - len(ok),
        "hit_rate": None if unknown else round(cached / prompt, 4) if prompt else 0.0,
        "prompt_tokens": prompt,
        "reused_tokens": None if unknown else cached,
        "ttft_p50_ms": round(percentile(ttft, 0.5), 1),
        "ttft_p95_ms": round(percentile(ttft, 0.95), 1),
        "ttft_max_ms": round(max(ttft, default=0.0), 1),
        # None: the server reports no engine-side TTFT (only Hearth does).
        "engine_ttft_p50_ms": round(percentile(engine_ttft, 0.5), 1) if engine_ttft else None,
        "engine_ttft_p95_ms": round(percentile(engine_ttft, 0.95), 1) if engine_ttft else None,
        "total_p50_ms": round(percentile([r.total_ms for r in ok], 0.5), 1),
        # Reply: the time to the last token (``--max-tokens 32`` for a voice-like reply).
        "reply_p50_ms": round(percentile([r.total_ms for r in ok], 0.5), 1),
        "reply_p95_ms": round(percentile([r.total_ms for r in ok], 0.95), 1),
        "prefill_tok_s": stats.get("prefill_tokens_per_s"),
        "prefill_tokens": stats.get("prefill_tokens_total"),
        "kv_peak_bytes": peaks.get("kv_total_bytes"),
        "kv_cache_peak_bytes": peaks.get("kv_cache_used_bytes"),
        "kv_working_peak_bytes": peaks.get("kv_working_bytes"),
        "evictions": stats.get("kv_cache_evictions_total"),
        **ttft_split(ok),
        "repin_stall_ratio": stall,
        "repin_window_requests": len(in_window),
        "repin_window_ttft_p95_ms": round(percentile(in_window, 0.95), 1),
        "idle_ttft_p95_ms": round(percentile(idle, 0.95), 1),
        "debounce_requests": len(debounce),
        "debounce_ttft_p95_ms": round(percentile(debounce, 0.95), 1),
        "pin_ms": run["pin_ms"],
        # The share of the re-pins' tokens the engine computed (None: no re-pin reported).
        "repin_prefilled_share": (
            round(sum(p for p, _ in repinned) / repin_total, 4) if repin_total else None
        ),
        "repin_windows_s": run["repin_windows_s"],
        "state_changes": run["state_changes"],
        "wall_s": run["wall_s"],
    }


# Hearth's parts of the time to a request's first token (``usage.hearth``), in order.
SPLIT = ("prepare_wait_ms", "prepare_ms", "queue_ms", "prefill_ms", "pin_wait_ms")


def ttft_split(ok: list[Record]) -> dict[str, Any]:
    """p50/p95 of the server's parts, the client's first chunk, and the unnamed gap."""
    split = [r for r in ok if "prefill_ms" in r.split]
    out: dict[str, Any] = {
        "first_chunk_p50_ms": round(percentile([r.first_chunk_ms for r in ok], 0.5), 1),
        "first_chunk_p95_ms": round(percentile([r.first_chunk_ms for r in ok], 0.95), 1),
        "call_decode_p95_ms": round(
            percentile([r.ttft_ms - r.first_chunk_ms for r in ok], 0.95), 1
        ),
    }
    if not split:
        return {**out, "split": None, "client_gap_p95_ms": None}
    server = [sum(r.split.get(k, 0.0) for k in SPLIT[:4]) for r in split]
    gaps = [r.first_chunk_ms - t for r, t in zip(split, server, strict=True)]
    out["split"] = {
        part: {
            "p50": round(percentile([r.split.get(part, 0.0) for r in split], 0.5), 1),
            "p95": round(percentile([r.split.get(part, 0.0) for r in split], 0.95), 1),
        }
        for part in SPLIT
    }
    out["server_ttft_p95_ms"] = round(percentile(server, 0.95), 1)
    out["client_gap_p95_ms"] = round(percentile(gaps, 0.95), 1)
    return out


def fallback_window(trace: Sequence[Step]) -> set[tuple[int, int]]:
    """Without a hearth run: the requests of the two request steps after each rename."""
    window: set[tuple[int, int]] = set()
    for number, step in enumerate(trace):
        if step.kind != "rename":
            continue
        following = [
            (n, s) for n, s in enumerate(trace) if n > number and s.kind in ("request", "burst")
        ]
        for n, s in following[:2]:
            window |= {(n, i) for i in range(len(s.calls))}
    return window


def goal_lines(configs: dict[str, dict[str, Any]]) -> list[tuple[bool, str]]:
    hearth = configs.get("hearth")
    if hearth is None:
        return []
    lines = [
        (
            hearth["hit_rate"] >= GOAL_HIT_RATE,
            f"hearth hit rate {hearth['hit_rate']:.2%} >= {GOAL_HIT_RATE:.0%}",
        )
    ]
    for other, factor in (("no_cache", GOAL_VS_NO_CACHE), ("last_prompt", GOAL_VS_LAST_PROMPT)):
        if other in configs:
            bound = factor * configs[other]["ttft_p95_ms"]
            lines.append(
                (
                    hearth["ttft_p95_ms"] <= bound,
                    f"hearth p95 TTFT {hearth['ttft_p95_ms']:.0f} ms <= {factor} x {other}"
                    f" p95 ({configs[other]['ttft_p95_ms']:.0f} ms) = {bound:.0f} ms",
                )
            )
    stall = hearth["repin_stall_ratio"]
    lines.append(
        (
            stall is not None and stall <= GOAL_STALL,
            f"hearth re-pin stall ratio {stall if stall is not None else 'n/a'} <= {GOAL_STALL}"
            f" ({hearth['repin_window_requests']} requests during re-pins)",
        )
    )
    return lines


TABLE = [
    ("config", "config"), ("hit rate", "hit_rate"), ("reused tok", "reused_tokens"),
    ("TTFT p50 ms", "ttft_p50_ms"), ("TTFT p95 ms", "ttft_p95_ms"),
    ("reply p50 ms", "reply_p50_ms"), ("reply p95 ms", "reply_p95_ms"),
    ("engine p95 ms", "engine_ttft_p95_ms"), ("1st chunk p95", "first_chunk_p95_ms"),
    ("gap p95 ms", "client_gap_p95_ms"), ("prefill tok/s", "prefill_tok_s"),
    ("KV peak MiB", "kv_peak_mib"), ("evictions", "evictions"),
    ("stall ratio", "repin_stall_ratio"), ("re-pin prefilled", "repin_prefilled_share"),
    ("errors", "errors"), ("wall s", "wall_s"),
]  # fmt: skip


def print_report(configs: dict[str, dict[str, Any]]) -> None:
    rows = []
    for result in configs.values():
        peak = result["kv_peak_bytes"]
        view = {**result, "kv_peak_mib": None if peak is None else peak / 2**20}
        rows.append(["n/a" if view[key] is None else view[key] for _, key in TABLE])
    print_table([h for h, _ in TABLE], rows)
    for result in configs.values():
        if result.get("split"):
            parts = ", ".join(
                f"{k.removesuffix('_ms')} {v['p50']:.0f}/{v['p95']:.0f}"
                for k, v in result["split"].items()
            )
            print(
                f"{result['config']}: first token p50/p95 ms: {parts};"
                f" call decode p95 {result['call_decode_p95_ms']:.0f}"
            )


def plot(path: Path, runs: dict[str, list[Record]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, records in runs.items():
        values = sorted(r.ttft_ms for r in records if r.error is None)
        if values:
            ys = [(i + 1) / len(values) for i in range(len(values))]
            ax.step(values, ys, where="post", label=f"{name} (n={len(values)})")
    ax.set_xscale("log")
    ax.set_xlabel("client TTFT (ms, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


# ------------------------------------------------------------------------ main


async def run_all(
    household: Household, trace: list[Step], names: list[str], settings: Settings
) -> tuple[dict[str, dict[str, Any]], dict[str, list[Record]]]:
    results: dict[str, dict[str, Any]] = {}
    runs: dict[str, list[Record]] = {}
    window = fallback_window(trace)
    for name in sorted(names, key=list(CONFIGS).index):  # hearth first: it finds the windows
        target = settings.engine_url if name in EXTERNALS else settings.model
        print(f"# {name}: {target}, {len(trace)} steps", flush=True)
        replay = Replay(household, name, settings)
        run = await replay.run(trace)
        own = {r.key for r in replay.records if r.in_repin}
        if name == "hearth":
            window = own
        runs[name] = replay.records
        results[name] = summarize(name, run, replay.records, own if replay.pins else window)
        hit = results[name]["hit_rate"]
        print(
            f"  {results[name]['requests']} requests in {run['wall_s']} s, hit rate"
            f" {'n/a' if hit is None else f'{hit:.2%}'},"
            f" p95 TTFT {results[name]['ttft_p95_ms']:.0f} ms",
            flush=True,
        )
    return results, runs


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/bench household", description=__doc__)
    parser.add_argument("--capture", action="store_true", help="re-capture the fixture and exit")
    parser.add_argument(
        "--fixture",
        type=Path,
        default=None,
        help=f"default: bench/fixtures/{FIXTURE.name}; with --house-scale, the cached capture"
        " of that house (captured first when missing)",
    )
    add_house_scale(parser, "the demo house (its household is captured once, then cached)")
    parser.add_argument("--model", default="default", help="default, tiny-tools, a folder")
    parser.add_argument("--requests", type=int, default=20, help="requests per configuration")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument(
        "--max-tokens", type=int, default=8, help="per reply (32: a spoken sentence, for reply ms)"
    )
    parser.add_argument("--repin-delay", type=float, default=2.0, help="the plugin's debounce")
    parser.add_argument("--kv-cache-mb", type=int, default=None)
    parser.add_argument(
        "--one-at-a-time",
        action="store_true",
        help="send a burst's requests one after another (the same trace, no overlap"
        " between requests; re-pins still run beside them): client against engine TTFT",
    )
    parser.add_argument(
        "--configs",
        nargs="+",
        choices=list(CONFIGS),
        default=None,
        metavar="CONFIG",
        help=f"of {', '.join(CONFIGS)} (default: {' '.join(DEFAULT_CONFIGS)};"
        f" {' and '.join(EXTERNALS)} need --engine-url)",
    )
    parser.add_argument(
        "--engine-url",
        default=None,
        metavar="URL",
        help=f"an OpenAI-compatible server already running (e.g. http://127.0.0.1:8080):"
        f" the {EXTERNAL} row; alone, the only one",
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--records", type=Path, default=None, help="every request, as JSON")
    parser.add_argument("--workdir", type=Path, default=None, help="keep engine logs here")
    parser.add_argument("--check", action="store_true", help="exit 1 if a goal is missed")
    args = parser.parse_args(argv)
    args.configs = chosen_configs(args.configs, args.engine_url)
    if set(EXTERNALS) & set(args.configs) and args.engine_url is None:
        parser.error(f"--configs {' / '.join(EXTERNALS)} needs --engine-url URL")
    if args.fixture is None:
        args.fixture = FIXTURE
        if args.house_scale:
            args.fixture = fixture_path(args.house_scale, args.model)
    elif args.house_scale and args.fixture.resolve() == FIXTURE.resolve():
        parser.error(f"--house-scale needs a --fixture other than the committed {FIXTURE.name}")
    return args


def check_scale(fixture: Fixture, path: Path, rooms: int, model: str) -> None:
    """FixtureMissingError when the fixture is of another house than ``--house-scale``,
    or a scaled house captured with another model than the replay's."""
    captured = int(fixture.meta.get("house_scale") or 0)
    again = f"leave out --fixture, or capture it with --capture --house-scale {rooms}"
    if captured != rooms:
        raise FixtureMissingError(
            f"{path} was captured from the demo house + {captured} guest suites,"
            f" not {rooms}: {again} --fixture {path}"
        )
    if rooms and fixture.meta.get("capture_model") != model:
        raise FixtureMissingError(
            f"{path} was captured with {fixture.meta.get('capture_model')}, not {model}:"
            f" a big house is fitted to its model's context; {again} --model {model}"
        )


def chosen_configs(configs: list[str] | None, engine_url: str | None) -> list[str]:
    """``--engine-url`` alone: only the external server; with ``--configs``: added to them."""
    if configs is None:
        return [EXTERNAL] if engine_url else list(DEFAULT_CONFIGS)
    if engine_url and not set(EXTERNALS) & set(configs):
        return [*configs, EXTERNAL]
    return configs


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.capture or (args.house_scale and not args.fixture.exists()):
        from .harness.capture import main as capture_main

        extra = []
        if args.house_scale:  # a big house is fitted to the model: the replay's captures it
            extra = ["--house-scale", str(args.house_scale), "--model", args.model]
        if args.workdir is not None:
            extra += ["--workdir", str(args.workdir / "capture")]
        status = capture_main(["--fixture", str(args.fixture), *extra])
        if args.capture or status:
            return status
    try:
        household = Household(load_fixture(args.fixture))
        check_scale(household.fixture, args.fixture, args.house_scale, args.model)
    except FixtureMissingError as err:
        print(err)
        return 2
    print(f"house: {house_of(household.fixture)} (fixture {args.fixture})", flush=True)
    trace = make_trace(
        args.seed, args.requests, household.pool_sizes(), len(household.chat_turns),
        household.versions() - 1,
    )  # fmt: skip
    summary = trace_summary(trace)
    mode = ", one request at a time" if args.one_at_a_time else ""
    print(f"trace (seed {args.seed}{mode}): {summary}", flush=True)
    with tempfile.TemporaryDirectory(prefix="hearth-household-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        settings = Settings(
            args.model, args.max_tokens, args.repin_delay, args.kv_cache_mb, workdir,
            args.engine_url, args.one_at_a_time,
        )  # fmt: skip
        started = time.monotonic()
        try:
            configs, runs = asyncio.run(run_all(household, trace, args.configs, settings))
        except PinRefusedError as err:
            print(f"scripts/bench household: {err} ({house_of(household.fixture)})")
            return 2
    print()
    print_report(configs)
    print()
    goals = goal_lines(configs)
    for ok, text in goals:
        print(f"{'PASS' if ok else 'MISS'}  {text}")
    errors = sum(c["errors"] for c in configs.values())
    output = {
        "configs": configs,
        "goals": [{"pass": ok, "check": text} for ok, text in goals],
        "trace": {"seed": args.seed, **summary},
        "model": args.model,
        "engine_url": args.engine_url,
        "max_tokens": args.max_tokens,
        "one_at_a_time": args.one_at_a_time,
        "repin_delay_s": args.repin_delay,
        "fixture": household.fixture.meta,
        "house_scale": args.house_scale,
        "wall_s": round(time.monotonic() - started, 1),
    }
    write_json(args.json, output)
    write_json(args.records, {n: [asdict(r) for r in rs] for n, rs in runs.items()})
    if args.plot is not None:
        plot(args.plot, runs, f"Household TTFT ({args.model}, {summary['requests']} requests)")
    if errors:
        print(f"{errors} requests failed")
        return 1
    return 1 if args.check and not all(ok for ok, _ in goals) else 0
