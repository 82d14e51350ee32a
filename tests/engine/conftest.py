"""Shared fixtures: the tiny models (built once into the cache) and engines over them,
and a harness for the HTTP server tests (a ``serve`` subprocess and an aiohttp client)."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from hearth_engine.config import EngineConfig
from hearth_engine.model.runner import ModelRunner
from hearth_engine.serving.engine import Engine


@pytest.fixture(scope="session")
def tiny_runner() -> ModelRunner:
    return ModelRunner.load("tiny", dtype="float32")


@pytest.fixture(scope="session")
def tiny_runner64() -> ModelRunner:
    """float64: rounding noise far below any logit gap, so greedy choices are comparable."""
    return ModelRunner.load("tiny", dtype="float64")


@pytest.fixture(scope="session")
def tiny_runner64_transformers() -> ModelRunner:
    """float64 through transformers' own forward (``--forward transformers``)."""
    return ModelRunner.load("tiny", dtype="float64", forward="transformers")


@pytest.fixture(scope="session")
def tiny_runner_bf16() -> ModelRunner:
    """bfloat16, whatever the host (torch computes it on any CPU, slowly without AVX512-BF16):
    the dtype ``auto`` picks on most users' hardware, so its paths are tested everywhere."""
    return ModelRunner.load("tiny", dtype="bfloat16")


@pytest.fixture
def make_engine(tiny_runner: ModelRunner) -> Iterator[Callable[..., Engine]]:
    engines: list[Engine] = []

    def factory(runner: ModelRunner | None = None, **overrides: Any) -> Engine:
        config = EngineConfig(model="tiny", **{"kv_cache_bytes": 64 << 20, **overrides})
        engine = Engine(config, runner or tiny_runner)
        engine.start()
        engines.append(engine)
        return engine

    yield factory
    for engine in engines:
        engine.close()


# ================================================================ HTTP server harness
# For tests/engine/test_server*.py: a real ``hearth_engine serve`` subprocess per module
# (stderr captured to a file) and an aiohttp client with OpenAI-style helpers.

TOOLS_SERVER_KEY = "hk-test-7c1e93f0a2"
START_TIMEOUT_S = 240.0  # a cold start on a busy 2-core machine (first torch import)
SERVER_DTYPE = "float32"  # the same text and KV bytes on every host (see launch_server)


def linux_at_least(major: int, minor: int) -> bool:
    """Whether this is Linux of at least that release (for kernel features a test needs)."""
    try:
        got = tuple(int(x) for x in platform.release().split(".")[:2])
    except ValueError:
        return False
    return platform.system() == "Linux" and got >= (major, minor)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "hearth_engine", "serve", *args]


def server_env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


@dataclass
class ServerProcess:
    """A running ``hearth_engine serve``; its stderr goes to ``log_path``."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    api_key: str | None = None
    connect_host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://{self.connect_host}:{self.port}"

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def stderr(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, text: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.stderr():
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} not logged; stderr:\n{self.stderr()[-3000:]}")
            time.sleep(0.1)

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"server exited with {self.proc.returncode}:\n{self.stderr()[-3000:]}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"server not ready:\n{self.stderr()[-3000:]}")
            time.sleep(0.2)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 90.0) -> int:
        """Signal the server and wait for it; returns the exit code (kills it if stuck)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
                raise AssertionError(f"server ignored signal {sig}") from None
        return int(self.proc.returncode)


def launch_server(
    workdir: Path,
    *args: str,
    api_key: str | None = None,
    host: str = "127.0.0.1",
    ready: bool = True,
) -> ServerProcess:
    """Start ``serve --host HOST --port FREE [--api-key KEY] ARGS`` (``--model tiny`` and
    ``--dtype float32`` unless ARGS name others) and, with ``ready``, wait until ``/health``
    answers.

    The dtype is fixed because ``auto`` picks bfloat16 on CPUs with AVX512-BF16/AMX:
    there the tiny models' exact replies differ and KV takes half the bytes, so tests of
    exact text or of the KV budget would pass on one host and fail on another.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cmd = serve_command("--host", host, "--port", str(port), *args)
    if "--model" not in args:
        cmd += ["--model", "tiny"]
    if "--dtype" not in args:
        cmd += ["--dtype", SERVER_DTYPE]
    if api_key is not None:
        cmd += ["--api-key", api_key]
    log_path = workdir / f"server-{port}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=server_env()
        )
    server = ServerProcess(proc, port, log_path, api_key)
    if ready:
        try:
            server.wait_ready()
        except BaseException:
            server.stop(signal.SIGKILL)
            raise
    return server


def run_serve(*args: str, timeout: float = START_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run ``serve`` to completion (for start-up failures)."""
    return subprocess.run(
        serve_command(*args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=server_env(),
        stdin=subprocess.DEVNULL,
        check=False,
    )


@pytest.fixture(scope="session")
def server_factory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., ServerProcess]]:
    """``server_factory(*args, api_key=..., host=...)``: servers killed at the end at the latest."""
    started: list[ServerProcess] = []

    def factory(*args: str, **kwargs: Any) -> ServerProcess:
        server = launch_server(tmp_path_factory.mktemp("server"), *args, **kwargs)
        started.append(server)
        return server

    yield factory
    for server in started:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait(30)


class Client:
    """An aiohttp session bound to one server, with OpenAI-style helpers."""

    def __init__(self, server: ServerProcess, session: aiohttp.ClientSession) -> None:
        self.server = server
        self.session = session

    def url(self, path: str) -> str:
        return f"{self.server.url}{path}"

    async def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        data: bytes | str | None = None,
        headers: dict[str, str] | None = None,
        auth: bool = True,
    ) -> tuple[int, Any, Any]:
        """``(status, headers, body)``; the body is parsed JSON (the test fails if it is not)."""
        all_headers = {**(self.server.auth if auth else {}), **(headers or {})}
        if json_body is not None:
            data = json.dumps(json_body)
            all_headers.setdefault("Content-Type", "application/json")
        async with self.session.request(
            method, self.url(path), data=data, headers=all_headers
        ) as r:
            text = await r.text()
            try:
                body = json.loads(text)
            except ValueError:
                raise AssertionError(
                    f"{method} {path}: not JSON ({r.status}): {text[:500]}"
                ) from None
            return r.status, r.headers, body

    async def error(
        self, method: str, path: str, expected: int, code: str | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        """Send a request that must fail with ``expected``; returns the ``error`` object."""
        status, headers, body = await self.request(method, path, **kwargs)
        assert headers["Content-Type"].startswith("application/json"), headers
        return assert_error(status, body, expected, code)

    async def get(self, path: str, **kwargs: Any) -> Any:
        status, _, body = await self.request("GET", path, **kwargs)
        assert status == 200, body
        return body

    async def chat(self, **body: Any) -> dict[str, Any]:
        status, _, reply = await self.request("POST", "/v1/chat/completions", json_body=body)
        assert status == 200, reply
        return reply  # type: ignore[no-any-return]

    async def stream(self, **body: Any) -> list[Any]:
        """A streamed chat completion: the decoded ``data:`` payloads, ``"[DONE]"`` last."""
        headers = {**self.server.auth, "Content-Type": "application/json"}
        payload = json.dumps({**body, "stream": True})
        async with self.session.post(
            self.url("/v1/chat/completions"), data=payload, headers=headers
        ) as r:
            text = await r.text()
            assert r.status == 200, text
            assert r.headers["Content-Type"].startswith("text/event-stream")
        return parse_sse(text)

    async def put_pin(self, name: str, wait: bool = True, **body: Any) -> dict[str, Any]:
        path = f"/v1/prefixes/{name}" + ("" if wait else "?wait=false")
        status, _, pin = await self.request("PUT", path, json_body=body)
        assert status == (200 if wait else 202), pin
        return pin  # type: ignore[no-any-return]

    async def stats(self) -> dict[str, Any]:
        return await self.get("/v1/stats")  # type: ignore[no-any-return]

    async def settled(self, within_s: float = 60.0) -> dict[str, Any]:
        """Stats once nothing runs, waits or holds working KV (or after ``within_s``)."""
        deadline = time.monotonic() + within_s
        while True:
            stats = await self.stats()
            idle = (stats["requests_running"], stats["requests_waiting"], stats["kv_working_bytes"])
            if idle == (0, 0, 0) or time.monotonic() > deadline:
                return stats
            await asyncio.sleep(0.1)


def parse_sse(text: str) -> list[Any]:
    events: list[Any] = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


def assert_error(status: int, body: Any, expected: int, code: str | None = None) -> dict[str, Any]:
    """An OpenAI-style error: ``{"error": {"message", "type", "param", "code"}}``."""
    assert status == expected, body
    assert isinstance(body, dict), body
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str), error
    assert error["message"], error
    assert isinstance(error["type"], str), error
    assert error["type"], error
    assert "Traceback" not in error["message"], error
    if code is not None:
        assert error["code"] == code, error
    return error  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def tools_server(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    """``tiny-tools`` with an API key and ``--log-prompts``, shared by the API test modules."""
    return server_factory("--model", "tiny-tools", "--log-prompts", api_key=TOOLS_SERVER_KEY)


@pytest.fixture
async def client(server: ServerProcess) -> AsyncIterator[Client]:
    """A client for the module's ``server`` fixture."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        yield Client(server, session)


def raw_http(server: ServerProcess, request: bytes, timeout: float = 30.0) -> bytes:
    """Send ``request`` as is on a new connection; returns everything the server sent back
    until it closed the connection (so send ``Connection: close``)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as sock:
        sock.sendall(request)
        chunks: list[bytes] = []
        while True:
            try:
                data = sock.recv(65536)
            except TimeoutError:
                break
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks)


def split_http_response(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """``(status, headers with lower-case names, body)`` of one raw HTTP/1.1 response."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body
