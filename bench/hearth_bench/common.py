"""Helpers shared by the benchmarks: engines, random prompts, timing, tables."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hearth_engine.config import EngineConfig
from hearth_engine.serving.engine import Engine
from hearth_engine.serving.sampling import SamplingParams
from hearth_engine.serving.sequence import TokenEvent

if TYPE_CHECKING:
    from typing import Self


def resolve_spec(model: str | None, shape: str | None) -> str:
    if shape:
        from hearth_engine.model.prepare.shapes import prepare_shape_model

        return str(prepare_shape_model(shape))
    return model or "default"


def model_spec(name: str) -> str:
    """A model name as the engine loads it: a shape name (random weights) becomes its folder.

    ``default``, ``tiny``, ``tiny-tools`` and folders pass through unchanged.
    """
    from hearth_engine.model.prepare.shapes import SHAPES

    return resolve_spec(None, name) if name in SHAPES else name


def load_engine(spec: str, **overrides: Any) -> Engine:
    engine = Engine.load(EngineConfig(model=spec, **overrides))
    engine.start()
    return engine


def random_tokens(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(10, vocab) for _ in range(n)]


def token_range(engine: Engine) -> int:
    """Ids that the tokenizer knows (shape models have a larger model vocab)."""
    return min(len(engine.runner.tokenizer), engine.info.vocab_size)


async def ttft_ms(engine: Engine, prompt: list[int], max_tokens: int = 1) -> tuple[float, Any]:
    """Wall-clock time from submitting ``prompt`` to its first token, and the finish stats."""
    started = time.perf_counter()
    first = None
    stats = None
    async for event in engine.stream(prompt, SamplingParams(max_tokens=max_tokens)):
        if first is None and isinstance(event, TokenEvent):
            first = (time.perf_counter() - started) * 1000
        stats = getattr(event, "stats", stats)
    if first is None:  # the model stopped at once: the finish event is the first output
        first = (time.perf_counter() - started) * 1000
    return first, stats


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return float(ordered[index])


def print_table(headers: list[str], rows: list[list[Any]]) -> None:
    cells = [[str(h) for h in headers]] + [[_fmt(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for n, row in enumerate(cells):
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
        if n == 0:
            print("  ".join("-" * w for w in widths))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.2f}"
    return str(value)


def write_json(path: Path | None, data: Any) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2))
        print(f"wrote {path}")


class Periodic:
    """Runs ``tick`` every ``interval`` seconds in a background task until ``stop``."""

    interval: float = 0.5

    async def tick(self) -> None:
        raise NotImplementedError

    def start(self) -> Self:
        self._task = asyncio.create_task(self._run())
        return self

    async def stop(self) -> None:
        task = getattr(self, "_task", None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await self.tick()
            await asyncio.sleep(self.interval)
