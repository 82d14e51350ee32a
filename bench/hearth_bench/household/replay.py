"""The household's trace against one configuration: its engine started, pinned or primed,
and each request timed (``Record``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from ..client import (
    Reply,
    Server,
    StatsPoller,
    get_json,
    probe_server,
    put_pin,
    server_stats,
    stream_chat,
)
from ..container import ContainerEngine, build_image
from ..harness.fixture import Fixture, FixtureMissingError, Sample
from ..harness.server import EngineProcess
from .trace import ROLES, Call, Step

# name -> (cache mode, pins, requests switch to a renamed prefix only once it is pinned)
CONFIGS = {
    "hearth": ("radix", True, True),
    "no_cache": ("none", False, False),
    "last_prompt": ("last_prompt", False, False),
    "hearth_fresh_prefix": ("radix", True, False),
    # Hearth as ``hearth``, but the engine is the add-on's image run with podman
    # (scripts/image): what packaging costs, side by side with ``hearth``.
    "hearth_container": ("radix", True, True),
    # Hearth as ``hearth``, its pins also written to a prefix store (``--prefix-store``,
    # as the add-on runs): what persistence costs, and packaging alone against the add-on.
    "hearth_store": ("radix", True, True),
    # Hearth with every token a grammar forces decoded one step each (before jump-forward).
    "hearth_no_jump_forward": ("radix", True, True),
    # Hearth with a packed model's prefill rows dequantized into one GEMM, as before the
    # integer prefill (``HEARTH_QUANT_PREFILL=dense``): what the integer path gains.
    "hearth_dense_prefill": ("radix", True, True),
    # Hearth as ``hearth``, its engine from another checkout (``--baseline``): a change
    # against the commit before it, side by side in one run.
    "hearth_baseline": ("radix", True, True),
    # --engine-url: the server as the plugin drives it: each agent's prefix primed at start
    # and after each rename (max_tokens 1), requests on the primed prefix until then; on
    # llama.cpp cache_prompt.
    "external": ("server", True, True),
    # --engine-url, as Home Assistant's own clients drive it: no priming; each request
    # sends the house as it is now.
    "external_unprimed": ("server", False, False),
}
CONFIG_ARGS = {"hearth_no_jump_forward": ("--no-jump-forward",)}  # engine flags of a config
CONFIG_ENV = {"hearth_dense_prefill": {"HEARTH_QUANT_PREFILL": "dense"}}  # and its environment
EXTERNAL = "external"
BASELINE = "hearth_baseline"
CONTAINER = "hearth_container"
STORE = "hearth_store"
CONTAINER_KERNELS = (
    Path(os.environ.get("HEARTH_CACHE_DIR") or Path.home() / ".cache" / "hearth")
    / "image"
    / "kernels"
)
EXTERNALS = ("external", "external_unprimed")
PRIMING_TEXT = "Hello"  # the user message after the prefix in a priming request
DEFAULT_CONFIGS = ["hearth", "no_cache", "last_prompt"]
# Hearth's parts of the time to a request's first token (``usage.hearth``), in order.
SPLIT = ("prepare_wait_ms", "prepare_ms", "queue_ms", "prefill_ms", "pin_wait_ms")
# Tokens an earlier round of a turn may take (its tool call must be whole to go on).
CALL_TOKENS = 64


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
    baseline: Path | None = None  # the ``hearth_baseline`` configuration's engine package


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
        if self.name == STORE:
            store = self.settings.workdir / "prefix-store"
            shutil.rmtree(store, ignore_errors=True)  # each run pins afresh
            args += ["--prefix-store", str(store)]
        return args

    def engine_env(self) -> dict[str, str]:
        """The engine's environment on top of this process's: the configuration's own, and
        for ``hearth_baseline`` the other checkout's engine package first on the path (its
        native kernels build into the cache under their own key on first use)."""
        env = dict(CONFIG_ENV.get(self.name, {}))
        if self.name == BASELINE and self.settings.baseline is not None:
            env["PYTHONPATH"] = str(self.settings.baseline)
        return env

    async def run(self, trace: Sequence[Step]) -> dict[str, Any]:
        if self.name in EXTERNALS:
            return await self.run_external(trace)
        log = self.settings.workdir / f"engine-{self.name}.log"
        engine: EngineProcess | ContainerEngine
        if self.name == CONTAINER:
            engine = await asyncio.to_thread(self._start_container)
        else:
            engine = EngineProcess(self.engine_args(), log, env=self.engine_env())
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
        shutil.rmtree(data, ignore_errors=True)  # each run pins afresh, as ``hearth`` does
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
