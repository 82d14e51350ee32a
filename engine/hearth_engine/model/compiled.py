"""The lean decode step as one compiled graph (torch.compile, inductor, freezing).

A one-token step of the lean forward is about a thousand small operator calls; on a
CPU their dispatch is a large share of the step. Compiled, the dense parts of all
layers (norms, fused linears, RoPE, MLP) are one C++ function (inductor's
``cpp_wrapper``) with fused elementwise kernels, the weights folded in (``freezing``).
The KV
write and the attention over the working cache and the shared prefix parts stay
Hearth's eager code, behind one opaque custom op per layer (``hearth::decode_attend``):
dynamo does not trace them, so the KV length, the prefix parts and the padding mask
never change the graph, and one graph serves every step of a given batch size.

The custom op gets only the layer's q/k/v; the cache, mask and parts of the step it
belongs to are the ``_CURRENT`` step context, set by ``CompiledStep`` around the
compiled call on the calling thread (an opaque op cannot take Python objects).

Measured (``scripts/bench compile``: SmolLM2-135M, bfloat16, 1 thread, medians of 24
interleaved steps on a 2-core AMX Xeon shared with other jobs), eager -> compiled ms:
512-token prefix 46.7 -> 41.8 (batch 1), 47.4 -> 42.9 (batch 4); 5,400 tokens 68.0 ->
64.2 and 97.1 -> 81.2; the skeleton's step (the per-token overhead) 13.2 -> 11.3. A
compile takes ~90 s cold and ~40 s from the cache (per batch size). What remains of the
overhead is mostly the attention op's own eager calls: ~0.4 ms a layer at a 512-token
prefix, about 40% of it in the CPU flash kernel.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .attention import PrefixPart
from .hardware import host_key
from .kv import KVBuffer

if TYPE_CHECKING:
    from .decoder import LeanDecoder


@dataclass
class _StepContext:
    decoder: LeanDecoder
    cache: KVBuffer
    mask: torch.Tensor | None  # [B, 1, 1, K] bool
    parts: Sequence[PrefixPart]


class _Current(threading.local):
    step: _StepContext | None = None


_CURRENT = _Current()


@torch.library.custom_op("hearth::decode_attend", mutates_args=())
def decode_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
    """Write one step's k/v into the current cache and attend: ``[B, 1, Hq, D]``."""
    step = _CURRENT.step
    if step is None:
        raise RuntimeError("hearth::decode_attend called outside a compiled decode step")
    return step.decoder.attend(q, k, v, layer, step.cache, step.mask, step.parts)


@decode_attend.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
    return torch.empty_like(q, memory_format=torch.contiguous_format)


# Inductor options of the step. ``freezing`` folds the weights in as constants (its
# oneDNN linear lowering needs the packed weights to be); ``cpp_wrapper`` calls the
# kernels from C++ instead of a Python wrapper of ~300 calls a step.
OPTIONS: dict[str, object] = {"freezing": True, "cpp_wrapper": True}


def inductor_cache_dir(root: Path | None = None) -> Path:
    """Point inductor's cache at ``~/.cache/hearth/inductor/<torch>-<key>``; returns it.

    Inductor reads ``TORCHINDUCTOR_CACHE_DIR`` whenever it looks for its cache, so this
    takes effect for compiles started afterwards (default: a folder in /tmp, lost at a
    reboot and shared with every other torch user).
    """
    base = root if root is not None else Path.home() / ".cache" / "hearth" / "inductor"
    path = base / f"{torch.__version__}-{host_key()}"
    path.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    return path


class CompiledStep:
    """``decoder``'s one-token step, compiled; call it like ``LeanDecoder.forward``."""

    def __init__(self, decoder: LeanDecoder, options: dict[str, object] | None = None) -> None:
        self.decoder = decoder
        for linear in decoder.linears():
            # Parameters are what inductor's freezing folds in as constants (its oneDNN
            # linear lowering needs the packed weight to be one).
            for name in ("weight", "bias", "scales"):
                value = getattr(linear, name, None)
                if value is not None and not isinstance(value, torch.nn.Parameter):
                    setattr(linear, name, torch.nn.Parameter(value, requires_grad=False))
        self._fn = torch.compile(
            self._dense,
            fullgraph=True,
            dynamic=False,
            options=options if options is not None else OPTIONS,
        )

    def _dense(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.decoder.step_graph(ids, positions, torch.ops.hearth.decode_attend)

    def __call__(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        cache: KVBuffer,
        attention_mask: torch.Tensor | None,
        parts: Sequence[PrefixPart] = (),
    ) -> torch.Tensor:
        """One step; compiles first for a new batch size (minutes: not on a server's
        worker, see ``step_compiler.py``)."""
        with torch._inductor.config.patch(freezing=True):  # dynamo reads it when tracing
            return self._call(self._fn, ids, positions, cache, attention_mask, parts)

    def run(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        cache: KVBuffer,
        attention_mask: torch.Tensor | None,
        parts: Sequence[PrefixPart] = (),
    ) -> torch.Tensor:
        """One step with the code compiled so far; raises rather than compile (a guard
        that fails, e.g. a batch size not compiled for)."""
        # ``freezing`` as when it was compiled: dynamo guards on it.
        with (
            torch.compiler.set_stance("fail_on_recompile"),
            torch._inductor.config.patch(freezing=True),
        ):
            return self._call(self._fn, ids, positions, cache, attention_mask, parts)

    def _call(  # noqa: PLR0917
        self,
        fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        ids: torch.Tensor,
        positions: torch.Tensor,
        cache: KVBuffer,
        attention_mask: torch.Tensor | None,
        parts: Sequence[PrefixPart],
    ) -> torch.Tensor:
        mask = None if attention_mask is None else attention_mask[:, None, None, :]
        _CURRENT.step = _StepContext(self.decoder, cache, mask, parts)
        try:
            return fn(ids, positions)
        finally:
            _CURRENT.step = None
