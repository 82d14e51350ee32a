"""``scripts/bench quant``: Hearth and llama.cpp's ``llama-server`` on the same GGUF file.

For each shape (``--shapes``; ``quant_files.SHAPES``) and format (``--formats``:
``Q4_K_M``, ``Q8_0``) the file is made once with llama.cpp's own tools
(``quant_files``), then each engine in turn (Hearth first, then llama-server; one
process at a time, 2 threads each) serves it:

* **512**: a fresh prompt of about 512 tokens (no cache hit), ``--tokens`` generated:
  decode ms/token is (end - first token) / (tokens - 1) as the streaming client sees it;
  prefill tok/s is prompt tokens over the time to the first token (cold);
* **house**: the demo house the plugin pins (``bench/fixtures/household.json``, ~6.3k
  tokens with the default model's tokenizer, which every shape here uses). Hearth pins
  it (its prefill tok/s: the pin's own timing); llama.cpp gets it once cold (its prefill
  tok/s) and keeps it with ``cache_prompt``. Then ``--runs`` satellite requests: warm
  TTFT and decode ms/token at the house context (medians);
* **peak RSS** of the server process (``VmHWM``) after both contexts.

``--json FILE`` writes one row per (shape, format, context) with ``shape``, ``format``,
``context``, ``hearth_ms_per_token``, ``llama_ms_per_token``, ``hearth_peak_rss_mb``,
``llama_peak_rss_mb`` and the prefill and TTFT figures. The machine's load average is
printed with the table: this VM's speed drifts, so only figures of one run compare.

``--kernels`` instead times the linear kernels on the 1.5B and 3B layer shapes
(``quant_kernels.py``); ``--quality`` measures greedy agreement with bf16 and the mean
log-likelihood of a fixed text per format on the default model (``quant_quality.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

from .capture import load_fixture
from .common import median, print_table, write_json
from .household import Reply, put_pin, stream_chat
from .llama_server import LlamaServer
from .quant_files import FORMATS, SHAPES, make_gguf
from .reply import QUESTIONS, request_body, satellite_sample
from .server import EngineProcess

FIELDS = (
    "shape", "format", "context", "hearth_ms_per_token", "llama_ms_per_token",
    "hearth_prefill_tok_s", "llama_prefill_tok_s", "hearth_warm_ttft_ms", "llama_warm_ttft_ms",
    "hearth_peak_rss_mb", "llama_peak_rss_mb",
)  # fmt: skip
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


async def measure(url: str, engine: str, tokens: int, runs: int) -> dict[str, dict[str, Any]]:
    """``{"512": {...}, "house": {...}}`` for the server at ``url``."""
    fixture = load_fixture()
    timeout = aiohttp.ClientTimeout(total=3600)
    out: dict[str, dict[str, Any]] = {}
    # A connection per request: llama-server closes idle keep-alive connections.
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        replies = [
            await _checked(session, url, filler_body(512, 1000 + i, tokens)) for i in range(runs)
        ]
        out["512"] = {
            "context": replies[0].prompt_tokens,
            "ms_per_token": _median([ms_per_token(r) for r in replies]),
            "prefill_tok_s": round(replies[0].prompt_tokens / (replies[0].ttft_ms / 1000), 1),
        }
        agent = fixture.agents[satellite_sample(fixture).agent]
        if engine == "hearth":
            pin = await put_pin(session, url, agent.pin, agent.prefixes[0].body())
            prefill = round(int(pin["tokens"]) / (float(pin["prefill_ms"]) / 1000), 1)
        else:
            cold = await _checked(session, url, request_body(fixture, QUESTIONS[0], 0, 1))
            prefill = round(cold.prompt_tokens / (cold.ttft_ms / 1000), 1)
        house = [
            await _checked(session, url, request_body(fixture, QUESTIONS[0], n, tokens))
            for n in range(1, runs + 1)
        ]
        out["house"] = {
            "context": house[0].prompt_tokens,
            "ms_per_token": _median([ms_per_token(r) for r in house]),
            "prefill_tok_s": prefill,
            "warm_ttft_ms": round(median([r.ttft_ms for r in house]), 1),
        }
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


def run_hearth(path: Path, args: argparse.Namespace, log: Path) -> dict[str, Any]:
    convert_first(path)
    cmd = ["--model", str(path), "--threads", str(args.threads), *args.hearth_args]
    engine = EngineProcess(cmd, log).start(timeout=600)
    try:
        result = asyncio.run(measure(engine.url, "hearth", args.tokens, args.runs))
        return {**result, "rss": peak_rss_mb(engine.pid)}
    finally:
        engine.stop()


def run_llama(path: Path, args: argparse.Namespace, log: Path) -> dict[str, Any]:
    server = LlamaServer(log, model=path, ctx_size=8192, threads=args.threads, chat_template=None)
    server.start()
    try:
        assert server.proc is not None
        result = asyncio.run(measure(server.url, "llama", args.tokens, args.runs))
        return {**result, "rss": peak_rss_mb(server.proc.pid)}
    finally:
        server.stop()


def rows_for(
    shape: str, fmt: str, hearth: dict[str, Any], llama: dict[str, Any]
) -> list[dict[str, Any]]:
    rows = []
    for context in ("512", "house"):
        h, lc = hearth[context], llama[context]
        rows.append({
            "shape": shape, "format": fmt, "context": h["context"],
            "hearth_ms_per_token": h["ms_per_token"], "llama_ms_per_token": lc["ms_per_token"],
            "hearth_prefill_tok_s": h["prefill_tok_s"], "llama_prefill_tok_s": lc["prefill_tok_s"],
            "hearth_warm_ttft_ms": h.get("warm_ttft_ms"),
            "llama_warm_ttft_ms": lc.get("warm_ttft_ms"),
            "hearth_peak_rss_mb": hearth["rss"], "llama_peak_rss_mb": llama["rss"],
            "llama_context": lc["context"],
        })  # fmt: skip
    return rows


def _table(rows: list[dict[str, Any]]) -> None:
    print_table(list(FIELDS), [[row.get(f) for f in FIELDS] for row in rows])


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/bench quant", description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS))
    parser.add_argument("--tokens", type=int, default=32, help="tokens generated per request")
    parser.add_argument("--runs", type=int, default=2, help="requests per context (medians)")
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
        from .quant_kernels import main as kernels_main

        return kernels_main(args)
    if args.quality:
        from .quant_quality import main as quality_main

        return quality_main(args)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="hearth-quant-") as tmp:
        jobs = [(p.stem, "file", p) for p in args.files] or [
            (shape, fmt, None) for shape in args.shapes for fmt in args.formats
        ]
        for shape, fmt, given in jobs:
            path = given or make_gguf(shape, fmt)
            print(f"{shape} {fmt}: {path} ({path.stat().st_size / 2**20:.0f} MiB)", flush=True)
            hearth = run_hearth(path, args, Path(tmp) / f"hearth-{shape}-{fmt}.log")
            llama = run_llama(path, args, Path(tmp) / f"llama-{shape}-{fmt}.log")
            rows += rows_for(shape, fmt, hearth, llama)
            _table(rows[-2:])
    print(f"load average at the end: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    _table(rows)
    if args.json:
        write_json(args.json, rows)
    return 0
