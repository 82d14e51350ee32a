"""The HTTP side of the ``Guard``: refuse foreign hosts and origins before any route runs,
require JSON bodies, and answer CORS for the allowed origins only.

A browser sends a "simple" cross-origin POST (``text/plain``, a form) without asking
first; requiring ``application/json`` forces a preflight, which a foreign origin fails.
No response ever says ``Access-Control-Allow-Origin: *``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from .errors import APIError
from .guard import Guard

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Middleware = Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]
Signal = Callable[[web.Request, web.StreamResponse], Awaitable[None]]

HOST_FREE_PATHS = frozenset({"/health"})  # says only "ok": harmless, and probes use any Host
BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
CORS_METHODS = "GET, POST, PUT, DELETE"
CORS_HEADERS = "Authorization, Content-Type, X-API-Key"
CORS_MAX_AGE_S = "600"


def _shown(value: str) -> str:
    return repr(value[:100])


def _forbidden(message: str, code: str) -> APIError:
    return APIError(403, message, type_="permission_error", code=code)


def _check_host(guard: Guard, request: web.Request) -> None:
    if request.path in HOST_FREE_PATHS:
        return
    host = request.headers.get("Host")
    if not guard.host_allowed(host):
        raise _forbidden(
            f"Host {_shown(host or '')} is not allowed: without an API key the engine answers"
            " only loopback names (localhost, 127.0.0.1, [::1]); start it with"
            " --allowed-hosts NAME or an API key",
            "host_not_allowed",
        )


def _check_origin(guard: Guard, request: web.Request) -> None:
    origin = request.headers.get("Origin")
    if origin is not None:
        if not guard.origin_allowed(origin):
            raise _forbidden(
                f"Origin {_shown(origin)} is not allowed: requests from web pages need"
                " --allowed-origins",
                "origin_not_allowed",
            )
    elif request.headers.get("Sec-Fetch-Site", "").lower() == "cross-site":
        raise _forbidden(
            "cross-site browser requests are not allowed (see --allowed-origins)",
            "origin_not_allowed",
        )


def _check_content_type(request: web.Request) -> None:
    if request.method not in BODY_METHODS or not request.body_exists:
        return
    if request.content_type == "application/json" and "Content-Type" in request.headers:
        return
    sent = request.headers.get("Content-Type")
    raise APIError(
        415,
        "Content-Type must be application/json"
        + (f" (got {_shown(sent)})" if sent else " (none was sent)"),
        param="Content-Type",
        code="unsupported_media_type",
    )


def _preflight(request: web.Request) -> web.Response:
    """The answer to an allowed origin's ``OPTIONS``: what it may send, cached a while."""
    headers = {
        "Access-Control-Allow-Methods": CORS_METHODS,
        "Access-Control-Allow-Headers": CORS_HEADERS,
        "Access-Control-Max-Age": CORS_MAX_AGE_S,
    }
    if request.headers.get("Access-Control-Request-Private-Network", "").lower() == "true":
        headers["Access-Control-Allow-Private-Network"] = "true"
    return web.Response(status=204, headers=headers)


def guard_middleware(guard: Guard) -> Middleware:
    """Host, then Origin, then the body's type; allowed preflights end here (no auth:
    a browser sends no credentials with one)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        _check_host(guard, request)
        _check_origin(guard, request)
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            return _preflight(request)
        _check_content_type(request)
        return await handler(request)

    return middleware


def cors_headers(guard: Guard) -> Signal:
    """``on_response_prepare``: every response to an allowed origin (errors and streams
    too) names that origin, so its page can read it; nothing for anyone else."""

    async def add_headers(request: web.Request, response: web.StreamResponse) -> None:
        origin = request.headers.get("Origin")
        if origin is None or not guard.origin_allowed(origin):
            return
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Access-Control-Expose-Headers"] = "Retry-After"
        response.headers.add("Vary", "Origin")

    return add_headers
