"""``scripts/bench concurrency``: aggregate decode throughput of N streams vs one.

Decode on a CPU is bound by reading the weights once per step, so batching N sequences
into one step (continuous batching) should raise the aggregate tokens/s well above a
single stream. Both are measured in one run on the same engine: tokens generated after
the first token, divided by the wall time from the last first-token to the end.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from pathlib import Path
from typing import Any

from hearth_engine.serving.engine import Engine
from hearth_engine.serving.sampling import SamplingParams
from hearth_engine.serving.sequence import TokenEvent

from .common import (
    load_engine,
    median,
    print_table,
    random_tokens,
    resolve_spec,
    token_range,
    write_json,
)


async def _decode_rate(engine: Engine, prompts: list[list[int]], new_tokens: int) -> float:
    """Aggregate decode tokens/s while all ``prompts`` decode together."""
    firsts: list[float] = []
    ends: list[float] = []
    counts: list[int] = []
    params = SamplingParams(max_tokens=new_tokens, stop_token_ids=())

    async def one(prompt: list[int]) -> None:
        n = 0
        async for event in engine.stream(prompt, params):
            if isinstance(event, TokenEvent):
                n += 1
                if n == 1:
                    firsts.append(time.perf_counter())
        ends.append(time.perf_counter())
        counts.append(n)

    await asyncio.gather(*(one(p) for p in prompts))
    start = max(firsts)  # every stream is decoding from here on
    return sum(c - 1 for c in counts) / (max(ends) - start) if max(ends) > start else 0.0


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    spec = resolve_spec(args.model, args.shape)
    engine = await asyncio.to_thread(load_engine, spec, device=args.device, dtype=args.dtype)
    rng = random.Random(args.seed)
    vocab = token_range(engine)
    rows = []
    try:
        await _decode_rate(engine, [random_tokens(rng, args.prompt, vocab)], 8)  # warm-up
        single = median(
            [
                await _decode_rate(engine, [random_tokens(rng, args.prompt, vocab)], args.tokens)
                for _ in range(args.runs)
            ]
        )
        for streams in args.streams:
            rates = [
                await _decode_rate(
                    engine,
                    [random_tokens(rng, args.prompt, vocab) for _ in range(streams)],
                    args.tokens,
                )
                for _ in range(args.runs)
            ]
            rows.append(
                {
                    "model": args.shape or args.model,
                    "streams": streams,
                    "single_tok_s": round(single, 2),
                    "aggregate_tok_s": round(median(rates), 2),
                    "speedup": round(median(rates) / single, 2),
                }
            )
    finally:
        await engine.shutdown()
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench concurrency", description=__doc__)
    parser.add_argument("--model", default="default")
    parser.add_argument("--shape", default=None)
    parser.add_argument("--streams", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--prompt", type=int, default=512, help="prompt tokens per stream")
    parser.add_argument("--tokens", type=int, default=48, help="tokens generated per stream")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    rows = asyncio.run(run(args))
    print_table(
        ["model", "streams", "1 stream tok/s", "aggregate tok/s", "speedup"],
        [
            [r["model"], r["streams"], r["single_tok_s"], r["aggregate_tok_s"], r["speedup"]]
            for r in rows
        ],
    )
    write_json(args.json, rows)
    return 0
