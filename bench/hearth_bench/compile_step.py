"""``scripts/bench compile``: the lean decode step eager against compiled, side by side.

One process loads the model (``--model``, bf16 by default), compiles its one-token step
(``hearth_engine.model.compiled``) and times both on the same KV, interleaved step by step
(eager, compiled, eager, ...), so that the load of a shared 2-core machine hits both
alike. For each context (``--contexts``) the context is a shared prefix part read in
place (as a pinned house is served) and each of ``B`` rows (``--batches``) has one own
token. Rows: median and p90 ms per step, the thread count, the time of the first
compiled call per batch size (its compile: cold, or warm from the inductor cache in
``--cache-dir``) and the memory it added.
``--skeleton`` runs the model's skeleton instead (``overhead.py``): its step time is
the per-token overhead.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import psutil
import torch

from hearth_engine.model.attention import PrefixPart
from hearth_engine.model.compiled import CompiledStep, inductor_cache_dir
from hearth_engine.model.runner import ModelRunner

from .common import median, percentile, print_table, write_json
from .overhead import VOCAB, skeleton

WARMUP = 2
CHUNK = 256


def _context_part(runner: ModelRunner, tokens: list[int]) -> PrefixPart:
    source = runner.new_buffer(1, len(tokens))
    for start in range(0, len(tokens), CHUNK):
        runner.prefill(source, tokens[start : start + CHUNK])
    return PrefixPart(source.read_segment(0, 0, len(tokens)))


def _rows(runner: ModelRunner, part: PrefixPart, token: int, batch: int, room: int) -> Any:
    first = runner.new_buffer(1, 1)
    runner.prefill(first, [token], [part.segment])
    buffer = runner.new_buffer(batch, 1 + room, length=1)
    for row in range(batch):
        buffer.data[:, :, row, :, :1] = first.data[:, :, 0, :, :1]
    return buffer


def side_by_side(
    runner: ModelRunner, step: CompiledStep, context: int, batch: int, steps: int
) -> dict[str, Any]:
    """Eager and compiled ms per step, interleaved, on copies of the same KV."""
    assert runner.lean is not None
    gen = torch.Generator().manual_seed(context)
    vocab = min(VOCAB, runner.info.vocab_size)
    tokens = torch.randint(3, vocab, (context + 1,), generator=gen).tolist()
    part = _context_part(runner, tokens[:context])
    room = WARMUP + steps + 2
    eager_kv = _rows(runner, part, tokens[context], batch, room)
    compiled_kv = _rows(runner, part, tokens[context], batch, room)
    ids = torch.tensor([[tokens[0]]] * batch)
    rss_before = psutil.Process().memory_info().rss
    started = time.perf_counter()
    with torch.inference_mode():
        step(ids, torch.tensor([[context + 1]] * batch), compiled_kv, None, [part])
    compile_s = time.perf_counter() - started
    rss_added = psutil.Process().memory_info().rss - rss_before
    compiled_kv.set_length(1)
    eager, compiled, agree = [], [], True
    with torch.inference_mode():
        for i in range(WARMUP + steps):
            pos = torch.tensor([[context + 1 + i]] * batch)
            t0 = time.perf_counter()
            a = runner.lean.forward(ids, pos, eager_kv, None, [part])
            t1 = time.perf_counter()
            b = step.run(ids, pos, compiled_kv, None, [part])
            t2 = time.perf_counter()
            agree = agree and torch.equal(a.argmax(-1), b.argmax(-1))
            if i >= WARMUP:
                eager.append((t1 - t0) * 1000)
                compiled.append((t2 - t1) * 1000)
    return {
        "model": runner.info.name,
        "dtype": runner.info.dtype,
        "threads": torch.get_num_threads(),
        "context": context,
        "batch": batch,
        "eager_p50": round(median(eager), 2),
        "eager_p90": round(percentile(eager, 0.9), 2),
        "compiled_p50": round(median(compiled), 2),
        "compiled_p90": round(percentile(compiled, 0.9), 2),
        "speedup": round(statistics.median(eager) / statistics.median(compiled), 2),
        "first_call_s": round(compile_s, 1),
        "rss_added_mb": round(rss_added / 2**20),
        "argmax_agree": agree,
        "steps": steps,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench compile", description=__doc__)
    parser.add_argument("--model", default="default")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--contexts", default="512,5400")
    parser.add_argument("--batches", default="1,4")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--skeleton", action="store_true")
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    runner = ModelRunner.load(args.model, dtype=args.dtype, forward="lean")
    if args.skeleton:
        runner = skeleton(runner)
    assert runner.lean is not None
    cache = inductor_cache_dir(args.cache_dir)
    print(f"inductor cache: {cache}", flush=True)
    step = CompiledStep(runner.lean)
    rows = []
    for context in (int(c) for c in args.contexts.split(",")):
        for batch in (int(b) for b in args.batches.split(",")):
            row = side_by_side(runner, step, context, batch, args.steps)
            print(row, flush=True)
            rows.append(row)
    print_table(list(rows[0]), [list(r.values()) for r in rows])
    if args.json:
        write_json(args.json, rows)
    return 0
