"""``scripts/bench faults``: what a real engine process does when things break.

Each scenario runs ``hearth_engine serve`` processes (``--model tiny`` by default) and
prints fault -> outcome:

* **store truncated** / **store corrupted**: a pinned prefix is saved in
  ``--prefix-store``; the engine stops; the file is cut in half (or its header garbled);
  on restart the engine logs it, ignores it, serves, and a re-PUT rebuilds the pin;
* **store read-only**: the store is a read-only tmpfs (needs root to mount): pins work
  from memory, requests are served, warned once (per file kind), not once per pin;
* **tiny KV budget**: ``--kv-cache-mb 1``: distinct prompts evict each other, the pin
  survives and still serves hits, a pin larger than the budget gets ``422 pin_too_large``;
* **kill -9 mid-stream**: the client sees the stream break; a restart on the same store
  restores the pin from disk and the first request reuses at least 99 % of it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from .common import print_table, write_json
from .harness.server import EngineProcess

PIN = "hearth.faults"
ROOMS = ("Kitchen", "Hallway", "Bedroom", "Office", "Garden", "Garage", "Attic", "Cellar")


def house_text(lines: int, salt: str = "") -> str:
    """A house-prompt-like system message (``lines`` entities)."""
    entries = [
        f"- names: {ROOMS[i % len(ROOMS)]} Light {i}{salt}\n  domain: light\n"
        f"  areas: {ROOMS[i % len(ROOMS)]}"
        for i in range(lines)
    ]
    return "You are a voice assistant for Home Assistant.\nStatic Context:\n" + "\n".join(entries)


def pin_body(lines: int = 40, salt: str = "") -> dict[str, Any]:
    return {"messages": [{"role": "system", "content": house_text(lines, salt)}]}


def chat_body(prefix: dict[str, Any], text: str, max_tokens: int = 4) -> dict[str, Any]:
    return {
        "messages": [*prefix["messages"], {"role": "user", "content": text}],
        "max_tokens": max_tokens,
    }


@dataclass
class Outcome:
    fault: str
    expected: str
    observed: str = ""
    ok: bool = False
    skipped: bool = False
    details: dict[str, Any] = field(default_factory=dict)


class Engine:
    """An engine process plus an HTTP session to it."""

    def __init__(self, args: list[str], log: Path, port: int | None = None) -> None:
        self.process = EngineProcess(args, log, port=port)
        self.log = log
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Engine:
        await asyncio.to_thread(self.process.start)
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.session is not None:
            await self.session.close()
        await asyncio.to_thread(self.process.stop)

    @property
    def url(self) -> str:
        return self.process.url

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
        assert self.session is not None
        async with self.session.request(method, f"{self.url}{path}", json=body) as resp:
            return resp.status, dict(await resp.json())

    async def stats(self) -> dict[str, Any]:
        return (await self.call("GET", "/v1/stats"))[1]

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        status, data = await self.call("POST", "/v1/chat/completions", body)
        if status != 200:
            raise RuntimeError(f"chat failed: {status} {data}")
        return data

    def log_lines(self, *needles: str) -> list[str]:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return [line for line in text.splitlines() if any(n in line for n in needles)]


async def wait_until(check: Callable[[], Awaitable[bool]], timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return True
        await asyncio.sleep(0.1)
    return False


def stored_files(store: Path) -> list[Path]:
    return sorted(p for p in store.rglob("*.safetensors") if not p.name.startswith(".tmp"))


async def pinned_and_saved(engine: Engine, store: Path, body: dict[str, Any]) -> dict[str, Any]:
    status, info = await engine.call("PUT", f"/v1/prefixes/{PIN}", body)
    if status != 200:
        raise RuntimeError(f"pin refused: {status} {info}")

    async def saved() -> bool:
        manifests = [p for p in store.glob("*.json") if not p.name.startswith(".tmp")]
        return bool(stored_files(store)) and bool(manifests)

    if not await wait_until(saved, 60):
        raise RuntimeError(f"the pin was not written to {store}")
    return info


# ---------------------------------------------------------------------- scenarios


async def damaged_store(model: str, work: Path, how: str) -> Outcome:
    outcome = Outcome(
        f"store file {how}",
        "restart logs + ignores it, serves; a re-PUT rebuilds the pin",
    )
    store = work / f"store-{how}"
    args = ["--model", model, "--prefix-store", str(store)]
    body = pin_body()
    async with Engine(args, work / f"engine-{how}-1.log") as engine:
        await pinned_and_saved(engine, store, body)
    target = stored_files(store)[0]
    damage(target, how)
    async with Engine(args, work / f"engine-{how}-2.log") as engine:
        status, _ = await engine.call("GET", f"/v1/prefixes/{PIN}")
        ignored = engine.log_lines("Ignoring")
        code, info = await engine.call("PUT", f"/v1/prefixes/{PIN}", body)  # as the plugin
        served = await engine.chat(chat_body(body, "hello"))
        stats = await engine.stats()
        rewritten = await wait_until(lambda: _exists(target), 30)
        outcome.details = {
            "pin_after_restart": status,
            "log": ignored[:2],
            "repin_status": code,
            "repin_restored": info.get("restored"),
            "pin_rebuilds_total": stats["pin_rebuilds_total"],
            "store_rewritten": rewritten,
        }
        outcome.ok = (
            bool(ignored)
            and served["usage"]["completion_tokens"] > 0
            and code == 200
            and info.get("restored") is False
            and stats["pin_rebuilds_total"] >= 1
            and rewritten
        )
        outcome.observed = (
            f"logged ({len(ignored)} line), pin {'absent' if status == 404 else status} after"
            f" restart, served; re-PUT {code} rebuilt ({stats['pin_rebuilds_total']}),"
            f" file {'rewritten' if rewritten else 'NOT rewritten'}"
        )
    return outcome


async def _exists(path: Path) -> bool:
    return path.exists() and path.stat().st_size > 0


def damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    else:  # garble the header (length and JSON): a safetensors reader must refuse it
        path.write_bytes(b"\xff" * 64 + data[64:])


@contextlib.contextmanager
def read_only_tmpfs(path: Path) -> Iterator[Path | None]:
    """A read-only tmpfs at ``path`` (None when mounting is not allowed here)."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1024k", "tmpfs", str(path)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        yield None
        return
    try:
        subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True, capture_output=True)
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


async def read_only_store(model: str, work: Path) -> Outcome:
    outcome = Outcome("store read-only", "keeps serving from memory, warns once (not once per pin)")
    with read_only_tmpfs(work / "store-ro") as store:
        if store is None:
            outcome.observed = "cannot mount a read-only tmpfs here (needs root)"
            outcome.skipped = True
            return outcome
        if _writable(store):
            outcome.observed = "the read-only mount is writable here"
            outcome.skipped = True
            return outcome
        args = ["--model", model, "--prefix-store", str(store)]
        async with Engine(args, work / "engine-ro.log") as engine:
            codes = []
            for n in range(3):  # three different pins: three failed writes
                body = pin_body(salt=f"-{n}")
                code, _ = await engine.call("PUT", f"/v1/prefixes/{PIN}-{n}", body)
                codes.append(code)
            reply = await engine.chat(chat_body(pin_body(salt="-2"), "hello"))
            await asyncio.sleep(1)
            warnings = engine.log_lines("read-only", "cannot write")
            stats = await engine.stats()
        outcome.details = {
            "pin_status": codes,
            "warnings": warnings,
            "cached_tokens": reply["usage"]["prompt_tokens_details"]["cached_tokens"],
            "store_failures_total": stats["store_failures_total"],
        }
        kinds = {re.sub(r"\.tmp-[\w.]+", "", w.split(" WARNING ", 1)[-1]) for w in warnings}
        repeated = len(warnings) - len(kinds)
        outcome.details["repeated_warnings"] = repeated
        outcome.ok = codes == [200, 200, 200] and 1 <= len(warnings) <= 2 and repeated == 0
        outcome.ok = outcome.ok and bool(reply["choices"])
        outcome.observed = (
            f"3 pins {codes}, served (cached {outcome.details['cached_tokens']} tok),"
            f" {len(warnings)} warning line(s), {repeated} repeated"
        )
    return outcome


def _writable(path: Path) -> bool:
    try:
        (path / ".probe").write_text("x")
    except OSError:
        return False
    (path / ".probe").unlink()
    return True


async def tiny_budget(model: str, work: Path, budget_mb: int) -> Outcome:
    outcome = Outcome(
        f"--kv-cache-mb {budget_mb}",
        "evictions happen, the pin survives and hits, an oversized pin gets 422",
    )
    args = ["--model", model, "--kv-cache-mb", str(budget_mb)]
    async with Engine(args, work / "engine-budget.log") as engine:
        first = await engine.stats()
        bpt = int(first["kv_bytes_per_token"])
        capacity = int(first["kv_cache_capacity_bytes"])
        lines = 20
        prefix = pin_body(lines)
        code, info = await engine.call("PUT", f"/v1/prefixes/{PIN}", prefix)
        if code != 200:
            outcome.observed = f"the small pin was refused: {code} {info}"
            return outcome
        pin_tokens = int(info["tokens"])
        others = max(4, 3 * capacity // max(1, pin_tokens * bpt))
        for n in range(min(others, 40)):  # distinct prompts, each cached after it runs
            await engine.chat(chat_body(pin_body(lines, salt=f"/{n}"), "hi", max_tokens=1))
        stats = await engine.stats()
        hit = await engine.chat(chat_body(prefix, "turn on the light"))
        cached = hit["usage"]["prompt_tokens_details"]["cached_tokens"]
        big_lines = 4 * lines * capacity // max(1, pin_tokens * bpt)
        big_code, big = await engine.call("PUT", f"/v1/prefixes/{PIN}-big", pin_body(big_lines))
        status, pin = await engine.call("GET", f"/v1/prefixes/{PIN}")
    message = (big.get("error") or {}).get("message", "")
    outcome.details = {
        "capacity_bytes": capacity,
        "bytes_per_token": bpt,
        "pin_tokens": pin_tokens,
        "evictions": stats["kv_cache_evictions_total"],
        "cached_after": cached,
        "big_pin": big_code,
        "big_pin_error": big.get("error"),
        "pin_state": pin.get("state") if status == 200 else status,
    }
    outcome.ok = (
        stats["kv_cache_evictions_total"] > 0
        and cached >= pin_tokens
        and big_code == 422
        and (big.get("error") or {}).get("code") == "pin_too_large"
        and pin.get("state") == "ready"
    )
    outcome.observed = (
        f"{stats['kv_cache_evictions_total']} evictions, pin {pin.get('state')} and hit"
        f" ({cached}/{pin_tokens} tok), big pin {big_code}: {message[:90]}"
    )
    return outcome


async def kill_mid_stream(model: str, work: Path) -> Outcome:
    outcome = Outcome(
        "kill -9 mid-stream, restart", "stream breaks; pin restored; reuse >= 99% of it"
    )
    store = work / "store-kill"
    args = ["--model", model, "--prefix-store", str(store)]
    body = pin_body()
    engine = Engine(args, work / "engine-kill-1.log")
    async with engine:
        info = await pinned_and_saved(engine, store, body)
        broke = await _stream_then_kill(engine, chat_body(body, "tell me a story", 400))
    async with Engine(args, work / "engine-kill-2.log", port=engine.process.port) as again:
        status, pin = await again.call("GET", f"/v1/prefixes/{PIN}")
        reply = await again.chat(chat_body(body, "hello again"))
        stats = await again.stats()
    cached = reply["usage"]["prompt_tokens_details"]["cached_tokens"]
    tokens = int(info["tokens"])
    outcome.details = {
        "stream": broke,
        "pin_state": pin.get("state") if status == 200 else status,
        "restored": pin.get("restored"),
        "pin_restores_total": stats["pin_restores_total"],
        "cached_tokens": cached,
        "pin_tokens": tokens,
    }
    outcome.ok = (
        broke.startswith("broken")
        and pin.get("restored") is True
        and stats["pin_restores_total"] >= 1
        and cached >= 0.99 * tokens
    )
    outcome.observed = (
        f"client: {broke}; pin {pin.get('state')} restored={pin.get('restored')},"
        f" first request reused {cached}/{tokens} tok ({cached / max(1, tokens):.1%})"
    )
    return outcome


async def _stream_then_kill(engine: Engine, body: dict[str, Any]) -> str:
    """Stream, SIGKILL the engine after the first content chunk; how the stream ended."""
    assert engine.session is not None
    chunks = 0
    try:
        async with engine.session.post(
            f"{engine.url}/v1/chat/completions", json={**body, "stream": True}
        ) as resp:
            async for raw in resp.content:
                if raw.startswith(b"data:") and b'"content"' in raw:
                    chunks += 1
                    if chunks == 1:
                        engine.process.stop(signal.SIGKILL)
                if raw.strip() == b"data: [DONE]":
                    return f"completed after {chunks} chunks (not killed in time)"
    except (aiohttp.ClientError, ConnectionError) as err:
        return f"broken after {chunks} chunks ({type(err).__name__})"
    return f"broken after {chunks} chunks (stream ended without [DONE])"


# ---------------------------------------------------------------------- main


async def run(args: argparse.Namespace, work: Path) -> list[Outcome]:
    scenarios: list[Callable[[], Awaitable[Outcome]]] = [
        lambda: damaged_store(args.model, work, "truncated"),
        lambda: damaged_store(args.model, work, "corrupted"),
        lambda: read_only_store(args.model, work),
        lambda: tiny_budget(args.model, work, args.tiny_kv_mb),
        lambda: kill_mid_stream(args.model, work),
    ]
    outcomes = []
    for scenario in scenarios:
        started = time.monotonic()
        try:
            outcome = await scenario()
        except (RuntimeError, aiohttp.ClientError, OSError, KeyError) as err:
            outcome = Outcome("(scenario)", "", f"ERROR: {type(err).__name__}: {err}")
        outcome.details["seconds"] = round(time.monotonic() - started, 1)
        print(f"  {_verdict(outcome)} {outcome.fault}: {outcome.observed}", flush=True)
        outcomes.append(outcome)
    return outcomes


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench faults", description=__doc__)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--tiny-kv-mb", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--workdir", type=Path, default=None, help="keep logs and stores here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hearth-faults-") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        outcomes = asyncio.run(run(args, work))
    print()
    print_table(
        ["fault", "expected", "observed", "result"],
        [[o.fault, o.expected, o.observed, _verdict(o)] for o in outcomes],
    )
    write_json(args.json, [o.__dict__ for o in outcomes])
    print(json.dumps({"passed": sum(o.ok for o in outcomes), "of": len(outcomes)}))
    return 0 if all(o.ok or o.skipped for o in outcomes) else 1


def _verdict(outcome: Outcome) -> str:
    return "SKIP" if outcome.skipped else "PASS" if outcome.ok else "FAIL"
