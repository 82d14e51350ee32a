"""``scripts/bench ttft``: cold vs warm time to first token, the physical floor, and restore.

For each model and prefix length, in one run (medians of ``--runs``):

* **cold**: a prompt of ``prefix + suffix`` random tokens that nothing in the cache
  matches, through the engine (chunked prefill, as in production);
* **warm**: the prefix pinned, a new random suffix, through the engine (wall clock from
  submission to the first token, including cache lookup, KV copy and scheduling);
* **floor**: the bare model forward of the same suffix on the same cached KV, with no
  engine around it: what warm TTFT cannot beat;
* **restore**: a restarted engine (same model, same ``--prefix-store``) bringing the pin
  back from disk at start-up.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from hearth_engine.config import MIB
from hearth_engine.serving.engine import Engine

from .common import (
    load_engine,
    median,
    print_table,
    random_tokens,
    resolve_spec,
    token_range,
    ttft_ms,
    write_json,
)


def _floor_ms(engine: Engine, prefix: list[int], suffix: list[int], runs: int) -> float:
    runner = engine.runner
    buffer = runner.new_buffer(1, len(prefix) + len(suffix) + 1)
    times = []
    for _ in range(runs + 1):
        # The prefix's KV (and a hybrid model's state, a sliding model's windows), as a
        # request that copies its prefix gets it.
        engine.kv.copy_cached(buffer, engine.namespace, prefix)
        started = time.perf_counter()
        runner.prefill(buffer, suffix)
        times.append((time.perf_counter() - started) * 1000)
    return median(times[1:])  # the first run touches fresh memory


async def _wait_for_store(engine: Engine, timeout: float = 60) -> None:
    """Until the store has written what was queued so far (the pin's file and manifest)."""
    await asyncio.get_running_loop().run_in_executor(None, engine.pins.flush, timeout)


async def measure(
    engine: Engine, model: str, n: int, suffix_len: int, runs: int, seed: int
) -> dict[str, Any]:
    rng = random.Random(seed + n)
    vocab = token_range(engine)
    cold = []
    for _ in range(runs):
        prompt = random_tokens(rng, n + suffix_len, vocab)
        ms, stats = await ttft_ms(engine, prompt)
        assert stats.cached_tokens == 0
        cold.append(ms)
        await engine.clear_cache()
    prefix = random_tokens(rng, n, vocab)
    await engine.pin("bench", prefix)
    await _wait_for_store(engine)
    warm = []
    for _ in range(runs + 2):
        ms, stats = await ttft_ms(engine, prefix + random_tokens(rng, suffix_len, vocab))
        assert stats.cached_tokens == n
        warm.append(ms)
    floor_suffix = random_tokens(rng, suffix_len, vocab)
    # On the engine's worker, as serving runs: a forward on another thread than the one
    # that runs torch's other work is slower (hardware.on_passing_thread).
    floor = await engine.on_worker(lambda: _floor_ms(engine, prefix, floor_suffix, runs + 2))
    snapshot = engine.kv.snapshot(engine.namespace, prefix)
    restore = []
    for _ in range(runs):
        # A restart: a new engine over the same model and store restores the pin itself.
        restarted = Engine(engine.config, engine.runner)
        started = time.perf_counter()
        restarted.start()
        restore.append((time.perf_counter() - started) * 1000)
        status = restarted.pin_status("bench")
        restarted.close()
        if status is None or not status["restored"]:
            raise RuntimeError("expected the restarted engine to restore the pin from the store")
    engine.unpin("bench")
    await engine.clear_cache()
    row = {
        "model": model,
        "prefix_tokens": n,
        "suffix_tokens": suffix_len,
        "cold_ttft_ms": round(median(cold), 2),
        "warm_ttft_ms": round(median(warm), 2),
        "floor_ms": round(floor, 2),
        "restore_ms": round(median(restore), 2),
        "state_bytes": None if snapshot is None else snapshot.nbytes,
    }
    row["cold_over_warm"] = round(row["cold_ttft_ms"] / row["warm_ttft_ms"], 2)
    row["warm_over_floor"] = round(row["warm_ttft_ms"] / row["floor_ms"], 3)
    row["restore_over_cold"] = round(row["restore_ms"] / row["cold_ttft_ms"], 4)
    return row


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    targets = [(m, None) for m in args.model] + [(None, s) for s in args.shape]
    rows = []
    for model, shape in targets:
        spec = resolve_spec(model, shape)
        label = model or shape or spec
        with tempfile.TemporaryDirectory(prefix="hearth-bench-") as store:
            engine = await asyncio.to_thread(
                load_engine,
                spec,
                device=args.device,
                dtype=args.dtype,
                chunk_tokens=args.chunk_tokens,
                prefix_store=Path(store),
                kv_cache_bytes=args.kv_cache_mb * MIB,
            )
            print(f"# {label}: {engine.info.device} {engine.info.dtype}", flush=True)
            try:
                for n in args.prefix:
                    row = await measure(engine, label, n, args.suffix, args.runs, args.seed)
                    rows.append(row)
                    print(
                        f"  {n:>5} tokens: cold {row['cold_ttft_ms']:.0f} ms, warm "
                        f"{row['warm_ttft_ms']:.1f} ms, floor {row['floor_ms']:.1f} ms, "
                        f"restore {row['restore_ms']:.1f} ms",
                        flush=True,
                    )
            finally:
                await engine.shutdown()
    return rows


HEADERS = [
    "model", "prefix", "cold ms", "warm ms", "floor ms", "restore ms",
    "cold/warm", "warm/floor", "restore/cold",
]  # fmt: skip


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench ttft", description=__doc__)
    parser.add_argument("--model", action="append", default=None, help="default, tiny or a folder")
    parser.add_argument("--shape", action="append", default=None, help="qwen2.5-0.5b, qwen2.5-1.5b")
    parser.add_argument("--prefix", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    parser.add_argument("--suffix", type=int, default=25)
    parser.add_argument("--runs", type=int, default=3, help="runs per median (at least 3)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--chunk-tokens", type=int, default=256)
    parser.add_argument("--kv-cache-mb", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.model is None and args.shape is None:
        args.model, args.shape = ["default"], ["qwen2.5-0.5b"]
    args.model, args.shape = args.model or [], args.shape or []
    args.runs = max(3, args.runs)
    rows = asyncio.run(run(args))
    print()
    print_table(
        HEADERS,
        [
            [r["model"], r["prefix_tokens"], r["cold_ttft_ms"], r["warm_ttft_ms"], r["floor_ms"],
             r["restore_ms"], r["cold_over_warm"], r["warm_over_floor"], r["restore_over_cold"]]
            for r in rows
        ],
    )  # fmt: skip
    write_json(args.json, rows)
    return 0
