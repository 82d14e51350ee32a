"""``scripts/bench models``: one table of the model families people run, on this machine.

For each family of ``families.py`` (random weights in the family's real small shape),
in process, one engine at a time:

* **loads**: whether the engine takes it. A family whose layers the engine refuses
  (``check_layer_types``: linear attention, convolutions, state space) is refused from
  its config alone, before gigabytes of weights are written; its row says why and
  measures nothing else;
* **exact**: the greedy continuation of a prompt, cold (nothing cached) against warm
  (its prefix pinned), token for token, in float32 so that rounding is not taken for a
  cache bug. Exactness is a property of the layer kinds, not of depth or vocabulary, so
  this runs on the family's config at 2 layers (one of each kind first) with the test
  tokenizer's vocabulary. A family with a sliding window gets a prefix of two windows
  and more, so that the window slides inside the pinned prefix;
* **TTFT** cold, warm, floor and store restore at ``--prefix`` tokens (2,048) as
  ``scripts/bench ttft`` measures them (``ttft.measure``);
* **decode ms/token**: the engine's own mean over 32 tokens after that prefix;
* **KV bytes per token** of the prefix cache (K and V of every attention layer, in the
  dtype run). For a sliding-window family a line under the table gives a pin's bytes
  per token at ``--prefix`` tokens, in memory and in the store: its sliding layers keep
  their last window only (the ``state_bytes`` column: that window).
  A hybrid family's state layers keep no KV; instead each pin (and each resumable
  prefix) keeps one state snapshot: ``state_bytes``, whatever the prefix length.

``--quick`` builds every family at 2 layers and times a 256-token prefix (a smoke run,
not figures for the README). A full run builds each family once into the Hearth cache
(tens of GB in all) and takes a long time on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import tempfile
from pathlib import Path
from typing import Any

from hearth_engine.config import MIB
from hearth_engine.model.errors import ModelLoadError
from hearth_engine.model.layer_types import check_layer_types
from hearth_engine.serving.engine import Engine
from hearth_engine.serving.sampling import SamplingParams

from .common import load_engine, print_table, random_tokens, token_range, write_json
from .families import (
    BY_NAME,
    EXACT_VOCAB,
    FAMILIES,
    Family,
    describe,
    family_config,
    prepare_family_model,
    tokenizer,
)
from .ttft import measure

FIELDS = (
    "family", "shape", "loads", "exact", "cold_ttft_ms", "warm_ttft_ms", "floor_ms",
    "cold_over_warm", "decode_ms_per_token", "kv_bytes_per_token", "restore_ms", "reason",
    "state_bytes",
)  # fmt: skip
QUICK_LAYERS = 2
EXACT_LAYERS = 2
EXACT_PREFIX = 300  # more than one 256-token prefill chunk
EXACT_TOKENS = 16
DECODE_TOKENS = 32


def empty_row(family: Family, layers: int) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(FIELDS)
    row.update(family=family.name, shape=describe(family, layers), loads=False)
    return row


def refusal(family: Family, layers: int) -> str | None:
    """The engine's one-line refusal of this family's layers, if it refuses them."""
    try:
        check_layer_types(family_config(family, layers, tokenizer()), Path(family.name))
    except ModelLoadError as err:
        return str(err)
    return None


def exact_prefix(engine: Engine) -> int:
    """Tokens of the exactness prefix: more than two sliding windows where there is one."""
    window = engine.runner.layout.window
    return max(EXACT_PREFIX, 2 * window + 40) if window is not None else EXACT_PREFIX


def stored_bytes_per_token(engine: Engine, prefix: int) -> float:
    """Bytes per token of a pin of ``prefix`` tokens (sliding layers: a window)."""
    return engine.runner.layout.prefix_bytes(prefix) / prefix


async def cached_equals_cold(engine: Engine, seed: int) -> bool:
    """Greedy tokens of prefix + suffix: computed cold, then on the pinned prefix."""
    rng = random.Random(seed)
    vocab = token_range(engine)
    prefix = random_tokens(rng, exact_prefix(engine), vocab)
    prompt = prefix + random_tokens(rng, 20, vocab)
    params = SamplingParams(max_tokens=EXACT_TOKENS, min_tokens=EXACT_TOKENS, temperature=0.0)
    cold_text, cold_ids, cold = await engine.generate(prompt, params)
    await engine.clear_cache()
    await engine.pin("exact", prefix)
    warm_text, warm_ids, warm = await engine.generate(prompt, params)
    if cold.stats.cached_tokens != 0 or warm.stats.cached_tokens != len(prefix):
        raise RuntimeError("the exactness prompts were not served cold and then warm")
    return (cold_text, cold_ids) == (warm_text, warm_ids)


async def decode_ms(engine: Engine, prefix_tokens: int, seed: int) -> float:
    """The engine's mean decode ms per token over ``DECODE_TOKENS`` after the prefix."""
    rng = random.Random(seed + 1)
    prompt = random_tokens(rng, prefix_tokens, token_range(engine))
    params = SamplingParams(max_tokens=DECODE_TOKENS, min_tokens=DECODE_TOKENS)
    _text, _ids, finish = await engine.generate(prompt, params)
    await engine.clear_cache()
    return float(finish.stats.decode_ms / (finish.stats.completion_tokens - 1))


async def run_family(family: Family, args: argparse.Namespace) -> dict[str, Any]:
    layers = QUICK_LAYERS if args.quick else (family.memory_layers or family.layers)
    row = empty_row(family, layers)
    reason = refusal(family, layers)
    if reason is not None:
        row["reason"] = reason
        return row
    exact_folder = prepare_family_model(family, EXACT_LAYERS, vocab=EXACT_VOCAB, dtype="float32")
    folder = prepare_family_model(family, layers)
    try:
        engine = await asyncio.to_thread(
            load_engine, str(exact_folder), dtype="float32", kv_cache_bytes=256 * MIB
        )
    except ModelLoadError as err:
        row["reason"] = str(err)
        return row
    try:
        row["exact"] = await cached_equals_cold(engine, args.seed)
    finally:
        await engine.shutdown()
    with tempfile.TemporaryDirectory(prefix="hearth-bench-models-") as store:
        try:
            engine = await asyncio.to_thread(
                load_engine,
                str(folder),
                device=args.device,
                dtype=args.dtype,
                chunk_tokens=args.chunk_tokens,
                prefix_store=Path(store),
                kv_cache_bytes=args.kv_cache_mb * MIB,
            )
        except ModelLoadError as err:
            row["reason"] = str(err)
            return row
        try:
            row["loads"] = True
            row["kv_bytes_per_token"] = engine.info.bytes_per_token
            if engine.runner.layout.sliding:
                row["stored_bytes_per_token"] = stored_bytes_per_token(engine, args.prefix)
            timed = await measure(
                engine, family.name, args.prefix, args.suffix, args.runs, args.seed
            )
            if engine.kv.snapshots is not None:
                row["state_bytes"] = timed["state_bytes"]
            for key in ("cold_ttft_ms", "warm_ttft_ms", "floor_ms", "cold_over_warm", "restore_ms"):
                row[key] = timed[key]
            row["decode_ms_per_token"] = round(await decode_ms(engine, args.prefix, args.seed), 2)
        finally:
            await engine.shutdown()
            del engine
            gc.collect()
    return row


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for name in args.families:
        row = await run_family(BY_NAME[name], args)
        rows.append(row)
        if row["loads"]:
            print(
                f"# {name}: exact {row['exact']}, cold {row['cold_ttft_ms']:.0f} ms, warm "
                f"{row['warm_ttft_ms']:.1f} ms, decode {row['decode_ms_per_token']:.1f} ms/token",
                flush=True,
            )
        else:
            print(f"# {name}: refused: {row['reason']}", flush=True)
    return rows


HEADERS = [
    "family", "shape", "loads", "exact", "cold ms", "warm ms", "floor ms", "cold/warm",
    "decode ms/tok", "KV B/tok", "restore ms", "state MB/pin",
]  # fmt: skip


def _cells(row: dict[str, Any]) -> list[Any]:
    values = [row[f] for f in FIELDS[:11]]
    state = row["state_bytes"]
    values.append(None if state is None else round(state / MIB, 2))
    return ["-" if v is None else v for v in values]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/bench models", description=__doc__)
    parser.add_argument(
        "--families", nargs="+", choices=list(BY_NAME), default=[f.name for f in FAMILIES]
    )
    parser.add_argument("--quick", action="store_true", help="2 layers, a 256-token prefix")
    parser.add_argument("--prefix", type=int, default=None, help="pinned tokens (2048)")
    parser.add_argument("--suffix", type=int, default=25)
    parser.add_argument("--runs", type=int, default=None, help="runs per median (3; quick 1)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--chunk-tokens", type=int, default=256)
    parser.add_argument("--kv-cache-mb", type=int, default=None, help="4096 (quick 512)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.prefix is None:
        args.prefix = 256 if args.quick else 2048
    if args.runs is None:
        args.runs = 1 if args.quick else 3
    if args.kv_cache_mb is None:
        args.kv_cache_mb = 512 if args.quick else 4096
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    rows = asyncio.run(run(args))
    print()
    print_table(HEADERS, [_cells(r) for r in rows])
    for row in rows:
        if row["reason"]:
            print(f"{row['family']}: {row['reason']}")
        stored = row.pop("stored_bytes_per_token", None)
        if stored is not None:
            print(
                f"{row['family']}: a pin of {args.prefix} tokens holds {stored:.0f} B/token "
                f"in memory and in the store (its sliding layers keep their last window; a "
                f"working buffer holds {row['kv_bytes_per_token']} B/token)"
            )
    write_json(args.json, rows)
    return 0
