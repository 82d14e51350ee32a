"""``scripts/bench quant``: Hearth and llama.cpp's ``llama-server`` on the same GGUF file.

For each shape (``--shapes``; ``files.SHAPES``) and format (``--formats``:
``Q4_K_M``, ``Q8_0``) the file is made once with llama.cpp's own tools
(``files.py``), then Hearth and llama-server (2 threads each) serve it, both up at
once and measured in turns (the other one paused with SIGSTOP): ``--rounds`` rounds
per context, each round ``--runs`` requests to one server and then the same to the
other, the order reversed every round. This VM's speed drifts by up to 2x within
minutes: taken one server after the other (as before 2026-12-04), the 1.5B's decode
ratio at 512 tokens read 1.17 to 1.46 over six runs of nearly the same code. Each
round's pair is back to back; the ratio reported is the median of the rounds' ratios
(each round's in ``round_ratios``, its ms/token in ``*_rounds_ms``):

* **512**: fresh prompts of about 512 tokens (no cache hit), ``--tokens`` generated:
  decode ms/token is (end - first token) / (tokens - 1) as the streaming client sees it;
  prefill tok/s is prompt tokens over the time to the first token (cold);
* **house**: the demo house the plugin pins (``bench/fixtures/household.json``, ~6.3k
  tokens with the default model's tokenizer, which every shape here uses). Hearth pins
  it (its prefill tok/s: the pin's own timing); llama.cpp gets it once cold (its prefill
  tok/s) and keeps it with ``cache_prompt``. Then satellite requests: warm TTFT and
  decode ms/token at the house context (medians);
* **peak RSS** of each server process (``VmHWM``) after both contexts.

``--json FILE`` writes one row per (shape, format, context) with ``shape``, ``format``,
``context``, ``hearth_ms_per_token``, ``llama_ms_per_token``, ``hearth_peak_rss_mb``,
``llama_peak_rss_mb`` and the prefill and TTFT figures. The machine's load average is
printed with the table: this VM's speed drifts, so only figures of one run compare.

``--kernels`` instead times the linear kernels on the 1.5B and 3B layer shapes
(``kernels.py``); ``--quality`` measures greedy agreement with bf16 and the mean
log-likelihood of a fixed text per format on the default model (``quality.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from ..client import Reply, put_pin, stream_chat
from ..common import median, print_table, write_json
from ..harness.fixture import Fixture, load_fixture
from ..harness.server import EngineProcess
from ..llama_server import LlamaServer
from ..reply import QUESTIONS, request_body, satellite_sample
from .files import FORMATS, SHAPES, make_gguf

FIELDS = (
    "shape", "format", "context", "hearth_ms_per_token", "llama_ms_per_token",
    "hearth_prefill_tok_s", "llama_prefill_tok_s", "hearth_warm_ttft_ms", "llama_warm_ttft_ms",
    "hearth_peak_rss_mb", "llama_peak_rss_mb", "decode_ratio", "round_ratios",
)  # fmt: skip
T = TypeVar("T")
WORDS = ("kitchen", "light", "door", "window", "garden", "lamp", "sensor", "heating", "evening")


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory (``VmHWM``) in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def filler_body(tokens: int, seed: int, max_tokens: int) -> dict[str, Any]:
    """A chat request of about ``tokens`` prompt tokens (random words: no cache hits)."""
    rng = random.Random(seed)
    text = " ".join(rng.choice(WORDS) for _ in range(tokens - 40))
    return {
        "messages": [
            {"role": "system", "content": text},
            {"role": "user", "content": f"Request {seed}. {QUESTIONS[0]}"},
        ],
        "temperature": 0.0,
        "max_tokens": max_tokens,
    }


def ms_per_token(reply: Reply) -> float | None:
    n = int(reply.usage.get("completion_tokens", 0))
    return (reply.total_ms - reply.ttft_ms) / (n - 1) if n > 1 else None


async def _checked(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Reply:
    """A streamed request; llama.cpp keeps the prompt (``cache_prompt``), and neither
    server gets the other's extensions."""
    body = {k: v for k, v in body.items() if k != "hearth"}
    reply = await stream_chat(session, url, {**body, "cache_prompt": True})
    if reply.error is not None:
        raise RuntimeError(f"request failed: {reply.error}")
    return reply


async def _fillers(
    session: aiohttp.ClientSession, url: str, tokens: int, runs: int, first: int, fixture: Fixture
) -> list[Reply]:
    """``runs`` fresh prompts of about 512 tokens (no cache hit), seeds from ``first``
    (``fixture``: as ``_satellites`` takes it; random words need none)."""
    del fixture
    return [
        await _checked(session, url, filler_body(512, 1000 + first + i, tokens))
        for i in range(runs)
    ]


async def _satellites(
    session: aiohttp.ClientSession, url: str, tokens: int, runs: int, first: int, fixture: Fixture
) -> list[Reply]:
    """``runs`` satellite requests on the house (each its own suffix), from ``first``."""
    return [
        await _checked(session, url, request_body(fixture, QUESTIONS[0], first + i, tokens))
        for i in range(runs)
    ]


async def _prime(
    session: aiohttp.ClientSession, url: str, *, engine: str, fixture: Fixture
) -> float:
    """The house into the server's cache; its prefill tok/s. Hearth pins it (the pin's
    own timing); llama.cpp takes it once cold and keeps it (``cache_prompt``)."""
    agent = fixture.agents[satellite_sample(fixture).agent]
    if engine == "hearth":
        pin = await put_pin(session, url, agent.pin, agent.prefixes[0].body())
        return round(int(pin["tokens"]) / (float(pin["prefill_ms"]) / 1000), 1)
    cold = await _checked(session, url, request_body(fixture, QUESTIONS[0], 0, 1))
    return round(cold.prompt_tokens / (cold.ttft_ms / 1000), 1)


@dataclass
class Server:
    """One server under test: its URL and process, which is stopped (SIGSTOP) while the
    other is measured, so that nothing it runs while idle can slow the other down."""

    url: str
    pid: int

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)


async def compare(
    servers: dict[str, Server], tokens: int, runs: int, rounds: int
) -> dict[str, dict[str, Any]]:
    """Both servers, up at once, measured in turns: ``rounds`` rounds per context, the
    order reversed every round (A B, B A, ...), so that both see the same minutes of this
    VM's drifting speed; the one not measured is paused. Each first answers one request
    that is not counted (first-request costs are not decode speed). The 512-token rounds
    come first, then the house is primed on both and its rounds follow (a 512 prompt would
    push it out of llama.cpp's slot). Returns ``{engine: {context: {...}}}`` with each
    round's median ms/token."""
    timeout = aiohttp.ClientTimeout(total=3600)
    # A connection per request: llama-server closes idle keep-alive connections.
    connector = aiohttp.TCPConnector(force_close=True)
    out: dict[str, dict[str, Any]] = {name: {} for name in servers}
    fixture = load_fixture()

    async def alone(name: str, work: Callable[[str], Awaitable[T]]) -> T:
        for other, server in servers.items():
            if other != name:
                server.pause()
        try:
            return await work(servers[name].url)
        finally:
            for other, server in servers.items():
                if other != name:
                    server.resume()

    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        for name in servers:
            await alone(
                name, partial(_fillers, session, tokens=tokens, runs=1, first=0, fixture=fixture)
            )
        for context in ("512", "house"):
            primed = {}
            if context == "house":
                for name in servers:
                    primed[name] = await alone(
                        name, partial(_prime, session, engine=name, fixture=fixture)
                    )
            measure = _fillers if context == "512" else _satellites
            done: dict[str, list[list[Reply]]] = {name: [] for name in servers}
            for r in range(rounds):
                for name in list(servers) if r % 2 == 0 else list(servers)[::-1]:
                    first = 1 + r * runs
                    work = partial(
                        measure, session, tokens=tokens, runs=runs, first=first, fixture=fixture
                    )
                    done[name].append(await alone(name, work))
            for name, per_round in done.items():
                replies = [reply for replies in per_round for reply in replies]
                row: dict[str, Any] = {
                    "context": replies[0].prompt_tokens,
                    "ms_per_token": _median([ms_per_token(x) for x in replies]),
                    "rounds": [_median([ms_per_token(x) for x in rs]) for rs in per_round],
                }
                if context == "512":  # every 512 prompt is cold
                    row["prefill_tok_s"] = round(
                        median([x.prompt_tokens / (x.ttft_ms / 1000) for x in replies]), 1
                    )
                else:
                    row["prefill_tok_s"] = primed[name]
                    row["warm_ttft_ms"] = round(median([x.ttft_ms for x in replies]), 1)
                out[name][context] = row
    return out


def _median(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return round(median(kept), 2) if kept else None


def convert_first(path: Path) -> None:
    """Convert the file into the cache in a process of its own: the server's peak RSS is
    then its serving memory, not the one-time conversion's."""
    code = (
        "import sys; from hearth_engine.model.loader import resolve_model; "
        "resolve_model(sys.argv[1])"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, env=env)


def run_both(path: Path, args: argparse.Namespace, logs: Path) -> dict[str, dict[str, Any]]:
    """Hearth and llama-server on ``path``, both up, measured in turns (``compare``)."""
    convert_first(path)
    cmd = ["--model", str(path), "--threads", str(args.threads), *args.hearth_args]
    engine = EngineProcess(cmd, logs / "hearth.log").start(timeout=600)
    server = LlamaServer(
        logs / "llama.log", model=path, ctx_size=8192, threads=args.threads, chat_template=None
    )
    try:
        server.start()
        assert server.proc is not None
        servers = {
            "hearth": Server(engine.url, engine.pid),
            "llama": Server(server.url, server.proc.pid),
        }
        result = asyncio.run(compare(servers, args.tokens, args.runs, args.rounds))
        result["hearth"]["rss"] = peak_rss_mb(engine.pid)
        result["llama"]["rss"] = peak_rss_mb(server.proc.pid)
        return result
    finally:
        server.stop()
        engine.stop()


def _ratios(h: dict[str, Any], lc: dict[str, Any]) -> list[float | None]:
    """Hearth over llama.cpp, round by round (each pair measured back to back)."""
    return [
        round(a / b, 3) if a is not None and b else None
        for a, b in zip(h["rounds"], lc["rounds"], strict=True)
    ]


def rows_for(shape: str, fmt: str, both: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    hearth, llama = both["hearth"], both["llama"]
    rows = []
    for context in ("512", "house"):
        h, lc = hearth[context], llama[context]
        ratios = _ratios(h, lc)
        rows.append({
            "shape": shape, "format": fmt, "context": h["context"],
            "hearth_ms_per_token": h["ms_per_token"], "llama_ms_per_token": lc["ms_per_token"],
            "hearth_prefill_tok_s": h["prefill_tok_s"], "llama_prefill_tok_s": lc["prefill_tok_s"],
            "hearth_warm_ttft_ms": h.get("warm_ttft_ms"),
            "llama_warm_ttft_ms": lc.get("warm_ttft_ms"),
            "hearth_peak_rss_mb": hearth["rss"], "llama_peak_rss_mb": llama["rss"],
            "llama_context": lc["context"],
            "decode_ratio": _median(list(ratios)), "round_ratios": ratios,
            "hearth_rounds_ms": h["rounds"], "llama_rounds_ms": lc["rounds"],
        })  # fmt: skip
    return rows


def _table(rows: list[dict[str, Any]]) -> None:
    print_table(list(FIELDS), [[row.get(f) for f in FIELDS] for row in rows])


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/bench quant", description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS))
    parser.add_argument("--tokens", type=int, default=32, help="tokens generated per request")
    parser.add_argument("--runs", type=int, default=2, help="requests per round and context")
    parser.add_argument(
        "--rounds", type=int, default=3, help="turns per context, the order reversed each time"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--hearth-args", nargs="*", default=[], help="more engine arguments")
    parser.add_argument(
        "--files", nargs="*", type=Path, default=[], help="GGUF files of your own, instead"
    )
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--kernels", action="store_true", help="time the linear kernels only")
    parser.add_argument(
        "--quality", action="store_true", help="agreement and log-likelihood per format only"
    )
    parser.add_argument(
        "--quality-formats", nargs="+", default=["bf16", "int8", "int4", "Q4_K_M", "Q8_0", "Q4_1"]
    )
    parser.add_argument("--prompts", type=int, default=100, help="--quality: prompts")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.kernels:
        from .kernels import main as kernels_main

        return kernels_main(args)
    if args.quality:
        from .quality import main as quality_main

        return quality_main(args)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="hearth-quant-") as tmp:
        jobs = [(p.stem, "file", p) for p in args.files] or [
            (shape, fmt, None) for shape in args.shapes for fmt in args.formats
        ]
        for shape, fmt, given in jobs:
            path = given or make_gguf(shape, fmt)
            print(f"{shape} {fmt}: {path} ({path.stat().st_size / 2**20:.0f} MiB)", flush=True)
            logs = Path(tmp) / f"{shape}-{fmt}"
            logs.mkdir()
            rows += rows_for(shape, fmt, run_both(path, args, logs))
            _table(rows[-2:])
    print(f"load average at the end: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    _table(rows)
    if args.json:
        write_json(args.json, rows)
    return 0
