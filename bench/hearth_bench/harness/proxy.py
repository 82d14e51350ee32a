"""A recording HTTP proxy: forwards everything to an engine, keeps the bodies it saw.

Put between Home Assistant and the engine (``HEARTH_ENGINE_URL`` = the proxy), it records
what the Hearth plugin really sends: the pins (``PUT /v1/prefixes/{name}``) and the chat
requests (``POST /v1/chat/completions``). Responses, streams included, pass through
chunk by chunk, so the plugin behaves exactly as it does against the engine itself.
With ``keep_responses``, the bytes of each recorded chat reply are kept too, by
``seq`` (the accuracy benchmark reads the tool calls the engine produced from them).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from .server import free_port

# Hop-by-hop and length headers that aiohttp sets itself on each side.
_SKIPPED_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding"}
)


@dataclass(frozen=True)
class Recorded:
    """One request the proxy forwarded (JSON body parsed)."""

    seq: int
    time: float  # time.time() when it arrived
    method: str
    path: str
    body: dict[str, Any]
    status: int


@dataclass
class RecordingProxy:
    """``start()``, point a client at ``url``, read ``records``; ``stop()``."""

    upstream: str
    port: int = field(default_factory=free_port)
    records: list[Recorded] = field(default_factory=list)
    keep_responses: bool = False
    responses: dict[int, bytes] = field(default_factory=dict)
    _runner: web.AppRunner | None = None
    _session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> RecordingProxy:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False
        )
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def of(self, method: str, path_prefix: str) -> list[Recorded]:
        """Records of ``method`` whose path starts with ``path_prefix``, in arrival order."""
        return [r for r in self.records if r.method == method and r.path.startswith(path_prefix)]

    def _wanted(self, method: str, path: str) -> bool:
        return (method == "PUT" and path.startswith("/v1/prefixes/")) or (
            method == "POST" and path == "/v1/chat/completions"
        )

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        raw = await request.read()
        arrived = time.time()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _SKIPPED_HEADERS}
        async with self._session.request(
            request.method,
            f"{self.upstream}{request.path_qs}",
            data=raw or None,
            headers=headers,
        ) as upstream:
            seq = None
            if self._wanted(request.method, request.path):
                seq = self._record(request, raw, arrived, upstream.status)
            keep = self.keep_responses and seq is not None and request.method == "POST"
            kept = bytearray()
            response = web.StreamResponse(status=upstream.status)
            for key, value in upstream.headers.items():
                if key.lower() not in _SKIPPED_HEADERS:
                    response.headers[key] = value
            try:
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    if keep:
                        kept += chunk
                    await response.write(chunk)
                await response.write_eof()
            except ConnectionError:
                pass  # the client went away (e.g. Home Assistant reloading the entry)
            if keep and seq is not None:
                self.responses[seq] = bytes(kept)
            return response

    def _record(self, request: web.Request, raw: bytes, arrived: float, status: int) -> int:
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {"unparsed": raw.decode(errors="replace")}
        self.records.append(
            Recorded(len(self.records), arrived, request.method, request.path, body, status)
        )
        return len(self.records) - 1
