"""Only the engine's own clients (issue 26): a web page in a browser on the same machine
must not use the engine (CSRF), nor read it through DNS rebinding (CVE-2024-28224's class).

The real application (``create_app``) over a real engine (``tiny``) in process for the
rules, a ``serve`` process for the flags, and headless Chromium for the real thing.
"""

from __future__ import annotations

import argparse
import asyncio
import html
import json
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from hearth_engine.server.app import create_app
from hearth_engine.server.guard import (
    Guard,
    normalize_origin,
    parse_allowed_hosts,
    parse_allowed_origins,
    split_host,
)
from hearth_engine.server.main import StartupError, allowed_hosts, check_guard
from hearth_engine.server.state import ServerState
from hearth_engine.serving.engine import Engine

from .conftest import ServerProcess, assert_error, free_port, run_serve

CHAT = "/v1/chat/completions"
BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
KEY = "hk-origin-test-5d1f"
EVIL = "http://evil.example"
UI = "http://ui.example:3000"


@dataclass
class Served:
    """An in-process engine server, a client session, and every response it sent."""

    server: TestServer
    session: aiohttp.ClientSession
    engine: Engine
    seen: list[tuple[str, str, int]] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.server.port)  # type: ignore[arg-type]

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def send(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        no_content_type: bool = False,
    ) -> tuple[int, Any, Any]:
        """``(status, headers, parsed JSON or None)`` for a request sent as given."""
        skip = ("Content-Type",) if no_content_type else ()
        async with self.session.request(
            method, self.url(path), data=body, headers=headers or {}, skip_auto_headers=skip
        ) as r:
            text = await r.text()
            return r.status, r.headers, json.loads(text) if text else None

    async def chat(self, content_type: str | None = "application/json", **headers: str) -> Any:
        if content_type is not None:
            headers["Content-Type"] = content_type
        return await self.send(
            "POST",
            CHAT,
            body=json.dumps(BODY).encode(),
            headers=headers,
            no_content_type=content_type is None,
        )


Serve = Callable[..., Awaitable[Served]]


@pytest.fixture
async def serve(make_engine: Callable[..., Engine]) -> AsyncIterator[Serve]:
    """``await serve(**create_app_kwargs)``: a fresh app over a fresh ``tiny`` engine."""
    opened: list[Served] = []

    async def start(**kwargs: Any) -> Served:
        app = create_app(make_engine(), **kwargs)
        seen: list[tuple[str, str, int]] = []

        async def record(request: web.Request, response: web.StreamResponse) -> None:
            seen.append((request.method, request.path, response.status))

        app.on_response_prepare.append(record)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        served = Served(server, aiohttp.ClientSession(), app[ServerState.KEY].engine, seen)
        opened.append(served)
        return served

    yield start
    for served in opened:
        await served.session.close()
        await served.server.close()


def completed(served: Served) -> int:
    return int(served.engine.counters.requests)


# ---------------------------------------------------------------- Origin (CSRF)


async def test_a_foreign_origin_post_is_403_and_runs_nothing(serve: Serve) -> None:
    served = await serve()
    status, headers, body = await served.chat(Origin=EVIL)
    assert_error(status, body, 403, "origin_not_allowed")
    assert "Access-Control-Allow-Origin" not in headers
    assert completed(served) == 0


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        None,
    ],
)
async def test_a_body_that_is_not_declared_json_is_415(
    serve: Serve, content_type: str | None
) -> None:
    """The "simple" requests a page may send without a preflight (and a missing type)."""
    served = await serve()
    status, _, body = await served.chat(content_type)
    error = assert_error(status, body, 415, "unsupported_media_type")
    assert "application/json" in error["message"]
    assert completed(served) == 0


async def test_a_pin_put_as_text_plain_is_415(serve: Serve) -> None:
    served = await serve()
    body = json.dumps({"messages": [{"role": "system", "content": "house"}]}).encode()
    status, _, reply = await served.send(
        "PUT", "/v1/prefixes/house", body=body, headers={"Content-Type": "text/plain"}
    )
    assert_error(status, reply, 415, "unsupported_media_type")
    assert (await served.send("GET", "/v1/prefixes"))[2]["data"] == []


async def test_json_with_a_charset_and_a_post_without_body_are_served(serve: Serve) -> None:
    served = await serve()
    status, _, reply = await served.chat("application/json; charset=utf-8")
    assert status == 200, reply
    status, _, reply = await served.send("POST", "/v1/cache/clear", no_content_type=True)
    assert status == 200, reply


@pytest.mark.parametrize("origin", ["null", "http://127.0.0.1", "http://localhost:3000", "x"])
async def test_any_origin_is_refused_by_default(serve: Serve, origin: str) -> None:
    """Even a loopback page (another local app) is a web page: no default origin."""
    served = await serve()
    status, _, body = await served.send("GET", "/v1/models", headers={"Origin": origin})
    assert_error(status, body, 403, "origin_not_allowed")


async def test_a_cross_site_fetch_without_origin_is_403(serve: Serve) -> None:
    served = await serve()
    status, _, body = await served.send(
        "GET", "/v1/prefixes", headers={"Sec-Fetch-Site": "cross-site"}
    )
    assert_error(status, body, 403, "origin_not_allowed")
    # Typed into the address bar: Sec-Fetch-Site none, no Origin.
    status, _, _ = await served.send("GET", "/v1/models", headers={"Sec-Fetch-Site": "none"})
    assert status == 200


async def test_a_foreign_preflight_is_403_without_cors_headers(serve: Serve) -> None:
    served = await serve(allowed_origins=[UI])
    status, headers, body = await served.send(
        "OPTIONS",
        CHAT,
        headers={
            "Origin": EVIL,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type",
        },
    )
    assert_error(status, body, 403, "origin_not_allowed")
    assert not [name for name in headers if name.lower().startswith("access-control-")]


# ---------------------------------------------------------------- allowed origins (CORS)


async def test_an_allowed_origin_gets_a_proper_preflight(serve: Serve) -> None:
    served = await serve(allowed_origins=[UI])
    status, headers, _ = await served.send(
        "OPTIONS",
        "/v1/prefixes/house",
        headers={
            "Origin": UI,
            "Access-Control-Request-Method": "PUT",
            "Access-Control-Request-Headers": "authorization, content-type",
            "Access-Control-Request-Private-Network": "true",
        },
    )
    assert status == 204
    assert headers["Access-Control-Allow-Origin"] == UI
    assert "PUT" in headers["Access-Control-Allow-Methods"]
    allowed = headers["Access-Control-Allow-Headers"].lower()
    assert "authorization" in allowed and "content-type" in allowed
    assert headers["Access-Control-Allow-Private-Network"] == "true"
    assert "Origin" in headers.getall("Vary")


async def test_an_allowed_origin_is_served_and_named_never_star(serve: Serve) -> None:
    served = await serve(allowed_origins=["HTTP://UI.example:3000/"])  # normalized
    status, headers, reply = await served.chat(Origin=UI)
    assert status == 200, reply
    assert headers["Access-Control-Allow-Origin"] == UI
    # Its errors are readable by its page too.
    status, headers, reply = await served.chat("text/plain", Origin=UI)
    assert_error(status, reply, 415)
    assert headers["Access-Control-Allow-Origin"] == UI
    # Another port of the same host is another origin.
    status, headers, reply = await served.chat(Origin="http://ui.example:3001")
    assert_error(status, reply, 403, "origin_not_allowed")
    assert "Access-Control-Allow-Origin" not in headers


# ---------------------------------------------------------------- Host (DNS rebinding)


@pytest.mark.parametrize("method", ["GET", "DELETE"])
async def test_a_foreign_host_without_a_key_is_403(serve: Serve, method: str) -> None:
    served = await serve()
    path = "/v1/prefixes" if method == "GET" else "/v1/prefixes/house"
    status, _, body = await served.send(method, path, headers={"Host": "evil.example"})
    error = assert_error(status, body, 403, "host_not_allowed")
    assert "--allowed-hosts" in error["message"]
    status, _, body = await served.send(
        method, path, headers={"Host": f"evil.example:{served.port}"}
    )
    assert_error(status, body, 403, "host_not_allowed")


async def test_a_foreign_host_cannot_pin(serve: Serve) -> None:
    served = await serve()
    body = json.dumps({"messages": [{"role": "system", "content": "house"}]}).encode()
    status, _, reply = await served.send(
        "PUT",
        "/v1/prefixes/house",
        body=body,
        headers={"Host": "evil.example", "Content-Type": "application/json"},
    )
    assert_error(status, reply, 403, "host_not_allowed")
    assert (await served.send("GET", "/v1/prefixes"))[2]["data"] == []


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1:{port}",
        "localhost:{port}",
        "[::1]:{port}",
        "localhost",
        "LOCALHOST.:{port}",
        "127.0.0.2",
        "[::1]",
        "ui.localhost:{port}",
        "[::ffff:127.0.0.1]:{port}",
    ],
)
async def test_loopback_hosts_are_served(serve: Serve, host: str) -> None:
    served = await serve()
    status, _, body = await served.send(
        "GET", "/v1/prefixes", headers={"Host": host.format(port=served.port)}
    )
    assert status == 200, body


@pytest.mark.parametrize(
    "host",
    [
        "",
        "evil.example",
        "localhost.evil.example",
        "127.0.0.1.nip.io",
        "10.0.0.5",
        "0.0.0.0",
        "::1",
        "[::1",
        "localhost:x",
        "127.0.0.1:80:80",
    ],
)
async def test_other_or_malformed_hosts_are_403(serve: Serve, host: str) -> None:
    served = await serve()
    status, _, body = await served.send("GET", "/v1/models", headers={"Host": host})
    assert_error(status, body, 403, "host_not_allowed")


async def test_health_answers_any_host_and_says_nothing(serve: Serve) -> None:
    served = await serve()
    status, _, body = await served.send("GET", "/health", headers={"Host": "evil.example"})
    assert (status, body) == (200, {"status": "ok"})


async def test_configured_hosts_are_served(serve: Serve) -> None:
    served = await serve(allowed_hosts=["hearth.lan, 192.168.1.10", ".home.arpa"])
    for host in [
        "hearth.lan",
        "HEARTH.LAN:8765",
        "192.168.1.10:8765",
        "home.arpa",
        "engine.home.arpa:80",
    ]:
        status, _, body = await served.send("GET", "/v1/prefixes", headers={"Host": host})
        assert status == 200, (host, body)
    for host in ["evil.lan", "xhome.arpa", "hearth.lan.evil.example"]:
        status, _, body = await served.send("GET", "/v1/prefixes", headers={"Host": host})
        assert_error(status, body, 403, "host_not_allowed")


# ---------------------------------------------------------------- with an API key


async def test_with_a_key_a_foreign_host_is_served_but_a_foreign_origin_is_not(
    serve: Serve,
) -> None:
    """Behind a reverse proxy the key is the guard; a page still cannot borrow a key
    (a browser would not have it) nor send one from a foreign origin."""
    served = await serve(api_key=KEY)
    auth = {"Authorization": f"Bearer {KEY}"}
    status, _, body = await served.send(
        "GET", "/v1/prefixes", headers={**auth, "Host": "hearth.example.com"}
    )
    assert status == 200, body
    status, _, body = await served.chat(**auth, Host="hearth.example.com", Origin=EVIL)
    assert_error(status, body, 403, "origin_not_allowed")
    status, _, body = await served.chat("text/plain", **auth)
    assert_error(status, body, 415, "unsupported_media_type")
    status, _, body = await served.send("GET", "/v1/prefixes", headers={"Host": "evil.example"})
    assert_error(status, body, 401, "invalid_api_key")
    assert completed(served) == 0


# ---------------------------------------------------------------- the policy's parsing


@pytest.mark.parametrize(
    ("value", "host"),
    [
        ("127.0.0.1:8765", "127.0.0.1"),
        ("[::1]:8765", "::1"),
        ("LocalHost.", "localhost"),
        ("a.b", "a.b"),
        ("::1", None),
        ("[::1]x", None),
        ("a:", None),
        (":80", None),
        ("", None),
    ],
)
def test_split_host(value: str, host: str | None) -> None:
    assert split_host(value) == host


@pytest.mark.parametrize(
    ("value", "origin"),
    [
        ("http://UI.example:80", "http://ui.example"),
        ("https://a.b:8443/", "https://a.b:8443"),
        ("http://[::1]:3000", "http://[::1]:3000"),
        ("null", None),
        ("*", None),
        ("http://a.b/path", None),
        ("ftp://a.b", None),
        ("http://u@a.b", None),
        ("http://a.b:99999", None),
    ],
)
def test_normalize_origin(value: str, origin: str | None) -> None:
    assert normalize_origin(value) == origin


@pytest.mark.parametrize("bad", ["*", "null", "ui.example", "http://ui.example/app"])
def test_bad_allowed_origins_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="--allowed-origins"):
        parse_allowed_origins([bad])


@pytest.mark.parametrize("bad", ["hearth.lan:8765", "http://hearth.lan", "a/b", "[::1]:80"])
def test_bad_allowed_hosts_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="--allowed-hosts"):
        parse_allowed_hosts([bad])


def test_allowed_host_star_turns_the_host_check_off() -> None:
    guard = Guard.build(api_key=None, allowed_hosts=["*"], allowed_origins=[])
    assert guard.host_allowed("anything.example")
    assert parse_allowed_hosts(["::1", "[::2]", " a , b "]) == {"::1", "::2", "a", "b"}


# ---------------------------------------------------------------- the flags, end to end


def test_a_star_origin_is_refused_at_start_up() -> None:
    result = run_serve("--model", "tiny", "--port", str(free_port()), "--allowed-origins", "*")
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: --allowed-origins '*'"), result.stderr


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("127.0.0.1", ["a.lan"]),
        ("0.0.0.0", ["a.lan"]),
        ("::", ["a.lan"]),
        ("192.168.1.10", ["a.lan", "192.168.1.10"]),
        ("hearth.lan", ["a.lan", "hearth.lan"]),
    ],
)
def test_a_specific_bind_address_is_an_allowed_host(host: str, allowed: list[str]) -> None:
    args = argparse.Namespace(host=host, allowed_hosts=["a.lan"], allowed_origins=[])
    assert allowed_hosts(args) == allowed
    check_guard(args, None)
    with pytest.raises(StartupError, match="--allowed-hosts 'b\\.lan:80'"):
        check_guard(
            argparse.Namespace(host=host, allowed_hosts=["b.lan:80"], allowed_origins=[]), None
        )


async def test_the_flags_reach_the_server(server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory(
        "--allowed-hosts",
        "hearth.lan,proxy.lan",
        "--allowed-hosts",
        "third.lan",
        "--allowed-origins",
        UI,
    )
    async with aiohttp.ClientSession() as session:

        async def status(headers: dict[str, str]) -> int:
            async with session.get(f"{server.url}/v1/models", headers=headers) as r:
                await r.read()
                return r.status

        assert await status({"Host": f"proxy.lan:{server.port}"}) == 200
        assert await status({"Host": "third.lan"}) == 200
        assert await status({"Host": "evil.example"}) == 403
        assert await status({"Origin": UI}) == 200
        assert await status({"Origin": EVIL}) == 403


# ---------------------------------------------------------------- a real browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

PAGE = """<!doctype html><html><body><pre id="out">pending</pre><script>
const ENGINE = "%s";
const BODY = JSON.stringify({messages: [{role: "user", content: "hi"}], max_tokens: 2});
async function attempt(options) {
  try {
    const r = await fetch(ENGINE + "/v1/chat/completions",
                          {method: "POST", body: BODY, ...options});
    return "status " + r.status + " type " + r.type + " " + (await r.text());
  } catch (e) { return "failed " + e.name; }
}
(async () => {
  const out = {};
  out.plain = await attempt({headers: {"Content-Type": "text/plain"}});
  out.json = await attempt({headers: {"Content-Type": "application/json"}});
  out.opaque = await attempt({mode: "no-cors", headers: {"Content-Type": "text/plain"}});
  out.own = await (await fetch("/own")).text();
  document.getElementById("out").textContent = "RESULT" + JSON.stringify(out) + "END";
})();
</script></body></html>"""


async def dump_dom(url: str, profile: Path) -> str:
    proc = await asyncio.create_subprocess_exec(
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=5000",
        "--dump-dom",
        url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=180)
    return out.decode(errors="replace")


@pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (scripts/setup installs it)"
)
async def test_a_page_from_another_origin_cannot_use_the_engine(
    serve: Serve, tmp_path: Path
) -> None:
    """A page on another loopback port fetches the engine: a simple ``text/plain`` POST
    (no preflight), a JSON POST (preflight) and a ``no-cors`` POST. None completes."""
    served = await serve()
    page = web.Application()
    text = PAGE % f"http://127.0.0.1:{served.port}"

    async def index(_: web.Request) -> web.Response:
        return web.Response(text=text, content_type="text/html")

    async def own(_: web.Request) -> web.Response:
        return web.Response(text="own origin works")

    page.router.add_get("/", index)
    page.router.add_get("/own", own)
    page_server = TestServer(page, host="127.0.0.1")
    await page_server.start_server()
    try:
        dom = await dump_dom(f"http://127.0.0.1:{page_server.port}/", tmp_path / "profile")
    finally:
        await page_server.close()
    assert "RESULT" in dom and "END" in dom, dom[-2000:]
    result = json.loads(html.unescape(dom.split("RESULT", 1)[1].split("END", 1)[0]))
    assert result["own"] == "own origin works"  # the page ran and could fetch at all
    assert result["plain"] == "failed TypeError", result
    assert result["json"] == "failed TypeError", result
    assert result["opaque"].startswith("status 0 type opaque"), result
    assert "choices" not in json.dumps(result)
    assert completed(served) == 0
    # The browser did reach the engine, and was turned away before any route ran.
    assert ("POST", CHAT, 403) in served.seen
    assert ("OPTIONS", CHAT, 403) in served.seen
    assert all(status == 403 for _, path, status in served.seen if path == CHAT), served.seen
