"""The small HTTP client of Hearth's pin API and the probe routes (see docs/api.md).

Pins (``PUT``/``DELETE``/``GET /v1/prefixes``), ``/v1/stats``, ``/health``,
``/v1/models``, the cache and optional routes such as ``/metrics``; chat goes through the
``openai`` SDK instead (``backend/chat.py``). This module knows nothing about Home Assistant: it
speaks the engine's HTTP + JSON contract over an aiohttp session and raises its own
errors. Every request goes through ``_open``, the one place where transport and HTTP
errors become ``HearthError`` subclasses.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp

from ..const import PIN_TIMEOUT, REQUEST_TIMEOUT


class HearthError(Exception):
    """Base error of the Hearth client."""


class HearthConnectionError(HearthError):
    """The engine cannot be reached, timed out or sent something unreadable."""


class HearthResponseError(HearthError):
    """The engine answered with an error status (OpenAI-style error body)."""

    def __init__(self, status: int, code: str | None, message: str) -> None:
        """Keep the status and the engine's error code."""
        super().__init__(f"HTTP {status} ({code or 'error'}): {message}")
        self.status = status
        self.code = code
        self.message = message


class HearthAuthError(HearthResponseError):
    """The engine needs an API key, or the key is wrong (401)."""


class HearthNotFoundError(HearthResponseError):
    """Unknown route or pin (404)."""


def _error_for(status: int, code: str | None, message: str) -> HearthResponseError:
    if status == 401:
        return HearthAuthError(status, code, message)
    if status == 404:
        return HearthNotFoundError(status, code, message)
    return HearthResponseError(status, code, message)


@dataclass(frozen=True, slots=True)
class RequestUsage:
    """Per-request figures a server reported at the end of a stream.

    Hearth sends ``usage`` with its ``hearth`` extension; llama.cpp adds ``timings``
    (``cache_n``: prompt tokens reused); vLLM and SGLang may send
    ``usage.prompt_tokens_details.cached_tokens``. ``cached_tokens`` is None when the
    server reported no reuse figure at all: unknown, never a guessed 0.
    """

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None
    ttft_ms: float | None
    prefill_ms: float | None
    decode_tokens_per_s: float | None
    pin: str | None

    @classmethod
    def from_usage(
        cls,
        usage: Mapping[str, Any],
        timings: Mapping[str, Any] | None = None,
        client_ttft_ms: float | None = None,
    ) -> RequestUsage:
        """Parse ``usage`` (with Hearth's extension) and llama.cpp's ``timings``.

        ``client_ttft_ms`` (measured by the client) stands in where the server does not
        report its own time to the first token.
        """
        details = usage.get("prompt_tokens_details") or {}
        hearth = usage.get("hearth") or {}
        timings = timings or {}
        cached = details.get("cached_tokens")
        if cached is None:
            cached = timings.get("cache_n")
        ttft = _float_or_none(hearth.get("ttft_ms"))
        return cls(
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            cached_tokens=None if cached is None else int(cached),
            ttft_ms=ttft if ttft is not None else client_ttft_ms,
            prefill_ms=_float_or_none(hearth.get("prefill_ms", timings.get("prompt_ms"))),
            decode_tokens_per_s=_float_or_none(
                hearth.get("decode_tokens_per_s", timings.get("predicted_per_second"))
            ),
            pin=hearth.get("pin"),
        )

    def as_dict(self) -> dict[str, Any]:
        """Return the figures as a dict (for traces and diagnostics)."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "ttft_ms": self.ttft_ms,
            "prefill_ms": self.prefill_ms,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "pin": self.pin,
        }


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


class HearthClient:
    """A Hearth engine at ``url``, reached through Home Assistant's aiohttp session."""

    def __init__(self, session: aiohttp.ClientSession, url: str, api_key: str | None) -> None:
        """Store the session, the base URL and the optional API key."""
        self._session = session
        self._base = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    @property
    def url(self) -> str:
        """Base URL of the engine."""
        return self._base

    # ------------------------------------------------------------------ routes

    async def async_health(self) -> None:
        """``GET /health``: raises unless the engine answers (needs no key)."""
        await self._json("GET", "/health")

    async def async_models(self) -> list[dict[str, Any]]:
        """``GET /v1/models``: the served model(s); checks the API key."""
        data = await self._json("GET", "/v1/models")
        models = data.get("data") if isinstance(data, dict) else None
        if not isinstance(models, list):
            raise HearthConnectionError("unexpected answer from /v1/models")
        return models

    async def async_stats(self) -> dict[str, Any]:
        """``GET /v1/stats``: all engine counters."""
        data = await self._json("GET", "/v1/stats")
        if not isinstance(data, dict) or "instance_id" not in data:
            raise HearthConnectionError("unexpected answer from /v1/stats")
        return data

    async def async_list_prefixes(self) -> list[dict[str, Any]]:
        """``GET /v1/prefixes``: every pin (ready, warming or failed)."""
        data = await self._json("GET", "/v1/prefixes")
        pins = data.get("data") if isinstance(data, dict) else None
        if not isinstance(pins, list):
            raise HearthConnectionError("unexpected answer from /v1/prefixes")
        return pins

    async def async_put_prefix(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """``PUT /v1/prefixes/{name}?wait=true``: pin a prefix, answer once it is ready."""
        data = await self._json(
            "PUT",
            f"/v1/prefixes/{name}",
            body=body,
            params={"wait": "true"},
            client_timeout=aiohttp.ClientTimeout(total=PIN_TIMEOUT),
        )
        return data if isinstance(data, dict) else {}

    async def async_delete_prefix(self, name: str) -> None:
        """``DELETE /v1/prefixes/{name}``."""
        await self._json("DELETE", f"/v1/prefixes/{name}")

    async def async_clear_cache(self) -> int:
        """``POST /v1/cache/clear``: drop unpinned, unused cache; returns bytes freed."""
        data = await self._json("POST", "/v1/cache/clear")
        return int(data.get("freed_bytes", 0)) if isinstance(data, dict) else 0

    async def async_optional_text(self, path: str) -> str | None:
        """``GET path`` where the route may not exist (probing, ``/metrics``): the body,
        or None when the server has no such route (404, 405, 501)."""
        try:
            async with self._open("GET", path) as resp:
                return await resp.text()
        except HearthResponseError as err:
            if err.status in (404, 405, 501) and not isinstance(err, HearthAuthError):
                return None
            raise

    # ----------------------------------------------------------------- helpers

    async def _json(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        client_timeout: aiohttp.ClientTimeout | None = None,
    ) -> Any:
        async with self._open(
            method, path, body=body, params=params, client_timeout=client_timeout
        ) as resp:
            return _loads(await resp.text())

    @asynccontextmanager
    async def _open(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        client_timeout: aiohttp.ClientTimeout | None = None,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """Send a request; the one place where errors become ``HearthError``s."""
        try:
            async with self._session.request(
                method,
                f"{self._base}{path}",
                json=body,
                params=params,
                headers=self._headers,
                timeout=client_timeout or aiohttp.ClientTimeout(total=REQUEST_TIMEOUT),
            ) as resp:
                if resp.status >= 400:
                    raise await _response_error(resp)
                yield resp
        except TimeoutError as err:
            raise HearthConnectionError(f"{method} {path} timed out") from err
        except aiohttp.ClientError as err:
            raise HearthConnectionError(f"{method} {path} failed: {err}") from err


async def _response_error(resp: aiohttp.ClientResponse) -> HearthResponseError:
    """The engine's OpenAI-style error body (or the bare status) as an exception."""
    code: str | None = None
    message = resp.reason or "request failed"
    try:
        data = json.loads(await resp.text())
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(error := data.get("error"), dict):
        # OpenAI and Hearth send a string code; llama.cpp sends the status and a type.
        code = error.get("code") if isinstance(error.get("code"), str) else error.get("type")
        message = str(error.get("message") or message)
    return _error_for(resp.status, code, message)


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as err:
        raise HearthConnectionError("the engine sent invalid JSON") from err
