"""The benchmarks' HTTP client: a streaming chat request, pins, stats and what a server is.

``household``, ``load``, ``quant`` and ``reply`` drive a server through it: Hearth's API
(``/v1/prefixes``, ``/v1/stats``) and any OpenAI-compatible one (``probe_server`` names
its kind).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from .common import Periodic
from .llama_server import parse_metrics


@dataclass
class Reply:
    ttft_ms: float = 0.0
    first_chunk_ms: float = 0.0  # any chunk, the role chunk included
    total_ms: float = 0.0
    text: str = ""
    # The tool calls streamed, as the assistant message that carries them lists them.
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, Any] = field(default_factory=dict)  # llama.cpp's last-chunk timings
    error: str | None = None

    @property
    def prompt_tokens(self) -> int:
        return int(self.usage.get("prompt_tokens", 0))

    @property
    def cached_tokens(self) -> int | None:
        """OpenAI's ``prompt_tokens_details.cached_tokens``, else llama.cpp's
        ``timings.cache_n``; None when the server reports neither."""
        details = self.usage.get("prompt_tokens_details") or {}
        if details.get("cached_tokens") is not None:
            return int(details["cached_tokens"])
        if self.timings.get("cache_n") is not None:
            return int(self.timings["cache_n"])
        return None

    @property
    def engine(self) -> dict[str, Any]:
        return dict(self.usage.get("hearth") or {})


async def stream_chat(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Reply:
    """POST a streaming chat request; TTFT = first content or tool-call chunk."""
    reply = Reply()
    started = time.perf_counter()
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    try:
        async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
            if resp.status != 200:
                reply.error = f"{resp.status}: {(await resp.text())[:200]}"
                return reply
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if not reply.first_chunk_ms:
                    reply.first_chunk_ms = (time.perf_counter() - started) * 1000
                reply.usage = chunk.get("usage") or reply.usage
                reply.timings = chunk.get("timings") or reply.timings
                for choice in chunk.get("choices") or ():
                    delta = choice.get("delta") or {}
                    if (delta.get("content") or delta.get("tool_calls")) and not reply.ttft_ms:
                        reply.ttft_ms = (time.perf_counter() - started) * 1000
                    reply.text += delta.get("content") or ""
                    add_tool_call_deltas(reply.tool_calls, delta.get("tool_calls") or ())
    except (aiohttp.ClientError, TimeoutError, ValueError) as err:
        reply.error = f"{type(err).__name__}: {err}"
    reply.total_ms = (time.perf_counter() - started) * 1000
    reply.ttft_ms = reply.ttft_ms or reply.total_ms  # nothing streamed: the end is the first
    reply.first_chunk_ms = reply.first_chunk_ms or reply.ttft_ms
    return reply


def add_tool_call_deltas(calls: list[dict[str, Any]], deltas: Sequence[dict[str, Any]]) -> None:
    """Fold streamed ``tool_calls`` deltas into ``calls`` (OpenAI's streaming form: by
    ``index``, the id and name once, the arguments in pieces)."""
    for delta in deltas:
        index = int(delta.get("index", len(calls)))
        while len(calls) <= index:
            calls.append({"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
        call, function = calls[index], delta.get("function") or {}
        call["id"] = delta.get("id") or call["id"]
        call["function"]["name"] += function.get("name") or ""
        call["function"]["arguments"] += function.get("arguments") or ""


class PinRefusedError(RuntimeError):
    """The engine refused an agent's prefix (a house too long for the model, say)."""


async def put_pin(
    session: aiohttp.ClientSession, url: str, name: str, body: dict[str, Any]
) -> dict[str, Any]:
    async with session.put(f"{url}/v1/prefixes/{name}", json=body) as resp:
        data = await resp.json()
        if resp.status != 200:
            message = (data.get("error") or {}).get("message") if isinstance(data, dict) else None
            raise PinRefusedError(f"pin {name} refused: {resp.status} {message or data}")
        return dict(data)


async def get_json(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(url) as resp:
        resp.raise_for_status()
        return dict(await resp.json())


class StatsPoller(Periodic):
    """Polls ``/v1/stats``; keeps the peaks of the KV counters."""

    KEYS = ("kv_cache_used_bytes", "kv_working_bytes", "kv_cache_locked_bytes")

    def __init__(self, session: aiohttp.ClientSession, url: str, interval: float = 0.5) -> None:
        self.session = session
        self.url = url
        self.interval = interval
        self.peaks: dict[str, int] = dict.fromkeys((*self.KEYS, "kv_total_bytes"), 0)

    async def stop(self) -> None:
        await super().stop()
        await self.sample()

    async def sample(self) -> dict[str, Any]:
        stats = await get_json(self.session, f"{self.url}/v1/stats")
        for key in self.KEYS:
            self.peaks[key] = max(self.peaks[key], int(stats.get(key, 0)))
        total = int(stats.get("kv_cache_used_bytes", 0)) + int(stats.get("kv_working_bytes", 0))
        self.peaks["kv_total_bytes"] = max(self.peaks["kv_total_bytes"], total)
        return stats

    async def tick(self) -> None:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            await self.sample()


async def get_text(session: aiohttp.ClientSession, url: str) -> str | None:
    """The body of a GET that answered 200, else None (a probe: any failure is "no")."""
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=10)) as resp:
            if resp.status == 200:
                return await resp.text()
    return None


@dataclass(frozen=True)
class Server:
    """What ``probe_server`` found out about an external server."""

    kind: str  # hearth, llama.cpp, vllm, sglang or openai (unknown)
    model: str | None  # the first id of /v1/models (vLLM and SGLang require it)
    slots: int = 0  # llama.cpp's total_slots (/props)


async def probe_server(session: aiohttp.ClientSession, url: str) -> Server:
    """The server kind, from its metric names, /props or /v1/models' ``owned_by``."""
    models = await get_text(session, f"{url}/v1/models")
    data = (json.loads(models).get("data") or [{}]) if models else [{}]
    model, owner = data[0].get("id"), str(data[0].get("owned_by", "")).lower()
    metrics = await get_text(session, f"{url}/metrics") or ""
    props_text = await get_text(session, f"{url}/props")
    props = json.loads(props_text) if props_text and props_text.startswith("{") else {}
    slots = int(props.get("total_slots") or 0)
    for prefix, kind in (("llamacpp:", "llama.cpp"), ("vllm:", "vllm"), ("sglang:", "sglang")):
        if prefix in metrics:
            return Server(kind, model, slots if kind == "llama.cpp" else 0)
    if owner in ("hearth", "vllm", "sglang"):
        return Server(owner, model)
    if owner == "llamacpp" or props:
        return Server("llama.cpp", model, slots)
    return Server("openai", model)


async def server_stats(session: aiohttp.ClientSession, url: str, kind: str) -> dict[str, Any]:
    """The engine counters the table shows, from whatever the server reports.

    Hearth: ``/v1/stats``. llama.cpp: ``/metrics`` (average prompt throughput and prompt
    tokens processed). Others: nothing (the columns read n/a).
    """
    if kind == "hearth":
        return await get_json(session, f"{url}/v1/stats")
    if kind == "llama.cpp":
        metrics = parse_metrics(await get_text(session, f"{url}/metrics") or "")
        if "llamacpp:prompt_tokens_seconds" in metrics:
            return {
                "prefill_tokens_per_s": round(metrics["llamacpp:prompt_tokens_seconds"], 1),
                "prefill_tokens_total": int(metrics.get("llamacpp:prompt_tokens_total", 0)),
            }
    return {}
