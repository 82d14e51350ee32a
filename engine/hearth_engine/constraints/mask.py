"""The engine side of constrained decoding: token masks on the worker thread.

Like vLLM's structured outputs: each step, the matcher of every constrained row fills
its row of an int32 bitmask (bit ``t`` set: token ``t`` allowed), then the whole mask is
unpacked and applied to the batch's logits in one vectorised ``masked_fill``. Rows
without a constraint are left alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

_LOGGER = logging.getLogger(__name__)


class Constraint:
    """One request's grammar state (an ``llguidance.LLMatcher``; worker thread only)."""

    def __init__(self, matcher: Any, eos_ids: Sequence[int]) -> None:
        self.matcher = matcher
        self.eos_ids = tuple(eos_ids)
        # Why this grammar cannot go on (its mask could not be computed); the engine
        # then fails this request alone.
        self.failure = ""

    def fill(self, row: torch.Tensor) -> None:
        """Write the allowed tokens into ``row`` (a contiguous int32 CPU tensor)."""
        self.matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())

    def advance(self, token: int) -> bool:
        """Consume a sampled token; False if the grammar refuses it (it then stays ended)."""
        if self.matcher.consume_token(token):
            return True
        _LOGGER.warning("A constrained request sampled a refused token: %s", self.error)
        return False

    def forced(self) -> list[int]:
        """The tokens the grammar allows next and nothing else (jump-forward decoding:
        ``{"name": "`` after ``<tool_call>``, a tool's whole name where only one is
        allowed). They are appended without a forward pass each; [] when none are, or
        when the matcher cannot tell (the next step then masks as usual)."""
        try:
            return list(self.matcher.compute_ff_tokens())
        except Exception as err:  # noqa: BLE001 -- never fatal: the mask still holds
            _LOGGER.debug("Forced tokens unavailable: %s", type(err).__name__)
            return []

    @property
    def done(self) -> bool:
        """Nothing but the end of the reply can follow."""
        return bool(self.matcher.is_stopped())

    @property
    def error(self) -> str:
        """The matcher's error, first line (the rest quotes the whole grammar)."""
        if not self.matcher.is_error():
            return ""
        lines = str(self.matcher.get_error()).strip().splitlines()
        return lines[0][:300] if lines else "error"


class Masker:
    """Applies the constrained rows' masks to a batch of logits; times itself.

    On CPU the mask is unpacked and applied with numpy: single-threaded, ~0.2 ms for a
    152k vocabulary, where torch's parallel kernels wait for a second core on a busy
    2-core machine (8-32 ms). On an accelerator the packed mask is copied over and
    unpacked there.
    """

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self._bitmask = torch.full((1, self.words), -1, dtype=torch.int32)
        self._shifts: dict[torch.device, torch.Tensor] = {}
        self.seconds = 0.0  # filling and applying masks, all requests
        self.tokens = 0  # masked tokens (rows x steps)

    def apply(self, logits: torch.Tensor, constraints: Sequence[Constraint | None]) -> None:
        """Mask ``logits`` ([B, V] float32, or [V] for one row) in place for the
        constrained rows (a row's ``constraints`` entry is None: left alone)."""
        if all(c is None for c in constraints):
            return
        t0 = time.perf_counter()
        batch = logits.unsqueeze(0) if logits.dim() == 1 else logits
        n = batch.shape[0]
        if self._bitmask.shape[0] < n:
            self._bitmask = torch.full((n, self.words), -1, dtype=torch.int32)
        bitmask = self._bitmask[:n]
        for k, constraint in enumerate(constraints):
            if constraint is None:
                bitmask[k].fill_(-1)
                continue
            try:
                constraint.fill(bitmask[k])
            except Exception as err:  # noqa: BLE001 -- this row's grammar only: the batch goes on
                _LOGGER.warning("A grammar mask failed: %s", type(err).__name__)
                constraint.failure = f"grammar error: {type(err).__name__}"
                bitmask[k].fill_(-1)
                continue
            if not bool(bitmask[k].any()):  # a broken matcher: only let the reply end
                _allow_only(bitmask[k], constraint.eos_ids)
        if batch.device.type == "cpu" and batch.dtype in _NUMPY_DTYPES:
            apply_numpy(batch, bitmask)
        else:
            self._apply_torch(batch, bitmask)
        self.seconds += time.perf_counter() - t0
        self.tokens += sum(c is not None for c in constraints)

    def _apply_torch(self, batch: torch.Tensor, bitmask: torch.Tensor) -> None:
        """Unpack on ``batch``'s device (an accelerator: the packed mask is 32x smaller)."""
        shifts = self._shifts.get(batch.device)
        if shifts is None:
            shifts = torch.arange(32, dtype=torch.int32, device=batch.device)
            self._shifts[batch.device] = shifts
        packed = bitmask.to(batch.device, non_blocking=True)
        allowed = ((packed.unsqueeze(-1) >> shifts) & 1).view(batch.shape[0], -1)
        batch.masked_fill_(allowed[:, : batch.shape[-1]] == 0, float("-inf"))


_NUMPY_DTYPES = (torch.float32, torch.float64, torch.float16)


def apply_numpy(batch: torch.Tensor, bitmask: torch.Tensor) -> None:
    """``batch`` [B, V] (CPU) gets -inf where ``bitmask`` [B, W] has a 0 bit (little-endian
    words: bit ``t % 32`` of word ``t // 32`` is token ``t``)."""
    bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=-1, bitorder="little")
    np.putmask(batch.numpy(), bits[:, : batch.shape[-1]] == 0, -np.inf)


def _allow_only(row: torch.Tensor, ids: Sequence[int]) -> None:
    """Set ``row`` (int32 words) to allow exactly the token ``ids``."""
    row.zero_()
    for token in ids:
        bit = 1 << (token % 32)
        row[token // 32] |= bit - (1 << 32) if bit >= 1 << 31 else bit
