"""``scripts/bench load``: closed-loop load on one engine with the household's prompts.

``--clients`` clients each send a request, wait for its last byte, and send the next,
for ``--seconds`` (requests in flight at the deadline finish). The prompts are the
captured household requests (``bench/fixtures/household.json``); the engine runs
``--cache-mode radix`` with each agent's prefix pinned first, as the plugin does.

Requirements (exit 1 if one fails): no failed request; the engine's peak RSS (sampled
from ``/proc/<pid>/status``) within the KV budget (the engine's default, or
``--kv-cache-mb``: cached prefixes and the working buffers of running requests together) +
model bytes + ``--overhead-mb`` (torch, Python, tokenizer, activations, allocator
slack); after the run no locked cache node and the working KV back to its idle value;
the engine's own peak of cache + working buffers (``kv_peak_bytes``) within the KV
budget. ``--pad-words N`` adds N words no request shares to each prompt, so that prompts
outgrow the budget unless the engine reserves their KV: requests then wait for room or
get a 503, which counts apart from the failures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import struct
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from .client import StatsPoller, get_json, put_pin, stream_chat
from .common import Periodic, percentile, print_table, write_json
from .harness.fixture import FIXTURE, Fixture, FixtureMissingError, load_fixture
from .harness.server import EngineProcess

MIB = 1 << 20
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass
class Sample:
    ttft_ms: float
    total_ms: float
    completion_tokens: int
    prompt_tokens: int
    cached_tokens: int
    error: str | None


@dataclass
class RssSampler(Periodic):
    """Peak VmRSS of a process, sampled from ``/proc/<pid>/status``."""

    pid: int
    interval: float = 0.2
    peak: int = 0
    samples: int = 0

    def read(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    async def tick(self) -> None:
        self.peak = max(self.peak, self.read())
        self.samples += 1


def model_bytes(spec: str, dtype: str) -> int:
    """Parameter bytes of the model as the engine holds it (safetensors headers x dtype)."""
    from hearth_engine.model.loader import resolve_model

    folder = resolve_model(spec)
    params = 0
    for path in sorted(folder.glob("*.safetensors")):
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        for name, entry in header.items():
            if name != "__metadata__":
                count = 1
                for dim in entry["shape"]:
                    count *= int(dim)
                params += count
    return params * DTYPE_BYTES.get(dtype.removeprefix("torch."), 4)


async def client(
    session: aiohttp.ClientSession,
    url: str,
    bodies: list[dict[str, Any]],
    rng: random.Random,
    deadline: float,
    out: list[Sample],
    pad_words: int = 0,
) -> None:
    while time.monotonic() < deadline:
        reply = await stream_chat(session, url, padded(rng.choice(bodies), pad_words, rng))
        out.append(
            Sample(
                reply.ttft_ms,
                reply.total_ms,
                int(reply.usage.get("completion_tokens", 0)),
                reply.prompt_tokens,
                reply.cached_tokens,
                reply.error,
            )
        )


async def wait_idle(session: aiohttp.ClientSession, url: str, baseline: int) -> dict[str, Any]:
    """Stats once nothing runs and the working KV is back to ``baseline`` (or 30 s passed)."""
    deadline = time.monotonic() + 30
    while True:
        stats = await get_json(session, f"{url}/v1/stats")
        idle = stats["requests_running"] == 0 and stats["requests_waiting"] == 0
        if (idle and stats["kv_working_bytes"] <= baseline) or time.monotonic() > deadline:
            return stats
        await asyncio.sleep(0.5)


def request_bodies(fixture: Fixture, max_tokens: int) -> list[dict[str, Any]]:
    return [{**fixture.body(s), "max_tokens": max_tokens} for s in fixture.samples if s.prefix == 0]


def padded(body: dict[str, Any], words: int, rng: random.Random) -> dict[str, Any]:
    """``body`` with ``words`` random words (no two requests alike) after its last message."""
    if not words:
        return body
    pad = " ".join(f"w{rng.randrange(10**6)}" for _ in range(words))
    messages = [*body["messages"]]
    last = messages[-1]
    messages[-1] = {**last, "content": f"{last.get('content') or ''}\n{pad}"}
    return {**body, "messages": messages}


def overloaded(error: str | None) -> bool:
    """A 503 (the engine's answer when the KV or the queue is full), not a failure."""
    return error is not None and error.startswith("503")


async def run(args: argparse.Namespace, fixture: Fixture, workdir: Path) -> dict[str, Any]:
    engine_args = [
        "--model", args.model, "--cache-mode", "radix",
        "--max-queue", str(max(64, 4 * args.clients)),
    ]  # fmt: skip
    if args.kv_cache_mb is not None:  # else the engine's default (kv_budget.py)
        engine_args += ["--kv-cache-mb", str(args.kv_cache_mb)]
    engine = EngineProcess(engine_args, workdir / "engine-load.log")
    await asyncio.to_thread(engine.start)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800)) as session:
            return await _load(args, fixture, session, engine)
    finally:
        await asyncio.to_thread(engine.stop)


async def _load(
    args: argparse.Namespace,
    fixture: Fixture,
    session: aiohttp.ClientSession,
    engine: EngineProcess,
) -> dict[str, Any]:
    url = engine.url
    bodies = request_bodies(fixture, args.max_tokens)
    warm = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    await stream_chat(session, url, warm)
    for agent in fixture.agents.values():  # pinned as the plugin does, before any request
        await put_pin(session, url, agent.pin, agent.prefixes[0].body())
    before = await get_json(session, f"{url}/v1/stats")
    rss = RssSampler(engine.pid)
    baseline_rss = rss.read()
    rss.start()
    poller = StatsPoller(session, url, interval=0.25).start()
    samples: list[Sample] = []
    started = time.monotonic()
    deadline = started + args.seconds
    try:
        await asyncio.gather(
            *(
                client(
                    session,
                    url,
                    bodies,
                    random.Random(args.seed + n),
                    deadline,
                    samples,
                    args.pad_words,
                )
                for n in range(args.clients)
            )
        )
        duration = time.monotonic() - started
    finally:
        await poller.stop()
        await rss.stop()
    after = await wait_idle(session, url, int(before["kv_working_bytes"]))
    rss_after = rss.read()  # what the engine keeps once idle again (freed buffers it pools)
    result = summarize(args, samples, duration, before, after, poller.peaks, rss, baseline_rss)
    result["rss_after_bytes"] = rss_after
    return result


def summarize(
    args: argparse.Namespace,
    samples: list[Sample],
    duration: float,
    before: dict[str, Any],
    after: dict[str, Any],
    peaks: dict[str, int],
    rss: RssSampler,
    baseline_rss: int,
) -> dict[str, Any]:
    ok = [s for s in samples if s.error is None]
    refused = [s for s in samples if overloaded(s.error)]
    ttft = [s.ttft_ms for s in ok]
    total = [s.total_ms for s in ok]
    weights = model_bytes(args.model, str(after.get("dtype", "float32")))
    budget = int(after["kv_cache_capacity_bytes"])
    overhead = args.overhead_mb * MIB
    bound = budget + weights + overhead
    prompt = sum(s.prompt_tokens for s in ok)
    result: dict[str, Any] = {
        "model": args.model,
        "clients": args.clients,
        "seconds": args.seconds,
        "duration_s": round(duration, 1),
        "requests": len(samples),
        "errors": len(samples) - len(ok) - len(refused),
        "overloaded_503": len(refused),
        "error_examples": sorted({s.error for s in samples if s.error})[:3],
        "requests_per_s": round(len(ok) / duration, 3),
        "ttft_ms": _percentiles(ttft),
        "latency_ms": _percentiles(total),
        "completion_tokens_per_s": round(sum(s.completion_tokens for s in ok) / duration, 2),
        "prompt_tokens_per_s": round(prompt / duration, 1),
        "hit_rate": round(sum(s.cached_tokens for s in ok) / prompt, 4) if prompt else 0.0,
        "rss_baseline_bytes": baseline_rss,
        "rss_peak_bytes": rss.peak,
        "rss_samples": rss.samples,
        "kv_budget_bytes": budget,
        "kv_cache_peak_bytes": peaks["kv_cache_used_bytes"],
        "kv_working_peak_bytes": peaks["kv_working_bytes"],
        "kv_peak_bytes": int(after.get("kv_peak_bytes", 0)),
        "pad_words": args.pad_words,
        "model_bytes": weights,
        "overhead_bytes": overhead,
        "rss_bound_bytes": bound,
        "locked_nodes_after": int(after["kv_cache_locked_nodes"]),
        "working_bytes_before": int(before["kv_working_bytes"]),
        "working_bytes_after": int(after["kv_working_bytes"]),
        "evictions": int(after["kv_cache_evictions_total"]),
    }
    result["checks"] = checks(result)
    return result


def _percentiles(values: list[float]) -> dict[str, float]:
    return {f"p{q}": round(percentile(values, q / 100), 1) for q in (50, 95, 99)}


def checks(r: dict[str, Any]) -> list[dict[str, Any]]:
    mib = MIB
    return [
        {
            "check": (
                f"no failed request ({r['errors']} of {r['requests']};"
                f" {r['overloaded_503']} 503s apart)"
            ),
            "pass": r["errors"] == 0 and r["requests"] > r["overloaded_503"],
        },
        {
            "check": (
                f"engine's peak KV {r['kv_peak_bytes'] / mib:.1f} MiB <= budget"
                f" {r['kv_budget_bytes'] / mib:.0f} MiB"
            ),
            "pass": r["kv_peak_bytes"] <= r["kv_budget_bytes"],
        },
        {
            "check": (
                f"peak RSS {r['rss_peak_bytes'] / mib:.0f} MiB <= KV budget"
                f" {r['kv_budget_bytes'] / mib:.0f} + model {r['model_bytes'] / mib:.0f}"
                f" + overhead {r['overhead_bytes'] / mib:.0f}"
                f" = {r['rss_bound_bytes'] / mib:.0f} MiB"
            ),
            "pass": r["rss_peak_bytes"] <= r["rss_bound_bytes"],
        },
        {
            "check": f"no locked cache node after the run ({r['locked_nodes_after']})",
            "pass": r["locked_nodes_after"] == 0,
        },
        {
            "check": (
                f"working KV back to idle ({r['working_bytes_after']} <="
                f" {r['working_bytes_before']} bytes)"
            ),
            "pass": r["working_bytes_after"] <= r["working_bytes_before"],
        },
    ]


def print_report(r: dict[str, Any]) -> None:
    print_table(
        ["", "p50", "p95", "p99"],
        [
            ["TTFT ms", *r["ttft_ms"].values()],
            ["latency ms", *r["latency_ms"].values()],
        ],
    )
    print()
    mib = MIB
    print(
        f"{r['requests']} requests ({r['errors']} failed) in {r['duration_s']} s from"
        f" {r['clients']} clients: {r['requests_per_s']} req/s,"
        f" {r['completion_tokens_per_s']} generated tok/s, {r['prompt_tokens_per_s']} prompt"
        f" tok/s, hit rate {r['hit_rate']:.2%}"
    )
    print(
        f"RSS {r['rss_baseline_bytes'] / mib:.0f} MiB idle -> {r['rss_peak_bytes'] / mib:.0f}"
        f" MiB peak -> {r['rss_after_bytes'] / mib:.0f} MiB idle after;"
        f" KV cache peak {r['kv_cache_peak_bytes'] / mib:.0f} MiB of"
        f" {r['kv_budget_bytes'] / mib:.0f}; working KV peak"
        f" {r['kv_working_peak_bytes'] / mib:.0f} MiB"
    )
    for check in r["checks"]:
        print(f"{'PASS' if check['pass'] else 'FAIL'}  {check['check']}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench load", description=__doc__)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--model", default="default")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument(
        "--kv-cache-mb", type=int, default=None, help="KV budget (default: the engine's own)"
    )
    parser.add_argument(
        "--pad-words", type=int, default=0, help="unshared words added to every prompt"
    )
    parser.add_argument("--overhead-mb", type=int, default=600, help="torch, Python, slack")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--fixture", type=Path, default=FIXTURE)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--workdir", type=Path, default=None, help="keep the engine log here")
    args = parser.parse_args(argv)
    try:
        fixture = load_fixture(args.fixture)
    except FixtureMissingError as err:
        print(err)
        return 2
    with tempfile.TemporaryDirectory(prefix="hearth-load-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        result = asyncio.run(run(args, fixture, workdir))
    print_report(result)
    write_json(args.json, result)
    return 0 if all(c["pass"] for c in result["checks"]) else 1
