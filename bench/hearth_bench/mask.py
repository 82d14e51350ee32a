"""The per-token cost of constrained decoding, for ``scripts/bench decode``.

The demo house's grammar (its captured tools, ``tool_choice`` auto, the house's names as
``hearth.argument_values``) is compiled as the server would; then ``B`` constrained rows
walk a real tool call token by token while the engine's ``Masker`` fills their masks and
applies them to a ``[B, V]`` logits tensor on the model's device, as one decode step does.
The median of those steps is ``mask_ms_per_token``: what constraining adds to a step.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

from hearth_engine.chat.formatter import ChatFormatter
from hearth_engine.constraints.compiler import ConstraintCompiler
from hearth_engine.constraints.grammar import ConstraintRequest
from hearth_engine.constraints.mask import Masker
from hearth_engine.serving.engine import Engine

from .common import median
from .harness.fixture import FIXTURE

HOUSE_NAMES = ["Kitchen Lights", "Living Room Lights", "Front Door", "Garage Door", "Porch Light"]
REPLY = (
    '<tool_call>\n{"name": "intent__HassTurnOn", "arguments": '
    '{"name": "Kitchen Lights", "domain": ["light"]}}\n</tool_call>'
)


def house_tools(path: Path = FIXTURE) -> list[dict[str, Any]]:
    """The demo house's tools as the plugin sent them (first captured prefix)."""
    data = json.loads(path.read_text())
    agent = next(iter(data["agents"].values()))
    tools: list[dict[str, Any]] = agent["prefixes"][0]["tools"]
    return tools


class MaskBench:
    """The house grammar compiled once for one engine's tokenizer."""

    def __init__(self, engine: Engine, tools: list[dict[str, Any]]) -> None:
        formatter = ChatFormatter(engine.runner.tokenizer)
        self.engine = engine
        self.tokenizer = formatter.tokenizer
        self.compiler = ConstraintCompiler(
            formatter.tokenizer,
            engine.info.vocab_size,
            engine.output.stop_token_ids,
            formatter.tool_format,
        )
        self.request = ConstraintRequest(tools=tuple(tools), argument_values={"name": HOUSE_NAMES})
        started = time.perf_counter()
        self.compiler.warm()
        self.trie_ms = (time.perf_counter() - started) * 1000  # once per server
        started = time.perf_counter()
        self.compiler.start(self.request)
        self.compile_ms = (time.perf_counter() - started) * 1000  # once per tool set
        self.reply = formatter.encode(REPLY)

    def step_ms(self, batch: int) -> float:
        """Median ms to fill and apply the masks of ``batch`` constrained rows."""
        device = self.engine.runner.layout.device
        masker = Masker(self.engine.info.vocab_size)
        constraints = [self.compiler.start(self.request) for _ in range(batch)]
        logits = torch.zeros(batch, self.engine.info.vocab_size, device=device)
        times = []
        for token in self.reply:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            started = time.perf_counter()
            masker.apply(logits, constraints)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append((time.perf_counter() - started) * 1000)
            for constraint in constraints:
                if constraint is not None:
                    constraint.advance(token)
        return round(median(times), 3)
