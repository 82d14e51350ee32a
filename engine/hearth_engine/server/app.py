"""The aiohttp application: routes, authentication and error middleware."""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web

from ..chat.formatter import ChatFormatter
from ..serving.engine import Engine, EngineFailedError
from . import prefixes
from .completions import chat_completions
from .errors import APIError, from_http_exception
from .guard import Guard
from .guard_middleware import cors_headers, guard_middleware
from .metrics import CONTENT_TYPE, Metrics, engine_stats
from .state import ServerState

_LOGGER = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PUBLIC_PATHS = frozenset({"/health"})


def _bearer(request: web.Request) -> str:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token:
        return token.strip()
    return request.headers.get("X-API-Key", "")


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error leaves as OpenAI-style JSON; nothing leaks a traceback."""
    try:
        return await handler(request)
    except APIError as err:
        return err.response()
    except EngineFailedError as err:
        return APIError(
            503,
            str(err),
            type_="server_error",
            code="engine_stopped",
            headers={"Retry-After": "30"},
        ).response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return from_http_exception(exc).response()
    except (ConnectionResetError, OSError) as err:
        # The client went away mid-response; nothing can be sent.
        _LOGGER.debug("client disconnected: %s", err)
        raise
    except Exception:
        _LOGGER.exception("Unhandled error in %s %s", request.method, request.path)
        return APIError(
            500, "internal server error", type_="server_error", code="internal_error"
        ).response()


def auth_middleware(
    api_key: str | None,
) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    expected = api_key.encode("utf-8", "surrogateescape") if api_key else None

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if expected is not None and request.path not in PUBLIC_PATHS:
            # Header bytes that are not UTF-8 arrive as surrogate escapes: give the raw
            # bytes back (a plain encode() would fail, a 500 instead of a 401).
            given = _bearer(request).encode("utf-8", "surrogateescape")
            # Constant-time comparison: timing reveals nothing about the key.
            if not hmac.compare_digest(given, expected):
                raise APIError(
                    401,
                    "missing or invalid API key (send 'Authorization: Bearer <key>')",
                    type_="authentication_error",
                    code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"},
                )
        return await handler(request)

    return middleware


async def health(request: web.Request) -> web.Response:
    """Cheap, unauthenticated, and says nothing about the model, prompts or paths.

    503 when the engine's worker is not running: nothing would be served.
    """
    if not request.app[ServerState.KEY].engine.alive:
        return web.json_response({"status": "error", "reason": "engine stopped"}, status=503)
    return web.json_response({"status": "ok"})


async def models(request: web.Request) -> web.Response:
    engine = request.app[ServerState.KEY].engine
    info = engine.info
    return web.json_response(
        {
            "object": "list",
            "data": [
                {
                    "id": info.name,
                    "object": "model",
                    "created": int(engine.started_at),
                    "owned_by": "hearth",
                    "context_length": info.context_length,
                }
            ],
        }
    )


async def stats(request: web.Request) -> web.Response:
    state = request.app[ServerState.KEY]
    data = engine_stats(state.engine)
    data.update(state.metrics.recent())
    data.update(state.constraints.stats())
    data["time"] = time.time()
    return web.json_response(data)


async def metrics(request: web.Request) -> web.Response:
    body = request.app[ServerState.KEY].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def clear_cache(request: web.Request) -> web.Response:
    freed = await request.app[ServerState.KEY].engine.clear_cache()
    return web.json_response({"freed_bytes": freed})


async def _close_state(app: web.Application) -> None:
    app[ServerState.KEY].close()


def create_app(
    engine: Engine,
    *,
    api_key: str | None = None,
    max_body_bytes: int = 1 << 20,
    log_prompts: bool = False,
    allowed_hosts: Iterable[str] = (),
    allowed_origins: Iterable[str] = (),
) -> web.Application:
    """``allowed_hosts``/``allowed_origins``: ``--allowed-hosts``/``--allowed-origins``
    (see ``guard``); a bad entry raises ``ValueError``."""
    guard = Guard.build(
        api_key=api_key, allowed_hosts=allowed_hosts, allowed_origins=allowed_origins
    )
    app = web.Application(
        middlewares=[error_middleware, guard_middleware(guard), auth_middleware(api_key)],
        client_max_size=max_body_bytes,
    )
    app.on_response_prepare.append(cors_headers(guard))
    state = ServerState(
        engine=engine,
        # Its own copy of the tokenizer, used only on the prepare thread (see ChatFormatter).
        formatter=ChatFormatter(engine.runner.tokenizer),
        metrics=Metrics(engine),
        api_key=api_key,
        log_prompts=log_prompts,
    )
    app[ServerState.KEY] = state
    app.on_cleanup.append(_close_state)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/stats", stats)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/cache/clear", clear_cache)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/prefixes", prefixes.list_prefixes)
    app.router.add_put("/v1/prefixes/{name}", prefixes.put_prefix)
    app.router.add_get("/v1/prefixes/{name}", prefixes.get_prefix)
    app.router.add_delete("/v1/prefixes/{name}", prefixes.delete_prefix)
    return app
