"""Compile the decode step in the background; serve it once ready, else eager.

Compiling the step of a 30-layer model takes minutes on a small CPU, so it never runs
on the engine's worker: a thread compiles the step for the batch sizes asked for, on a
scratch KV buffer, while requests are served by the eager step. Only when every batch
size is compiled does ``step`` start to answer (before: ``None``, the caller runs the
eager step). Whatever fails (an unsupported model, a corrupt or stale inductor cache, a
missing C++ compiler, a failure inside a compiled step) is logged in one line and the
eager step serves from then on: a request never fails because of the compiler.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from .attention import PrefixPart
from .compiled import CompiledStep, inductor_cache_dir
from .decoder import LeanDecoder
from .kv import KVBuffer, KVLayout

_LOGGER = logging.getLogger(__name__)


class CompileMode(enum.StrEnum):
    """Whether the decode step is compiled (``--compile``)."""

    AUTO = "auto"  # where it measured faster: bfloat16 on a CPU
    ON = "on"  # whenever the lean forward runs
    OFF = "off"


class CompileState(enum.StrEnum):
    """Where the compiled step stands (reported in ``/v1/stats``)."""

    OFF = "off"
    COMPILING = "compiling"
    ACTIVE = "active"
    FAILED = "failed"


def wants_compile(mode: CompileMode, layout: KVLayout) -> bool:
    """Whether ``mode`` compiles the step of a model with this KV layout."""
    if mode == CompileMode.AUTO:
        return layout.device.type == "cpu" and layout.dtype == torch.bfloat16
    return mode == CompileMode.ON


def _one_line(err: BaseException) -> str:
    text = str(err).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(err).__name__}: {first[:200]}" if first else type(err).__name__


class StepCompiler:
    """The compiled one-token step of ``decoder``, compiled by a background thread."""

    def __init__(
        self,
        decoder: LeanDecoder,
        layout: KVLayout,
        batches: Sequence[int] = (1,),
        cache_root: Path | None = None,
    ) -> None:
        self.decoder = decoder
        self.layout = layout
        self.batches = tuple(sorted(set(batches)))
        self.cache_root = cache_root
        self._step: CompiledStep | None = None
        self.state = CompileState.OFF
        self.compile_s: float | None = None
        self.error: str | None = None
        self._thread: threading.Thread | None = None
        # The thread count the step is compiled for (dynamo guards on it; a new thread
        # starts with OpenMP's default, not the count the engine set).
        self.threads = torch.get_num_threads()

    def start(self) -> None:
        """Start compiling in the background (once)."""
        if self.state != CompileState.OFF:
            return
        self.state = CompileState.COMPILING
        self.threads = torch.get_num_threads()
        try:  # here, not on the thread: it readies the decoder's weights for freezing
            step = CompiledStep(self.decoder)
        except Exception as err:  # noqa: BLE001 - any compiler failure: log it, serve eager
            self._fail(f"compiling the decode step failed ({_one_line(err)})")
            return
        self._thread = threading.Thread(
            target=self._compile, args=(step,), name="hearth-compile", daemon=True
        )
        self._thread.start()

    def wait(self, timeout: float | None = None) -> CompileState:
        """Block until the background compile ended (tests, benchmarks); its state."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self.state

    def _compile(self, step: CompiledStep) -> None:
        started = time.monotonic()
        torch.set_num_threads(self.threads)
        try:
            cache = inductor_cache_dir(self.cache_root)
            with torch._inductor.config.patch(compile_threads=1):
                for batch in self.batches:
                    self._warm_up(step, batch)
        except Exception as err:  # noqa: BLE001 - any compiler failure: log it, serve eager
            self._fail(f"compiling the decode step failed ({_one_line(err)})")
            return
        self.compile_s = time.monotonic() - started
        self._step = step
        self.state = CompileState.ACTIVE
        _LOGGER.info(
            "Compiled the decode step (batch %s) in %.1f s (inductor cache %s)",
            ", ".join(map(str, self.batches)),
            self.compile_s,
            cache,
        )

    def _warm_up(self, step: CompiledStep, batch: int) -> None:
        """Compile for ``batch`` rows: one step on a scratch buffer.

        The inputs are made as ``ModelRunner.decode`` makes them (outside inference
        mode): dynamo guards on that too.
        """
        buffer = KVBuffer(self.layout, batch, 2)
        ids = torch.zeros(batch, 1, dtype=torch.long, device=self.layout.device)
        positions = torch.zeros_like(ids)
        with torch.inference_mode():
            step(ids, positions, buffer, None)

    def _fail(self, message: str) -> None:
        self.error = message
        self.state = CompileState.FAILED
        self._step = None
        _LOGGER.warning("%s: serving the eager step", message)

    def step(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        cache: KVBuffer,
        attention_mask: torch.Tensor | None,
        parts: Sequence[PrefixPart] = (),
    ) -> torch.Tensor | None:
        """Logits of one compiled step, or ``None``: run the eager one (not compiled for
        this batch size, not ready yet, or failed; the cache is then as before)."""
        step = self._step
        if step is None or ids.shape[0] not in self.batches or ids.shape[1] != 1:
            return None
        if torch.get_num_threads() != self.threads:
            return None  # compiled for another thread count: a recompile, not served
        if cache.length >= cache.capacity:
            return None  # the eager step raises the overflow, not a compiler failure
        past = cache.length
        try:
            return step.run(ids, positions, cache, attention_mask, parts)
        except Exception as err:  # noqa: BLE001 - a failed compiled step: eager from now on
            cache.set_length(past)  # the eager step rewrites the same columns
            self._fail(f"the compiled decode step failed ({_one_line(err)})")
            return None
