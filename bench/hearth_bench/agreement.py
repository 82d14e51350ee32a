"""``scripts/bench agreement``: does a cache hit change what the model says?

For each of ``--prompts`` prompts (natural-ish text from the engine's synthetic corpus,
a random length and a random split point), three greedy continuations of ``--tokens``:

* **cold**: no cache, the whole prompt prefilled in chunks of ``--chunk-tokens``;
* **cold-other**: no cache, prefilled in chunks of ``--other-chunk-tokens``. Only the
  rounding differs from *cold*: this is the dtype's own noise;
* **cached**: the prompt's head (up to the split point) pinned first, so the request
  reads it from the cache (in place, when the model passed the self-test) and prefills
  only the rest.

In float32/float64 all three should agree; in bfloat16 rounding flips some greedy
choices, and the bar is that *cached* agrees with *cold* at least as well as
*cold-other* does.

``--quantize int8`` and ``--forward`` choose how the model runs (all three engines);
``--against FORWARD:QUANTIZE`` (e.g. ``auto:none``) adds a fourth continuation, cold
on a second copy of the model run that way: the pair **against_vs_cold** says how far
int8 weights (or transformers' forward against Hearth's) move greedy text, next to
the dtype's own noise.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hearth_engine.config import MIB, CacheMode, EngineConfig
from hearth_engine.model.prepare.corpus import corpus_lines
from hearth_engine.model.runner import ModelRunner
from hearth_engine.serving.engine import Engine
from hearth_engine.serving.sampling import SamplingParams

from .common import print_table, write_json


@dataclass(frozen=True)
class Case:
    prompt: list[int]
    split: int


@dataclass
class Agreement:
    """How far two sets of continuations agree (``other`` judged against ``reference``)."""

    identical: int = 0
    cases: int = 0
    prefix_tokens: int = 0  # equal tokens before the first divergence
    equal_tokens: int = 0  # equal tokens at the same position, overall
    tokens: int = 0  # positions compared (the longer of the two continuations)

    def add(self, reference: Sequence[int], other: Sequence[int]) -> None:
        self.cases += 1
        self.identical += list(reference) == list(other)
        longest = max(len(reference), len(other))
        self.tokens += longest
        common = 0
        for a, b in zip(reference, other, strict=False):
            if a != b:
                break
            common += 1
        self.prefix_tokens += common
        self.equal_tokens += sum(a == b for a, b in zip(reference, other, strict=False))

    def as_dict(self) -> dict[str, Any]:
        tokens = max(1, self.tokens)
        return {
            "cases": self.cases,
            "identical": self.identical,
            "identical_share": self.identical / max(1, self.cases),
            "tokens_before_divergence_share": self.prefix_tokens / tokens,
            "tokens_equal_share": self.equal_tokens / tokens,
        }


def make_cases(
    runner: ModelRunner, n: int, min_tokens: int, max_tokens: int, seed: int
) -> list[Case]:
    """Prompts of corpus lines (shuffled), cut to a random length with a random split."""
    rng = random.Random(seed)
    lines = corpus_lines(seed)
    cases = []
    for _ in range(n):
        length = rng.randint(min_tokens, max_tokens)
        text: list[str] = []
        ids: list[int] = []
        while len(ids) < length:
            text.append(rng.choice(lines))
            ids = runner.tokenizer.encode("\n".join(text), add_special_tokens=False)
        prompt = ids[:length]
        cases.append(Case(prompt, rng.randint(16, length - 8)))
    return cases


async def run(args: argparse.Namespace) -> dict[str, Any]:
    runner = ModelRunner.load(args.model, args.device, args.dtype, args.quantize, args.forward)
    budget = args.kv_cache_mb * MIB

    def engine(on: ModelRunner = runner, **overrides: Any) -> Engine:
        config = EngineConfig(model=args.model, kv_cache_bytes=budget, **overrides)
        started = Engine(config, on)
        started.start()
        return started

    against: Engine | None = None
    if args.against:
        forward, _, quantize = args.against.partition(":")
        second = ModelRunner.load(args.model, args.device, args.dtype, quantize or "none", forward)
        against = engine(second, cache_mode=CacheMode.NONE, chunk_tokens=args.chunk_tokens)

    cold = engine(cache_mode=CacheMode.NONE, chunk_tokens=args.chunk_tokens)
    other = engine(cache_mode=CacheMode.NONE, chunk_tokens=args.other_chunk_tokens)
    cached = engine(chunk_tokens=args.chunk_tokens)
    params = SamplingParams(max_tokens=args.tokens)
    cases = make_cases(runner, args.prompts, args.min_tokens, args.max_tokens, args.seed)
    results = {"cached_vs_cold": Agreement(), "cold_other_vs_cold": Agreement()}
    if against is not None:
        results["against_vs_cold"] = Agreement()
    started = time.monotonic()
    try:
        for n, case in enumerate(cases):
            _, reference, _ = await cold.generate(case.prompt, params)
            _, noise, _ = await other.generate(case.prompt, params)
            await cached.pin("head", case.prompt[: case.split])
            _, hit, fin = await cached.generate(case.prompt, params)
            cached.unpin("head")  # its KV stays cached until evicted
            if fin.stats.cached_tokens < case.split:
                raise RuntimeError(
                    f"prompt {n}: {fin.stats.cached_tokens} cached, not {case.split}"
                )
            results["cached_vs_cold"].add(reference, hit)
            results["cold_other_vs_cold"].add(reference, noise)
            if against is not None:
                _, theirs, _ = await against.generate(case.prompt, params)
                results["against_vs_cold"].add(reference, theirs)
            if (n + 1) % 10 == 0:  # running figures: a long run can be read as it goes
                shares = "; ".join(
                    f"{name} {a.identical}/{a.cases} identical, "
                    f"{100 * a.equal_tokens / max(1, a.tokens):.1f}% tokens equal"
                    for name, a in results.items()
                )
                elapsed = time.monotonic() - started
                print(f"{n + 1}/{len(cases)} prompts, {elapsed:.0f} s: {shares}", flush=True)
    finally:
        for e in (cold, other, cached, against):
            if e is not None:
                e.close()
    return {
        "model": runner.info.name,
        "dtype": runner.info.dtype,
        "quantization": runner.info.quantization,
        "forward": runner.info.forward,
        "against": args.against,
        "read_in_place": cached.kv.share_prefix,
        "prompts": len(cases),
        "tokens": args.tokens,
        "chunk_tokens": args.chunk_tokens,
        "other_chunk_tokens": args.other_chunk_tokens,
        **{name: agreement.as_dict() for name, agreement in results.items()},
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench agreement", description=__doc__)
    parser.add_argument("--model", default="default", help="default, tiny or a folder")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--quantize", default="none", choices=["none", "int8"])
    parser.add_argument("--forward", default="auto", choices=["auto", "lean", "transformers"])
    parser.add_argument(
        "--against", default=None, metavar="FORWARD:QUANTIZE", help="e.g. auto:none"
    )
    parser.add_argument("--prompts", type=int, default=100)
    parser.add_argument("--tokens", type=int, default=32, help="greedy continuation length")
    parser.add_argument("--min-tokens", type=int, default=64, help="shortest prompt")
    parser.add_argument("--max-tokens", type=int, default=600, help="longest prompt")
    parser.add_argument("--chunk-tokens", type=int, default=256)
    parser.add_argument("--other-chunk-tokens", type=int, default=96)
    parser.add_argument("--kv-cache-mb", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    report = asyncio.run(run(args))
    print(
        f"\n{report['model']} {report['dtype']} ({report['forward']} forward, quantize "
        f"{report['quantization']}), {report['prompts']} prompts, "
        f"{report['tokens']} tokens, read in place: {report['read_in_place']}"
    )
    headers = ["pair", "identical", "identical %", "tokens to 1st diff %", "tokens equal %"]
    rows = []
    for name in ("cached_vs_cold", "cold_other_vs_cold", "against_vs_cold"):
        if name not in report:
            continue
        r = report[name]
        rows.append([
            name, f"{r['identical']}/{r['cases']}", 100 * r["identical_share"],
            100 * r["tokens_before_divergence_share"], 100 * r["tokens_equal_share"],
        ])  # fmt: skip
    print_table(headers, rows)
    write_json(args.json, report)
    return 0
