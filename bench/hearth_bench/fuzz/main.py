"""``scripts/bench fuzz``: generated bad (and good) requests against a real engine server.

Every case comes from a seeded generator, so a failing case is reproducible from
``--seed`` and its index. Required outcome: no 5xx other than 503 (overload), no request
hanging past ``--timeout``, the server healthy afterwards, and the KV accounting back to
its baseline (no locked nodes, no working buffers; after clearing the unpinned cache the
bytes used equal the pinned bytes).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from ..harness.server import EngineProcess
from .base import WEIRD_TEXT, Case, odd_text, to_json, valid_chat
from .hostile import HOSTILE


def _deep_json(depth: int) -> str:
    """A JSON schema nested ``depth`` levels, as text (too deep for json.dumps)."""
    return '{"type": "object", "properties": {"x": ' * depth + '"leaf"' + "}}" * depth


def gen_malformed_json(rng: random.Random) -> Case:
    good = to_json(valid_chat(rng))
    choice = rng.randrange(7)
    bodies = [
        good[: rng.randrange(1, max(2, len(good)))],
        bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))),
        b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}',
        b"[" * 100_000 + b"]" * 100_000,
        b"",
        b"\xff\xfe\x00{",
        b'{"messages": "' + b"\xc3\x28" + b'"}',
    ]
    return Case("malformed_json", body=bodies[choice])


def gen_wrong_types(rng: random.Random) -> Case:
    body = valid_chat(rng)
    field_, value = rng.choice(
        [
            ("messages", {"role": "user"}),
            ("messages", "hello"),
            ("messages", []),
            ("messages", [42]),
            ("messages", [{"role": 1, "content": "x"}]),
            ("messages", [{"role": "user", "content": 12}]),
            ("messages", [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]),
            ("temperature", "hot"),
            ("max_tokens", "10"),
            ("max_tokens", True),
            ("stream", "yes"),
            ("top_p", [1]),
            ("seed", 1.5),
            ("stop", 5),
            ("stop", ["a", "b", "c", "d", "e"]),
            ("tools", {"type": "function"}),
            ("tool_choice", "sometimes"),
            ("n", 3),
            ("stream_options", "all"),
        ]
    )
    body[field_] = value
    return Case("wrong_types", body=to_json(body))


def gen_numbers(rng: random.Random) -> Case:
    body = valid_chat(rng)
    field_, value = rng.choice(
        [
            ("max_tokens", 10**18),
            ("max_tokens", -1),
            ("max_tokens", 0),
            ("max_completion_tokens", 2**63),
            ("temperature", 1e308),
            ("temperature", -0.5),
            ("top_p", -0.5),
            ("top_p", 0),
            ("seed", 2**70),
            ("seed", -(2**70)),
            ("max_tokens", 10**400),
        ]
    )
    body[field_] = value
    return Case("numbers", body=to_json(body))


def gen_unicode(rng: random.Random) -> Case:
    body = valid_chat(rng)
    body["messages"].append(
        {"role": "user", "content": "".join(rng.choice(WEIRD_TEXT) for _ in range(3))}
    )
    raw = to_json(body)
    if rng.random() < 0.3:  # a lone surrogate, escaped: valid JSON, invalid Unicode
        raw = raw.replace(b'"messages"', b'"lone": "\\ud800", "messages"', 1)
    return Case("unicode", body=raw)


def gen_sizes(rng: random.Random) -> Case:
    choice = rng.randrange(4)
    if choice == 0:
        body = {"messages": [{"role": "user", "content": ""}], "max_tokens": 2}
    elif choice == 1:
        body = {"messages": [{"role": "user", "content": "x" * (2 << 20)}]}  # over --max-body-kb
    elif choice == 2:
        body = {
            "messages": [{"role": "user", "content": "hi"}] * rng.randint(200, 800),
            "max_tokens": 2,
        }
    else:
        body = {
            "messages": [{"role": rng.choice(["robot", "", "USER", "function"]), "content": "x"}]
        }
    return Case("sizes_roles", body=to_json(body))


def gen_tools(rng: random.Random) -> Case:
    body = valid_chat(rng)
    choice = rng.randrange(6)
    if choice == 0:
        body["tools"] = [{"type": "function"}]
    elif choice == 1:
        body["tools"] = [{"type": "function", "function": {"name": "bad name with spaces"}}]
    elif choice == 2:
        body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": []}}]
    elif choice == 3:
        body["tools"] = [{"type": "function", "function": {"name": "deep", "parameters": "@DEEP@"}}]
        deep = _deep_json(rng.choice([10, 70, 500])).encode()
        return Case("tools", body=to_json(body).replace(b'"@DEEP@"', deep))
    elif choice == 4:
        body["tools"] = [
            {"type": "function", "function": {"name": f"t{i}", "parameters": {"type": "object"}}}
            for i in range(rng.randint(1, 40))
        ]
        body["tool_choice"] = rng.choice(
            [
                "auto",
                "none",
                "required",
                {"type": "function", "function": {"name": "t0"}},
                {"type": "function", "function": {"name": "missing"}},
            ]
        )
    else:
        body["tools"] = [{"type": "retrieval"}]
    return Case("tools", body=to_json(body))


def gen_dangling_tool_calls(rng: random.Random) -> Case:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "turn on the kitchen light"}]
    choice = rng.randrange(4)
    if choice == 0:
        messages.append({"role": "tool", "tool_call_id": "call_nothing", "content": "{}"})
    elif choice == 1:
        messages.append(
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "a",
                        "type": "function",
                        "function": {"name": "x", "arguments": "{not json"},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": "a", "content": "ok"})
    elif choice == 2:
        messages.append(
            {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "x"}}]}
        )
    else:
        messages.append({"role": "tool", "content": "no id at all"})
    return Case("tool_calls", body=to_json({"messages": messages, "max_tokens": 3}))


def gen_context(rng: random.Random) -> Case:
    if rng.random() < 0.5:
        words = " ".join(["hello"] * rng.randint(40_000, 60_000))  # over the 32k context
        return Case(
            "context",
            body=to_json({"messages": [{"role": "user", "content": words}], "max_tokens": 1}),
        )
    body = valid_chat(rng)
    body["max_tokens"] = rng.choice([32_768, 40_000, 10**9])
    return Case("context", body=to_json(body))


def gen_pin_names(rng: random.Random) -> Case:
    name = rng.choice(
        [
            "..%2F..%2Fetc%2Fpasswd",
            "%2e%2e",
            "..",
            ".hidden",
            "a" * 300,
            "名前",
            "ok-name",
            "with%20space",
            "x%00y",
            "safe.name:1",
            "%2Ftmp%2Fx",
        ]
    )
    method = rng.choice(["PUT", "GET", "DELETE"])
    body = (
        to_json({"messages": [{"role": "system", "content": odd_text(rng) or "x"}]})
        if method == "PUT"
        else None
    )
    return Case("pin_names", method=method, path=f"/v1/prefixes/{name}", body=body)


def gen_stream_disconnect(rng: random.Random) -> Case:
    body = valid_chat(rng)
    body.update(stream=True, max_tokens=rng.randint(5, 40))
    return Case("disconnect", body=to_json(body), disconnect_after=rng.randint(1, 600))


def gen_valid(rng: random.Random) -> Case:
    return Case("valid", body=to_json(valid_chat(rng)))


GENERATORS: list[Callable[[random.Random], Case]] = [
    gen_malformed_json,
    gen_wrong_types,
    gen_numbers,
    gen_unicode,
    gen_sizes,
    gen_tools,
    gen_dangling_tool_calls,
    gen_context,
    gen_pin_names,
    gen_stream_disconnect,
    gen_valid,
    *HOSTILE,
]


@dataclass
class Result:
    kind: str
    status: int | str
    problem: str | None = None
    seconds: float = 0.0


def _is_openai_error(raw: bytes) -> bool:
    try:
        error = json.loads(raw)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return (
        isinstance(error, dict)
        and isinstance(error.get("message"), str)
        and bool(error["message"])
        and {"type", "param", "code"} <= set(error)
    )


async def _send(session: aiohttp.ClientSession, url: str, case: Case, timeout: float) -> Result:
    if case.leave_after_s is not None:
        try:  # the request is cancelled (its connection closed) before any answer
            async with asyncio.timeout(case.leave_after_s):
                return await _send_once(session, url, case, timeout)
        except TimeoutError:
            return Result(case.kind, "left")
    result = await _send_once(session, url, case, timeout)
    expected = case.expect is None or result.status in case.expect
    if isinstance(result.status, int) and not expected and result.problem is None:
        result.problem = f"HTTP {result.status}, expected one of {sorted(case.expect)}"
    return result


async def _send_once(
    session: aiohttp.ClientSession, url: str, case: Case, timeout: float
) -> Result:
    headers = {"Content-Type": "application/json", **case.headers}
    started = time.monotonic()
    try:
        async with asyncio.timeout(timeout):
            async with session.request(
                case.method, url + case.path, data=case.body, headers=headers
            ) as resp:
                if case.disconnect_after is not None and resp.status == 200:
                    await resp.content.read(case.disconnect_after)
                    resp.close()  # drop the connection mid-stream
                    return Result(case.kind, "disconnected")
                raw = await resp.read()
                problem = None
                if resp.status >= 400:
                    if not _is_openai_error(raw):
                        problem = f"non-OpenAI error body: {raw[:120]!r}"
                    if resp.status == 503 and "Retry-After" not in resp.headers:
                        problem = "503 without Retry-After"
                if resp.status >= 500 and resp.status != 503:
                    problem = f"HTTP {resp.status}: {raw[:200]!r}"
                if b"Traceback" in raw:
                    problem = "traceback in the response"
                return Result(case.kind, resp.status, problem, time.monotonic() - started)
    except TimeoutError:
        return Result(case.kind, "timeout", f"no answer in {timeout} s")
    except aiohttp.ClientError as err:
        return Result(case.kind, "client_error", f"{type(err).__name__}: {err}")


async def _concurrent_pins(
    session: aiohttp.ClientSession, url: str, rng: random.Random, timeout: float
) -> list[Result]:
    """Pin, unpin and chat on the same name at the same time."""
    name = f"race{rng.randrange(4)}"
    system = {
        "role": "system",
        "content": f"house {rng.randrange(3)} " + "entity " * rng.randint(10, 300),
    }
    cases = []
    for _ in range(rng.randint(3, 8)):
        action = rng.choice(["put", "put", "delete", "chat", "get"])
        if action == "put":
            cases.append(
                Case(
                    "race",
                    "PUT",
                    f"/v1/prefixes/{name}?wait={rng.choice(['true', 'false'])}",
                    to_json({"messages": [system]}),
                )
            )
        elif action == "delete":
            cases.append(Case("race", "DELETE", f"/v1/prefixes/{name}"))
        elif action == "get":
            cases.append(Case("race", "GET", f"/v1/prefixes/{name}"))
        else:
            cases.append(
                Case(
                    "race",
                    body=to_json(
                        {"messages": [system, {"role": "user", "content": "hi"}], "max_tokens": 2}
                    ),
                )
            )
    return list(await asyncio.gather(*(_send(session, url, c, timeout) for c in cases)))


# A voice satellite's reply, streamed beside the fuzz cases: it must finish with the same
# text as when it runs alone, whatever the cases beside it do (greedy, fixed length).
VICTIM = {
    "messages": [{"role": "user", "content": "Tell me about the kitchen lights."}],
    "max_tokens": 48,
    "min_tokens": 48,
    "temperature": 0,
    "stream": True,
}
# No request may wait longer for a grammar compile than twice the engine's compile bound
# (3 s: the whole grammar, then its parts to blame one) and a second of slack. Measured
# by the engine (``grammar_compile_wait_max_ms``), not by the client, whose time also
# counts the queue on a loaded machine.
COMPILE_WAIT_BOUND_MS = 7_000.0


async def _victim(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    """The victim's status and streamed text ("" unless 200)."""
    async with session.post(url + "/v1/chat/completions", json=VICTIM) as resp:
        if resp.status != 200:
            await resp.read()
            return resp.status, ""
        parts: list[str] = []
        async for line in resp.content:
            data = line.decode().strip().removeprefix("data: ")
            if not data or data == "[DONE]":
                continue
            event = json.loads(data)
            if "error" in event:
                return 500, json.dumps(event["error"])
            for choice in event.get("choices") or []:
                parts.append(choice.get("delta", {}).get("content") or "")
        return 200, "".join(parts)


async def _victims(
    session: aiohttp.ClientSession, url: str, alone: str, done: asyncio.Event
) -> collections.Counter[str]:
    """Victim streams back to back until ``done``: counts unchanged, changed, failed ones."""
    outcomes: collections.Counter[str] = collections.Counter()
    while not done.is_set():
        status, text = await _victim(session, url)
        if status == 503:
            outcomes["overloaded"] += 1
            await asyncio.sleep(0.2)
        elif status != 200:
            outcomes[f"failed {status}: {text[:100]}"] += 1
        else:
            outcomes["unchanged" if text == alone else "changed"] += 1
    return outcomes


async def _stats(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(url + "/v1/stats") as resp:
        return dict(await resp.json())


async def _settled(session: aiohttp.ClientSession, url: str, timeout: float = 60) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        stats = await _stats(session, url)
        idle = stats["requests_running"] == 0 and stats["requests_waiting"] == 0
        if idle and stats["kv_working_bytes"] == 0 and stats["kv_cache_locked_nodes"] == 0:
            return stats
        if loop.time() > deadline:
            return stats
        await asyncio.sleep(0.1)


async def fuzz(url: str, n: int, seed: int, concurrency: int, timeout: float) -> dict[str, Any]:
    rng = random.Random(seed)
    results: list[Result] = []
    semaphore = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency * 2, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        alone_status, alone = await _victim(session, url)
        done = asyncio.Event()
        victims = asyncio.create_task(_victims(session, url, alone, done))

        async def one(i: int) -> None:
            case_rng = random.Random(f"{seed}:{i}")
            async with semaphore:
                if case_rng.random() < 0.04:
                    results.extend(await _concurrent_pins(session, url, case_rng, timeout))
                else:
                    results.append(
                        await _send(session, url, case_rng.choice(GENERATORS)(case_rng), timeout)
                    )

        await asyncio.gather(*(one(i) for i in range(n)))
        done.set()
        victim_outcomes = await victims
        async with session.get(url + "/health") as resp:
            healthy = resp.status == 200
        settled = await _settled(session, url)
        async with session.post(url + "/v1/cache/clear") as resp:
            await resp.read()
        after_clear = await _stats(session, url)
    del rng
    by_status = collections.Counter(str(r.status) for r in results)
    by_kind = collections.defaultdict(collections.Counter)
    for r in results:
        by_kind[r.kind][str(r.status)] += 1
    problems = [f"{r.kind}: {r.problem}" for r in results if r.problem]
    schema_s = max((r.seconds for r in results if r.kind == "costly_schema"), default=0.0)
    compile_wait = float(settled.get("grammar_compile_wait_max_ms", 0.0))
    if compile_wait > COMPILE_WAIT_BOUND_MS:
        problems.append(f"a request waited {compile_wait:.0f} ms for a grammar compile")
    if alone_status != 200:
        problems.append(f"the victim alone got HTTP {alone_status}")
    problems += [
        f"victim stream {outcome} ({count}x)"
        for outcome, count in victim_outcomes.items()
        if outcome not in ("unchanged", "overloaded")
    ]
    if not healthy:
        problems.append("server unhealthy after the run")
    for key in ("kv_cache_locked_nodes", "kv_working_bytes", "requests_running"):
        if settled[key] != 0:
            problems.append(f"after the run {key} = {settled[key]}")
    used, pinned = after_clear["kv_cache_used_bytes"], after_clear["kv_cache_pinned_bytes"]
    if used != pinned:
        problems.append(f"bytes used {used} != pinned {pinned} after clearing the cache")
    return {
        "cases": len(results),
        "by_status": dict(sorted(by_status.items())),
        "by_kind": {k: dict(sorted(v.items())) for k, v in sorted(by_kind.items())},
        "problems": problems,
        "victims": dict(victim_outcomes),
        "costly_schema_max_s": round(schema_s, 2),
        "grammar_compile_wait_max_ms": compile_wait,
        "grammar_timeouts": settled.get("grammar_timeouts_total"),
        "healthy": healthy,
        "locked_nodes_after": settled["kv_cache_locked_nodes"],
        "working_bytes_after": settled["kv_working_bytes"],
        "used_bytes_after_clear": after_clear["kv_cache_used_bytes"],
        "pinned_bytes_after_clear": after_clear["kv_cache_pinned_bytes"],
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench fuzz", description=__doc__)
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--url", default=None, help="fuzz a running server instead of starting one")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=120)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hearth-fuzz-") as tmp:
        proc = None
        url = args.url
        if url is None:
            proc = EngineProcess(
                [
                    "--model",
                    args.model,
                    "--prefix-store",
                    f"{tmp}/store",
                    "--max-body-kb",
                    "1024",
                    "--max-queue",
                    "16",
                    # The same text on every host (auto picks bf16 on some, fp32 on others).
                    "--dtype",
                    "float32",
                ],
                Path(tmp) / "engine.log",
            ).start()
            url = proc.url
        try:
            report = asyncio.run(fuzz(url, args.n, args.seed, args.concurrency, args.timeout))
        finally:
            code = proc.stop() if proc else 0
        if proc is not None:
            log = (Path(tmp) / "engine.log").read_text(errors="replace")
            report["engine_exit_code"] = code
            report["engine_tracebacks"] = log.count("Traceback")
            if report["engine_tracebacks"]:
                print(log[-6000:], file=sys.stderr)
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    failed = (
        bool(report["problems"])
        or report.get("engine_exit_code", 0) not in (0, None)
        or bool(report.get("engine_tracebacks"))
    )
    return 1 if failed else 0
