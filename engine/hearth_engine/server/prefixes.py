"""Pinned prefixes: ``PUT/GET/DELETE /v1/prefixes/{name}``, ``GET /v1/prefixes``."""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from aiohttp import web

from ..cache.radix import CacheFullError, PinTooLargeError
from ..chat.formatter import ChatTemplateError
from ..serving.engine import ContextLengthError, EngineClosedError, QueueFullError
from .completions import constraint_for
from .errors import APIError, bad_request, not_found, overloaded
from .schemas import PIN_REQUEST, check_pin_name, read_json, validate
from .state import ServerState

_LOGGER = logging.getLogger(__name__)


def _state(request: web.Request) -> ServerState:
    return request.app[ServerState.KEY]


def _wait_flag(request: web.Request) -> bool:
    value = request.query.get("wait", "true").lower()
    if value not in ("true", "false", "1", "0"):
        raise bad_request("wait must be true or false", param="wait")
    return value in ("true", "1")


def _pin_tokens(state: ServerState, body: dict[str, Any]) -> list[int]:
    """Render and tokenize a pin's messages (runs on the prepare thread, not the loop)."""
    try:
        tokens = state.prompts.encode(
            body["messages"], body.get("tools"), add_generation_prompt=False
        )
    except RecursionError:
        raise bad_request("the messages or tools are nested too deeply") from None
    except ChatTemplateError as err:
        raise bad_request(str(err), param="messages", code="invalid_messages") from None
    if body.get("tools"):
        # Compile the house's grammar now (tool_choice auto, the house values sent with
        # the pin): its requests then find it cached. A bad schema is refused here too.
        constraint_for(state, {**body, "tool_choice": "auto"}, "")
    return tokens


async def put_prefix(request: web.Request) -> web.Response:
    state = _state(request)
    name = check_pin_name(request.match_info["name"])
    wait = _wait_flag(request)
    body = validate(PIN_REQUEST, await read_json(request))
    tokens = await state.prepare(partial(_pin_tokens, state, body))
    try:
        status = await state.engine.pin(name, tokens, wait=wait)
    except PinTooLargeError as err:
        raise APIError(422, f"prefix {name!r} is too large: {err}", code="pin_too_large") from None
    except CacheFullError as err:
        raise overloaded(f"cannot pin {name!r} now: {err}", retry_after=5) from None
    except ContextLengthError as err:
        raise APIError(422, str(err), param="messages", code="context_length_exceeded") from None
    except EngineClosedError:
        raise overloaded("the engine is shutting down", retry_after=5) from None
    except QueueFullError as err:
        raise overloaded(f"cannot pin {name!r} now: {err}; retry shortly") from None
    result = state.engine.pin_status(name) or status.as_dict()
    if not wait:
        return web.json_response(status.as_dict(), status=202)
    if status.state == "failed":
        raise APIError(
            503 if status.error != "superseded" else 409,
            f"pinning {name!r} failed: {status.error}",
            type_="server_error",
            code="pin_failed",
            headers={"Retry-After": "5"},
        )
    _LOGGER.info(
        "pin %s: %d tokens, %s in %.0f ms",
        name,
        status.tokens,
        "restored from store"
        if status.restored
        else ("computed" if status.prefill_ms else "already cached"),
        status.prefill_ms,
    )
    return web.json_response(result)


async def get_prefix(request: web.Request) -> web.Response:
    name = check_pin_name(request.match_info["name"])
    status = _state(request).engine.pin_status(name)
    if status is None:
        raise not_found(f"no prefix named {name!r}")
    return web.json_response(status)


async def list_prefixes(request: web.Request) -> web.Response:
    engine = _state(request).engine
    data = [s for s in (engine.pin_status(n) for n in engine.pin_names()) if s is not None]
    return web.json_response({"object": "list", "data": data})


async def delete_prefix(request: web.Request) -> web.Response:
    name = check_pin_name(request.match_info["name"])
    engine = _state(request).engine
    if not engine.unpin(name):
        raise not_found(f"no prefix named {name!r}")
    await engine.settled()  # the pin's bytes are released when the reply says deleted
    return web.json_response({"name": name, "deleted": True})
