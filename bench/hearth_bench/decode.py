"""``scripts/bench decode``: decode ms/token by context, batch, model and dtype; reply ms.

For each model (``--models``: ``default`` is SmolLM2-135M with real weights, a name of
``hearth_engine.model.prepare.shapes`` is that shape with random weights) and dtype
(``--dtypes``), one engine is loaded in process. For each context (``--contexts``):

* the context (random tokens) is pinned once: the engine's chunked prefill, timed by
  the engine, gives **prefill tok/s**; its KV is copied out of the cache;
* for each batch ``B`` (``--batches``) the bare ``runner.decode`` is timed step by step
  (``--steps`` after 2 warm-up steps), each row one token per step:

  - ``ms/tok`` (``ms_per_token_*``): the context copied into each of the ``B`` rows of
    the working buffer (every row reads its own copy, as after a cold prompt);
  - ``shared`` (``shared_ms_per_token_*``): the context read in place as a shared
    prefix part, as the engine serves a pinned prefix (one copy for all rows). Empty
    where the engine does not read prefixes in place for this model and dtype (its
    start-up self-test, ``ModelRunner.shares_prefix``, failed: it copies them instead);

  a step's time is what every stream waits per token; ``tok/s`` is ``B`` rows over
  the median step. Each batch is measured with each ``--attention`` in turn: ``native``
  (Hearth's C++ decode attention, ``native.py``) and ``torch`` (the torch path it
  replaces), side by side in one run;
* ``mask_ms_per_token``: what grammar-constrained decoding adds to a step of ``B`` rows
  (the demo house's tool grammar, see ``mask.py``; the same for every context);
  ``mask_pct`` is that over ``ms/tok`` (the target: at most 10%);
* ``overhead_ms`` (batch-1 rows): the step's per-token framework overhead, measured on
  the model's skeleton (same layers and forward, near-free kernels; see overhead.py);
* at batch 1, one request through the engine (``max_tokens=32`` on the pinned context):
  its mean decode ms per token as the engine measured it (``engine_ms_per_token``).

Then **reply rows** for the ``--reply-models`` (default: ``default``, the one with real
weights; skip with ``--no-reply``), see ``reply.py``: a real server process, the demo
house pinned, TTFT and the time to the 30th token as a streaming client sees it.

A full default run is ~15 minutes on a 2-core CPU; ``--quick`` runs the default model
at 512 and 2,048 tokens, batch 1 and 4.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import random
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hearth_engine.model import native
from hearth_engine.model.attention import PrefixPart
from hearth_engine.model.hardware import cpu_has_native_bf16
from hearth_engine.model.kv import KVBuffer
from hearth_engine.model.runner import ModelRunner
from hearth_engine.serving.engine import Engine
from hearth_engine.serving.sampling import SamplingParams
from hearth_engine.serving.sequence import ErrorEvent, FinishEvent

from .common import (
    load_engine,
    median,
    model_spec,
    percentile,
    print_table,
    random_tokens,
    token_range,
    write_json,
)
from .harness.fixture import FIXTURE, FixtureMissingError, load_fixture
from .mask import MaskBench, house_tools
from .overhead import overhead_ms
from .reply import reply_row

DEFAULT_MODELS = ("default", "qwen2.5-0.5b")
DEFAULT_CONTEXTS = (512, 2048, 5400)
DEFAULT_BATCHES = (1, 4, 8)
QUICK_MODELS = ("default",)
QUICK_CONTEXTS = (512, 2048)
QUICK_BATCHES = (1, 4)
WARMUP_STEPS = 2
ENGINE_TOKENS = 32
REPLY_TOKENS = 30
PIN = "decode-bench"
FIELDS = (
    "kind", "model", "dtype", "forward", "attention", "threads", "context", "batch",
    "ms_per_token_p50", "ms_per_token_p90", "tok_s",
    "shared_ms_per_token_p50", "shared_ms_per_token_p90",
    "engine_ms_per_token", "engine_tokens", "prefill_tok_s", "steps",
    "ttft_ms", "reply_ms", "tokens", "cached_tokens",
    "mask_ms_per_token", "mask_pct", "overhead_ms",
)  # fmt: skip


@dataclass(frozen=True)
class Precision:
    """How a ``--dtypes`` name loads: engine config overrides and ``serve`` arguments."""

    config: dict[str, Any]
    serve_args: tuple[str, ...]


PRECISIONS = {
    "bfloat16": Precision({"dtype": "bfloat16"}, ("--dtype", "bfloat16")),
    "float32": Precision({"dtype": "float32"}, ("--dtype", "float32")),
    # Weight-only int8 linears, bfloat16 activations and KV (``--quantize int8``).
    "int8": Precision(
        {"dtype": "bfloat16", "quantize": "int8"}, ("--dtype", "bfloat16", "--quantize", "int8")
    ),
}


def host_dtypes() -> list[str]:
    """The dtypes this host computes natively: bf16 and int8 (CUDA or a bf16 CPU), fp32."""
    native_bf16 = torch.cuda.is_available() or cpu_has_native_bf16()
    return ["bfloat16", "float32", "int8"] if native_bf16 else ["float32"]


# ------------------------------------------------------------------ measurement


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(
    runner: ModelRunner,
    buffer: KVBuffer,
    start: int,
    steps: int,
    parts: Sequence[PrefixPart],
    rng: random.Random,
) -> list[float]:
    """ms of each of ``steps`` decode steps (after the warm-up ones) over all rows."""
    device = runner.layout.device
    vocab = min(len(runner.tokenizer), runner.info.vocab_size)
    times = []
    for i in range(WARMUP_STEPS + steps):
        ids = random_tokens(rng, buffer.rows, vocab)
        _sync(device)
        started = time.perf_counter()
        runner.decode(buffer, ids, [start + i] * buffer.rows, None, parts)
        _sync(device)
        times.append((time.perf_counter() - started) * 1000)
    return times[WARMUP_STEPS:]


def copied_buffer(runner: ModelRunner, segment: torch.Tensor, rows: int, room: int) -> KVBuffer:
    """``rows`` rows that each hold a copy of the context ``segment`` [L, 2, H, T, D]."""
    tokens = segment.shape[3]
    buffer = runner.new_buffer(rows, tokens + room, length=tokens)
    for row in range(rows):
        buffer.write_segment(row, 0, segment)
    return buffer


def shared_buffer(
    runner: ModelRunner, segment: torch.Tensor, rows: int, room: int, token: int
) -> KVBuffer:
    """``rows`` rows whose own KV is one token after the shared ``segment``.

    As in the engine, a request on a pinned prefix prefills its suffix (here one token)
    into its own buffer and reads the prefix in place.
    """
    first = runner.new_buffer(1, 1)
    runner.prefill(first, [token], [segment])
    buffer = runner.new_buffer(rows, 1 + room, length=1)
    for row in range(rows):
        buffer.data[:, :, row, :, :1] = first.data[:, :, 0, :, :1]
    return buffer


async def pinned_context(engine: Engine, tokens: list[int]) -> tuple[torch.Tensor, float]:
    """Pin ``tokens``; their KV (a contiguous copy) and the engine's prefill tok/s."""
    status = await engine.pin(PIN, tokens)
    if status.state != "ready":
        raise RuntimeError(f"pinning the context failed: {status.error}")
    match = engine.kv.cache.match(engine.namespace, tokens)
    if match.length != len(tokens):
        raise RuntimeError("the pinned context is not in the cache")
    segment = await engine.on_worker(  # torch work on the worker only (see measure_context)
        lambda: torch.cat([payload[:, :, :, :used] for payload, used in match.segments], dim=3)
    )
    if status.prefill_ms <= 0:
        raise RuntimeError("the context was already cached: its prefill was not timed")
    return segment, len(tokens) / (status.prefill_ms / 1000)


async def engine_decode_ms(engine: Engine, prompt: list[int]) -> tuple[float | None, int]:
    """One request through the engine: its mean decode ms per token, and its tokens.

    The engine's own figure (decode time over the steps after the first token): token
    events are no clock, since a token without text (a shape model's ids beyond its
    tokenizer) sends none.
    """
    params = SamplingParams(max_tokens=ENGINE_TOKENS)
    async for event in engine.stream(prompt, params):
        if isinstance(event, ErrorEvent):
            raise RuntimeError(f"engine request failed: {event.message}")
        if isinstance(event, FinishEvent):
            stats = event.stats
            steps = stats.completion_tokens - 1
            return (stats.decode_ms / steps if steps > 0 else None), stats.completion_tokens
    raise RuntimeError("the engine request ended without a finish event")


def full_row(row: dict[str, Any]) -> dict[str, Any]:
    """Every row has every field (``None`` where it does not apply), in one order."""
    return {key: row.get(key) for key in FIELDS}


def _p50_p90(values: Sequence[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return round(median(values), 2), round(percentile(values, 0.9), 2)


@dataclass(frozen=True)
class Plan:
    contexts: tuple[int, ...]
    batches: tuple[int, ...]
    steps: int
    engine_check: bool
    seed: int
    # Decode attention kernels to compare, each batch measured with each in turn:
    # ``native`` (Hearth's C++ kernel, native.py) and ``torch`` (the torch path).
    attentions: tuple[str, ...] = ("native",)


def attention_mode(name: str) -> contextlib.AbstractContextManager[None]:
    """Run the block with the named decode attention (``torch``: native paused)."""
    if name == "torch":
        return native.paused()
    if native.module() is None:
        raise RuntimeError(f"the native decode attention is not loaded: {native.error()}")
    return contextlib.nullcontext()


async def measure_context(
    engine: Engine,
    model: str,
    dtype: str,
    threads: int,
    context: int,
    plan: Plan,
    masks: dict[int, float | None],
) -> list[dict[str, Any]]:
    runner = engine.runner
    rng = random.Random(plan.seed + context)
    vocab = token_range(engine)
    tokens = random_tokens(rng, context, vocab)
    segment, prefill_tok_s = await pinned_context(engine, tokens)
    engine_ms, engine_tokens = None, None
    if plan.engine_check:
        prompt = [*tokens, *random_tokens(rng, 1, vocab)]
        engine_ms, engine_tokens = await engine_decode_ms(engine, prompt)
    engine.unpin(PIN)
    await engine.clear_cache()
    room = WARMUP_STEPS + plan.steps + 1
    rows = []
    for batch, attention in itertools.product(plan.batches, plan.attentions):

        def measure(
            batch: int = batch, attention: str = attention
        ) -> tuple[list[float], list[float]]:
            with attention_mode(attention):
                buffer = copied_buffer(runner, segment, batch, room)
                own = time_steps(runner, buffer, context, plan.steps, (), rng)
                del buffer
                shared: list[float] = []
                if runner.shares_prefix:
                    first = random_tokens(rng, 1, vocab)[0]
                    buffer = shared_buffer(runner, segment, batch, room, first)
                    parts = [PrefixPart(segment)]
                    shared = time_steps(runner, buffer, context + 1, plan.steps, parts, rng)
            return own, shared

        # On the engine's worker, as serving runs (see hardware.on_passing_thread).
        own, shared = await engine.on_worker(measure)
        first = batch == 1 and attention == plan.attentions[0]  # the engine's own request
        p50, p90 = _p50_p90(own)
        shared_p50, shared_p90 = _p50_p90(shared)
        rows.append(full_row({
            "kind": "decode", "model": model, "dtype": dtype, "threads": threads,
            "forward": runner.info.forward, "attention": attention,
            "context": context, "batch": batch,
            "ms_per_token_p50": p50, "ms_per_token_p90": p90,
            "tok_s": round(batch * 1000 / p50, 1) if p50 else None,
            "shared_ms_per_token_p50": shared_p50, "shared_ms_per_token_p90": shared_p90,
            "engine_ms_per_token": round(engine_ms, 2) if engine_ms and first else None,
            "engine_tokens": engine_tokens if first else None,
            "prefill_tok_s": round(prefill_tok_s, 1), "steps": len(own),
            "mask_ms_per_token": masks.get(batch),
            "mask_pct": round(100 * masks[batch] / p50, 2) if masks.get(batch) and p50 else None,
        }))  # fmt: skip
        print(f"  {_brief(rows[-1])}", flush=True)
    return rows


async def measure_model(
    engine: Engine, model: str, dtype: str, threads: int, plan: Plan
) -> list[dict[str, Any]]:
    masks = await engine.on_worker(lambda: mask_costs(engine, plan.batches))
    overhead = {}
    for attention in plan.attentions:
        with attention_mode(attention):
            overhead[attention] = round(
                await engine.on_worker(lambda: overhead_ms(engine.runner)), 2
            )
    print(f"  per-token overhead (the step's skeleton, see overhead.py): {overhead} ms")
    rows = []
    for context in plan.contexts:
        rows += await measure_context(engine, model, dtype, threads, context, plan, masks)
    for row in rows:
        if row["batch"] == 1:
            row["overhead_ms"] = overhead[row["attention"]]
    return rows


def mask_costs(engine: Engine, batches: Sequence[int]) -> dict[int, float | None]:
    """Per batch size, the median ms the house grammar's masks add to a decode step
    (empty without llguidance or the household fixture)."""
    try:
        bench = MaskBench(engine, house_tools())
    except (ImportError, FileNotFoundError) as err:
        print(f"  (no mask rows: {err})", flush=True)
        return {}
    costs: dict[int, float | None] = {b: bench.step_ms(b) for b in batches}
    print(
        f"  house grammar: tokenizer trie {bench.trie_ms:.0f} ms (once), compile"
        f" {bench.compile_ms:.0f} ms (once per tool set); mask ms by batch {costs}",
        flush=True,
    )
    return costs


def decode_rows(
    model: str, dtype: str, threads: int, plan: Plan, forward: str = "auto"
) -> list[dict[str, Any]]:
    """All decode rows of one model in one dtype (one engine, closed afterwards)."""
    needed = max(plan.contexts) + ENGINE_TOKENS + 2
    engine = load_engine(
        model_spec(model), threads=threads, max_running=max(plan.batches), forward=forward,
        **PRECISIONS[dtype].config,
    )  # fmt: skip
    try:
        engine.check_context(needed, 0)
        return asyncio.run(measure_model(engine, model, dtype, torch.get_num_threads(), plan))
    finally:
        engine.close()
        del engine
        gc.collect()


def _brief(row: dict[str, Any]) -> str:
    keys = ("kind", "model", "dtype", "context", "batch", "ms_per_token_p50", "prefill_tok_s")
    return ", ".join(f"{k}={row.get(k)}" for k in keys)


# ------------------------------------------------------------------ report

TABLE = [
    ("kind", "kind"), ("model", "model"), ("dtype", "dtype"), ("attn", "attention"),
    ("thr", "threads"),
    ("context", "context"), ("batch", "batch"), ("ms/tok p50", "ms_per_token_p50"),
    ("p90", "ms_per_token_p90"), ("tok/s", "tok_s"),
    ("shared p50", "shared_ms_per_token_p50"), ("shared p90", "shared_ms_per_token_p90"),
    ("engine", "engine_ms_per_token"), ("prefill tok/s", "prefill_tok_s"),
    ("TTFT ms", "ttft_ms"), ("reply ms", "reply_ms"), ("tokens", "tokens"),
    ("mask ms", "mask_ms_per_token"), ("mask %", "mask_pct"), ("overhead ms", "overhead_ms"),
]  # fmt: skip


def print_report(rows: Sequence[dict[str, Any]]) -> None:
    cells = [["-" if row.get(key) is None else row[key] for _, key in TABLE] for row in rows]
    print_table([h for h, _ in TABLE], cells)


# ------------------------------------------------------------------ main


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/bench decode",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--models", nargs="+", default=None, metavar="MODEL")
    parser.add_argument("--contexts", nargs="+", type=int, default=None, metavar="TOKENS")
    parser.add_argument("--batches", nargs="+", type=int, default=None, metavar="B")
    parser.add_argument(
        "--dtypes", nargs="+", choices=list(PRECISIONS), default=None, metavar="DTYPE",
        help=f"of {', '.join(PRECISIONS)} (default: what the host computes natively)",
    )  # fmt: skip
    parser.add_argument(
        "--threads", nargs="+", type=int, default=None, metavar="N",
        help="thread counts to measure, each in turn (default: the engine's default)",
    )  # fmt: skip
    parser.add_argument(
        "--forward", default="auto", choices=["auto", "lean", "transformers"],
        help="the engine's forward pass (transformers: the one before the lean forward)",
    )  # fmt: skip
    parser.add_argument(
        "--attention", nargs="+", default=["native", "torch"], choices=["native", "torch"],
        help="decode attention kernels, each batch measured with each (default: both)",
    )  # fmt: skip
    parser.add_argument("--steps", type=int, default=16, help="timed decode steps (>= 16)")
    parser.add_argument("--quick", action="store_true", help="default model, 512/2048, B 1/4")
    parser.add_argument(
        "--no-engine-check", action="store_true", help="skip the batch-1 engine request"
    )
    parser.add_argument("--no-reply", action="store_true", help="skip the HTTP reply rows")
    parser.add_argument(
        "--reply-models", nargs="+", default=["default"], metavar="MODEL",
        help="the models (of --models) that also get reply rows (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument("--reply-runs", type=int, default=5)
    parser.add_argument("--reply-tokens", type=int, default=REPLY_TOKENS)
    parser.add_argument("--fixture", type=Path, default=FIXTURE)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.steps < 16:
        parser.error("--steps must be at least 16 (medians and p90 need them)")
    quick = args.quick
    args.models = args.models or list(QUICK_MODELS if quick else DEFAULT_MODELS)
    args.contexts = args.contexts or list(QUICK_CONTEXTS if quick else DEFAULT_CONTEXTS)
    args.batches = args.batches or list(QUICK_BATCHES if quick else DEFAULT_BATCHES)
    args.dtypes = args.dtypes or host_dtypes()
    if min(args.contexts) < 1 or min(args.batches) < 1:
        parser.error("--contexts and --batches must be positive")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    thread_counts = args.threads or [torch.get_num_threads()]
    plan = Plan(
        tuple(args.contexts),
        tuple(args.batches),
        args.steps,
        not args.no_engine_check,
        args.seed,
        tuple(args.attention),
    )
    fixture = None
    if not args.no_reply:
        try:
            fixture = load_fixture(args.fixture)
        except FixtureMissingError as err:
            print(err)
            return 2
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="hearth-decode-") as workdir:
        for model, dtype, threads in itertools.product(args.models, args.dtypes, thread_counts):
            print(f"# {model} {dtype}, {threads} threads, {args.forward} forward", flush=True)
            rows += decode_rows(model, dtype, threads, plan, args.forward)
            if fixture is not None and model in args.reply_models:
                log = Path(workdir) / f"engine-{model}-{dtype}.log"
                rows.append(
                    full_row(reply_row(
                        model, model_spec(model), dtype,
                        (*PRECISIONS[dtype].serve_args, "--forward", args.forward),
                        threads, fixture, args.reply_tokens, args.reply_runs, log,
                    ))
                )  # fmt: skip
                print(f"  {_brief(rows[-1])}", flush=True)
    print()
    print_report(rows)
    print(f"\n{len(rows)} rows in {time.monotonic() - started:.0f} s")
    write_json(args.json, rows)
    return 0
