"""llama.cpp's real ``llama-server`` (built by ``scripts/setup``) serving the default GGUF.

What the integration relies on when it drives llama.cpp instead of the Hearth engine:
streamed OpenAI chat with usage, cached-token reporting on a shared prefix (both
``usage.prompt_tokens_details.cached_tokens`` and ``timings.cache_n``), OpenAI tool
calls (``--jinja``), the very prompt the engine renders from Hearth's chat template
(``/apply-template``), and the ``/metrics``, ``/props`` and ``/slots`` endpoints. A
missing build fails here with the message naming ``scripts/setup``: never a skip.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from transformers import AutoTokenizer

from hearth_bench import llama_server
from hearth_bench.client import probe_server
from hearth_bench.llama_server import BUILD_WAIT_S, LlamaServer, default_gguf, find_llama_server
from hearth_engine.chat.formatter import ChatFormatter
from hearth_engine.model.prepare.templates import HERMES_CHATML_TEMPLATE
from hearth_engine.model.prepare.tiny import prepare_tiny_model

from .test_tool_signatures import EDGE_TOOL, HA_TOOLS, OPEN_TOOLS, household_tools

# The first test that needs llama-server may wait for scripts/test's background build
# (find_llama_server): its set-up counts toward the test's timeout.
pytestmark = pytest.mark.timeout(BUILD_WAIT_S + 600)

# ~670 tokens of house-like text: long enough that reuse is unmistakable.
HOUSE = "You control a smart home. Devices:\n" + "\n".join(
    f"- light.room_{n}: Room {n} Light (area Floor {n % 3}), state off" for n in range(30)
)
TURN_ON = {
    "type": "function",
    "function": {
        "name": "HassTurnOn",
        "description": "Turns on a device or entity",
        "parameters": {
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "required": ["name"],
        },
    },
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    log = tmp_path_factory.mktemp("llama") / "llama-server.log"
    with LlamaServer(log, ctx_size=4096, parallel=1, threads=2) as proc:
        yield proc


def stream(server: LlamaServer, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The chunks of a streamed chat completion (``data: [DONE]`` dropped)."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    request = urllib.request.Request(
        f"{server.url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    chunks = []
    with urllib.request.urlopen(request, timeout=120) as response:
        for raw in response:
            line = raw.strip()
            if line.startswith(b"data:") and line != b"data: [DONE]":
                chunks.append(json.loads(line[5:]))
    return chunks


def ask(user: str, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "system", "content": HOUSE}, {"role": "user", "content": user}]
    return {"messages": messages, "max_tokens": 4, "temperature": 0.0, **extra}


def test_the_binary_and_the_model_are_found() -> None:
    assert find_llama_server().name == "llama-server"
    assert default_gguf().suffix == ".gguf"


def test_a_streamed_chat_ends_with_usage_and_timings(server: LlamaServer) -> None:
    chunks = stream(server, ask("what is on?", cache_prompt=False))
    text = "".join(
        (c["choices"][0]["delta"].get("content") or "") for c in chunks if c.get("choices")
    )
    assert text
    final = chunks[-1]
    usage = final["usage"]
    assert usage["prompt_tokens"] > 600
    assert 1 <= usage["completion_tokens"] <= 4
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0  # cache_prompt off
    assert final["timings"]["prompt_n"] == usage["prompt_tokens"]


def test_a_shared_prefix_is_reported_as_cached_tokens(server: LlamaServer) -> None:
    first = stream(server, ask("turn on room 1", id_slot=0, cache_prompt=True))[-1]
    second = stream(server, ask("turn off room 2", id_slot=0, cache_prompt=True))[-1]
    prompt = second["usage"]["prompt_tokens"]
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    # The whole house is reused; only the user turn (and the reply slot) is new.
    assert cached >= 0.9 * first["usage"]["prompt_tokens"]
    assert cached < prompt
    assert second["timings"]["cache_n"] == cached
    assert second["timings"]["prompt_n"] == prompt - cached


def test_a_tool_call_comes_back_in_openai_format(server: LlamaServer) -> None:
    body = ask("turn on the room 3 light", tools=[TURN_ON], tool_choice="required")
    chunks = stream(server, {**body, "max_tokens": 128, "parallel_tool_calls": False})
    calls = [
        call
        for c in chunks
        for choice in c.get("choices") or ()
        for call in choice["delta"].get("tool_calls") or ()
    ]
    assert calls
    assert calls[0]["type"] == "function"
    assert calls[0]["id"]
    assert calls[0]["function"]["name"] == "HassTurnOn"
    # Arguments stream in pieces (with parallel calls, the model may add index 1, ...).
    first = "".join(c["function"].get("arguments") or "" for c in calls if c["index"] == 0)
    assert isinstance(json.loads(first)["name"], str)
    reasons = [ch["finish_reason"] for c in chunks for ch in c.get("choices") or ()]
    assert "tool_calls" in reasons


@pytest.mark.parametrize("tools", ["household", "edge"])
def test_llama_cpp_renders_the_prompt_the_engine_renders(server: LlamaServer, tools: str) -> None:
    """The same template, in llama.cpp's Jinja engine: the same bytes for the same tools
    (the compact signatures are the template's own macros), so a house primed on either
    server is the same prompt."""
    offered = household_tools() if tools == "household" else [*HA_TOOLS, EDGE_TOOL, *OPEN_TOOLS]
    messages = [{"role": "system", "content": HOUSE}, {"role": "user", "content": "hi"}]
    request = urllib.request.Request(
        f"{server.url}/apply-template",
        data=json.dumps({"messages": messages, "tools": offered}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        theirs = json.loads(response.read())["prompt"]
    tokenizer = AutoTokenizer.from_pretrained(prepare_tiny_model())
    tokenizer.chat_template = HERMES_CHATML_TEMPLATE
    ours = ChatFormatter(tokenizer).render(messages, offered)
    assert "<tools>\nGetDateTime() - " in ours
    assert theirs == ours


def test_metrics_props_and_slots(server: LlamaServer) -> None:
    stream(server, ask("hello"))
    metrics = server.metrics()
    assert metrics["llamacpp:prompt_tokens_total"] > 0
    assert "llamacpp:prompt_tokens_seconds" in metrics
    props = server.get("/props")
    assert props["total_slots"] == 1
    slots = server.get("/slots")
    assert [slot["id"] for slot in slots] == [0]


def test_the_bench_probe_recognises_llama_cpp(server: LlamaServer) -> None:
    async def probe() -> Any:
        async with aiohttp.ClientSession() as session:
            return await probe_server(session, server.url)

    found = asyncio.run(probe())
    assert found.kind == "llama.cpp"
    assert found.model


def test_a_missing_build_names_scripts_setup(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HEARTH_CACHE_DIR", str(tmp_path))
    with pytest.raises(RuntimeError, match="run scripts/setup"):
        find_llama_server()


def test_the_build_follows_the_cpu_and_never_uses_amx(monkeypatch: pytest.MonkeyPatch) -> None:
    """AMX kernels died with SIGILL on this VM although the CPU lists amx_tile."""
    monkeypatch.setattr(llama_server.platform, "machine", lambda: "x86_64")
    avx2 = "sse4_2 avx avx2 bmi2 fma f16c"
    flags = llama_server.cmake_flags(avx2)
    assert "-DGGML_NATIVE=OFF" in flags
    assert "-DGGML_AVX2=ON" in flags
    assert "-DGGML_AVX512=OFF" in flags
    full = llama_server.cmake_flags(f"{avx2} avx512f avx512cd avx512vl avx512dq avx512bw amx_tile")
    assert "-DGGML_AVX512=ON" in full
    assert {"-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"} <= set(full)
    # Another CPU, another cache folder: a copied cache is rebuilt, never run.
    monkeypatch.setattr(llama_server, "cpu_features", lambda: avx2)
    key = llama_server.build_key("0.3.36")
    monkeypatch.setattr(llama_server, "cpu_features", lambda: f"{avx2} avx512f")
    assert llama_server.build_key("0.3.36") != key


def test_a_build_under_way_is_waited_for(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """scripts/test builds llama-server beside the suites: a test that needs it waits
    while the build's process lives, and gets the binary once it is there."""
    monkeypatch.setenv("HEARTH_CACHE_DIR", str(tmp_path))
    folder = llama_server.build_dir()
    (folder.parent / f"{folder.name}.partial").mkdir(parents=True)
    builder = subprocess.Popen(["sleep", "30"])
    try:
        (folder.parent / f"{folder.name}.partial" / "pid").write_text(str(builder.pid))

        def finish() -> None:
            time.sleep(1.5)
            (folder / "bin").mkdir(parents=True)
            binary = folder / "bin" / "llama-server"
            binary.write_text("#!/bin/sh\n")
            binary.chmod(0o755)

        threading.Thread(target=finish).start()
        started = time.monotonic()
        assert find_llama_server(wait_s=20) == folder / "bin" / "llama-server"
        assert time.monotonic() - started >= 1.0
    finally:
        builder.kill()
        builder.wait()


def build_work_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The ``.partial`` folder of a build of this machine's llama-server, in a new cache."""
    monkeypatch.setenv("HEARTH_CACHE_DIR", str(tmp_path))
    folder = llama_server.build_dir()
    work = folder.parent / f"{folder.name}.partial"
    work.mkdir(parents=True)
    return work


def test_a_failed_build_is_named_not_waited_for(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    work = build_work_folder(monkeypatch, tmp_path)
    dead = subprocess.Popen(["true"])
    dead.wait()
    (work / "pid").write_text(str(dead.pid))
    (work / "build.log").write_text("error: no compiler\n")
    started = time.monotonic()
    with pytest.raises(
        llama_server.LlamaServerMissingError, match=r"build failed: see .*build\.log"
    ):
        find_llama_server(wait_s=60)
    assert time.monotonic() - started < 10


def test_a_build_still_running_at_the_deadline_is_said_to_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Not "failed": the build goes on, and its background log is where to look."""
    work = build_work_folder(monkeypatch, tmp_path)
    builder = subprocess.Popen(["sleep", "30"])
    try:
        (work / "pid").write_text(str(builder.pid))
        with pytest.raises(
            llama_server.LlamaServerMissingError, match=r"still running .*background-build\.log"
        ):
            find_llama_server(wait_s=1)
    finally:
        builder.kill()
        builder.wait()
