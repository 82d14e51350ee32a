"""Every error is OpenAI-style JSON with the right status: 400, 401, 404, 405, 413, 422.

(429/503 for a full queue is in test_server_limits.py, 503 at shutdown in
test_server_lifecycle.py.)
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from hearth_engine.server.app import auth_middleware, error_middleware

from .conftest import TOOLS_SERVER_KEY, Client, ServerProcess, raw_http, split_http_response
from .test_server_chat import TOOLS, system, user

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def server(tools_server: ServerProcess) -> ServerProcess:
    return tools_server


def chat_body(**overrides: Any) -> dict[str, Any]:
    return {"messages": [system(words=4), user("hi")], "max_tokens": 4, **overrides}


# ---------------------------------------------------------------- 400


@pytest.mark.parametrize(
    "data",
    [
        b"{bad",
        b"",
        b"   ",
        b"[1, 2]",
        b"null",
        b'"a string"',
        b"\xff\xfe{}",  # not UTF-8
        b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
        b"[" * 100_000 + b"]" * 100_000,  # nested too deeply for a recursive parser
    ],
    ids=["truncated", "empty", "blank", "array", "null", "string", "not-utf8", "nan", "deep"],
)
async def test_malformed_json_is_400(client: Client, data: bytes) -> None:
    error = await client.error(
        "POST", CHAT, 400, "invalid_json", data=data, headers={"Content-Type": "application/json"}
    )
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("field", "value", "param"),
    [
        ("max_tokens", "ten", "max_tokens"),
        ("max_tokens", 2.5, "max_tokens"),
        ("max_tokens", True, "max_tokens"),
        ("max_tokens", 0, "max_tokens"),
        ("max_completion_tokens", -1, "max_completion_tokens"),
        ("stream", "yes", "stream"),
        ("temperature", "hot", "temperature"),
        ("temperature", 2.5, "temperature"),
        ("top_p", 0, "top_p"),
        ("seed", "7", "seed"),
        ("stop", [1, 2], "stop"),
        ("stop", ["a", "b", "c", "d", "e"], "stop"),
        ("n", 2, "n"),
        ("tools", {"type": "function"}, "tools"),
        ("tool_choice", "always", "tool_choice"),
        ("stream_options", {"include_usage": "yes"}, "stream_options.include_usage"),
        ("cache_salt", 5, "cache_salt"),
        ("messages", "hi", "messages"),
        ("messages", [], "messages"),
        ("messages", [{"role": "robot", "content": "hi"}], "messages.0.role"),
        ("messages", [{"role": "user", "content": 5}], "messages.0.content"),
        ("messages", [{"content": "hi"}], "messages.0.role"),
    ],
)
async def test_wrong_field_type_or_value_is_400(
    client: Client, field: str, value: Any, param: str
) -> None:
    error = await client.error(
        "POST", CHAT, 400, "invalid_value", json_body=chat_body(**{field: value})
    )
    assert error["param"] == param
    assert error["message"].startswith(param)


async def test_missing_messages_is_400(client: Client) -> None:
    error = await client.error("POST", CHAT, 400, "invalid_value", json_body={"max_tokens": 4})
    assert error["param"] == "messages"


async def test_tool_result_without_a_matching_call_is_400(client: Client) -> None:
    messages = [
        user("turn on the kitchen light"),
        {
            "role": "assistant",
            "tool_calls": [{"id": "call_a", "function": {"name": "HassTurnOn", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "call_b", "content": "{}"},
    ]
    error = await client.error(
        "POST", CHAT, 400, json_body=chat_body(messages=messages, tools=TOOLS)
    )
    assert error["param"] == "messages.2.tool_call_id"
    assert "call_b" in error["message"]


async def test_tool_choice_must_name_a_given_tool(client: Client) -> None:
    choice = {"type": "function", "function": {"name": "HassUnlock"}}
    error = await client.error(
        "POST", CHAT, 400, json_body=chat_body(tools=TOOLS, tool_choice=choice)
    )
    assert error["param"] == "tool_choice"
    error = await client.error("POST", CHAT, 400, json_body=chat_body(tool_choice="required"))
    assert error["param"] == "tool_choice"


@pytest.mark.parametrize("name", ["HassTurnOn\n", "Hass TurnOn", "", "x" * 65])
async def test_invalid_tool_names_are_400(client: Client, name: str) -> None:
    """Regression: the name pattern ended in "$", which also matches before a final "\\n"."""
    tools = [{"type": "function", "function": {"name": name, "parameters": {}}}]
    error = await client.error("POST", CHAT, 400, "invalid_value", json_body=chat_body(tools=tools))
    assert error["param"] == "tools.0.function.name"


async def test_a_body_that_cannot_be_decoded_is_400(client: Client, server: ServerProcess) -> None:
    """Regression: a corrupt ``Content-Encoding`` body was a 500 with a logged traceback."""
    log_start = len(server.stderr())
    for path in (CHAT, "/v1/prefixes/house"):
        method = "POST" if path == CHAT else "PUT"
        error = await client.error(
            method,
            path,
            400,
            "invalid_json",
            data=b"this is not gzip data",
            headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
        )
        assert "cannot be read" in error["message"]
    log = server.stderr()[log_start:]
    assert "Traceback" not in log
    assert "Unhandled" not in log
    reply = await client.chat(**chat_body())  # the server is fine
    assert reply["choices"][0]["message"]["content"]


# ---------------------------------------------------------------- 401


ROUTES = [
    ("GET", "/v1/models"),
    ("GET", "/v1/stats"),
    ("GET", "/metrics"),
    ("POST", CHAT),
    ("POST", "/v1/cache/clear"),
    ("GET", "/v1/prefixes"),
    ("GET", "/v1/prefixes/house"),
    ("PUT", "/v1/prefixes/house"),
    ("DELETE", "/v1/prefixes/house"),
    ("GET", "/no/such/route"),
]


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Bearer {TOOLS_SERVER_KEY[:-1]}"},
        {"Authorization": f"Bearer {TOOLS_SERVER_KEY}x"},
        {"Authorization": f"Basic {TOOLS_SERVER_KEY}"},
        {"Authorization": "Bearer"},
        {"Authorization": TOOLS_SERVER_KEY},
        {"X-API-Key": "wrong"},
        {"X-API-Key": ""},
    ],
    ids=[
        "none",
        "wrong",
        "prefix",
        "suffix",
        "basic",
        "empty-bearer",
        "no-scheme",
        "x-wrong",
        "x-empty",
    ],
)
async def test_missing_or_wrong_key_is_401_on_every_route(
    client: Client, headers: dict[str, str]
) -> None:
    for method, path in ROUTES:
        status, response_headers, body = await client.request(
            method, path, headers=headers, auth=False, json_body=chat_body()
        )
        error = json.dumps(body)
        assert status == 401, (method, path, error)
        assert body["error"]["code"] == "invalid_api_key", error
        assert body["error"]["type"] == "authentication_error", error
        assert response_headers["WWW-Authenticate"] == "Bearer"
        assert TOOLS_SERVER_KEY not in error


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": f"Bearer {TOOLS_SERVER_KEY}"},
        {"Authorization": f"bearer {TOOLS_SERVER_KEY}"},
        {"X-API-Key": TOOLS_SERVER_KEY},
    ],
)
async def test_the_right_key_is_accepted(client: Client, headers: dict[str, str]) -> None:
    status, _, body = await client.request("GET", "/v1/models", headers=headers, auth=False)
    assert status == 200, body


@pytest.mark.parametrize("header", [b"Authorization: Bearer k\xff\xfe1", b"X-API-Key: \xff\xfe"])
def test_a_key_that_is_not_utf8_is_401_not_500(server: ServerProcess, header: bytes) -> None:
    """Regression: header bytes that are not UTF-8 made the comparison raise (a 500)."""
    request = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + header + b"\r\nConnection: close\r\n\r\n"
    status, headers, body = split_http_response(raw_http(server, request))
    assert status == 401
    assert headers["content-type"].startswith("application/json")
    assert json.loads(body)["error"]["code"] == "invalid_api_key"


async def test_the_key_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every check goes through ``hmac.compare_digest``, whatever the length or content of
    the key sent (no early exit that timing could reveal)."""
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application(middlewares=[error_middleware, auth_middleware("s3cret-key")])
    app.router.add_get("/v1/models", ok)
    async with TestClient(TestServer(app)) as http:
        sent = {"": 401, "x": 401, "s3cret-kez": 401, "s3cret-key-and-more": 401, "s3cret-key": 200}
        for key, expected in sent.items():
            response = await http.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
            assert response.status == expected, key
    assert [a for a, _ in compared] == [k.encode() for k in sent]
    assert all(b == b"s3cret-key" for _, b in compared)


# ---------------------------------------------------------------- 404, 405


@pytest.mark.parametrize("accept", ["application/json", "text/html", "*/*"])
async def test_unknown_route_is_404_json_whatever_the_client_accepts(
    client: Client, accept: str
) -> None:
    for method, path in [("GET", "/v2/models"), ("POST", "/v1/completions"), ("GET", "/")]:
        error = await client.error(method, path, 404, "not_found", headers={"Accept": accept})
        assert "<html" not in error["message"].lower()


async def test_unknown_pin_is_404(client: Client) -> None:
    error = await client.error("GET", "/v1/prefixes/no-such-pin", 404, "not_found")
    assert "no-such-pin" in error["message"]
    await client.error("DELETE", "/v1/prefixes/no-such-pin", 404, "not_found")


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("GET", CHAT, "POST"),
        ("DELETE", "/v1/models", "GET"),
        ("POST", "/v1/prefixes/house", "DELETE,GET,PUT"),
        ("PATCH", "/v1/prefixes", "GET"),
    ],
)
async def test_wrong_method_is_405_with_allow(
    client: Client, method: str, path: str, allowed: str
) -> None:
    status, headers, body = await client.request(method, path, json_body=chat_body())
    assert status == 405, body
    assert body["error"]["code"] == "method_not_allowed"
    assert set(headers["Allow"].replace(" ", "").split(",")) >= set(allowed.split(","))


# ---------------------------------------------------------------- 413


async def test_body_over_the_limit_is_413(client: Client) -> None:
    """The tools server runs with the default limit, 1024 KiB."""
    big = chat_body(messages=[user("x" * (1024 * 1024 + 100))])
    for method, path in [("POST", CHAT), ("PUT", "/v1/prefixes/big")]:
        error = await client.error(method, path, 413, "request_too_large", json_body=big)
        assert str(1024 * 1024) in error["message"]
    await client.error("GET", "/v1/prefixes/big", 404, "not_found")
    # just under the limit is fine (the 422 says it got as far as the context check)
    almost = chat_body(messages=[user("x " * 400_000)])
    await client.error("POST", CHAT, 422, "context_length_exceeded", json_body=almost)


# ---------------------------------------------------------------- 422


async def test_prompt_plus_max_tokens_over_the_context_is_422(client: Client) -> None:
    messages = [system(words=4), user("hi")]
    reply = await client.chat(messages=messages, max_tokens=4)
    prompt = reply["usage"]["prompt_tokens"]
    context = 32768
    # exactly the context: accepted (the model stops by itself after a few tokens)
    fits = await client.chat(messages=messages, max_tokens=context - prompt)
    assert fits["choices"][0]["finish_reason"] == "stop"
    too_many = context - prompt + 1
    for stream in (False, True):
        error = await client.error(
            "POST",
            CHAT,
            422,
            "context_length_exceeded",
            json_body={"messages": messages, "max_tokens": too_many, "stream": stream},
        )
        assert error["param"] == "max_tokens"
        for number in (context, prompt, too_many, context + 1):
            assert str(number) in error["message"], error["message"]


async def test_prompt_alone_over_the_context_is_422(client: Client) -> None:
    error = await client.error(
        "POST",
        CHAT,
        422,
        "context_length_exceeded",
        json_body={"messages": [user("x " * 33_000)]},
    )
    assert error["param"] == "messages"
    assert "32768" in error["message"]


# ---------------------------------------------------------------- a server in process


def _app_raising(exc: BaseException | Callable[[], BaseException]) -> web.Application:
    async def handler(request: web.Request) -> web.Response:
        raise exc() if callable(exc) else exc

    app = web.Application(middlewares=[error_middleware, auth_middleware(None)])
    app.router.add_get("/boom", handler)
    return app


@pytest.mark.parametrize("accept", ["text/html", "application/json"])
async def test_an_unexpected_exception_is_a_json_500_without_traceback(
    accept: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = _app_raising(lambda: KeyError("secret internals"))
    async with TestClient(TestServer(app)) as http:
        response = await http.get("/boom", headers={"Accept": accept})
        text = await response.text()
    assert response.status == 500
    assert response.headers["Content-Type"].startswith("application/json")
    body = json.loads(text)
    assert body["error"]["code"] == "internal_error"
    assert "secret internals" not in text
    assert "Traceback" not in text
    assert "Unhandled error in GET /boom" in caplog.text  # the log keeps the details
