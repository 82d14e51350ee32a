"""The start-up self-test: may attention read a cached prefix in place?

``ModelRunner.shares_prefix`` runs ``check_shared_prefix`` once, at engine start: a model
whose attention Hearth cannot merge (or any numerical surprise) makes the engine copy
prefixes instead, never answer wrong. It needs only a runner's forwards (``Forwards``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

import torch

from .attention import PrefixPart
from .kv import KVBuffer, KVLayout
from .quant.linear import exact_float_rows

_LOGGER = logging.getLogger(__name__)

# The self-test accepts reading in place when it moves the logits by at most
# MARGIN x the dtype's noise (see check_shared_prefix), plus a floor for when the
# measured noise happens to be ~0: FLOOR_EPS machine epsilons of the largest logit, and
# at least FLOOR_FP32_EPS float32 epsilons (merging softmax partials in float32 costs a
# few; measured 6 on a Qwen3 shape, where a real error costs orders of magnitude more).
# The noise includes a decode step against a prefill for the same token, which is never
# ~0 in bfloat16, so the bfloat16 floor is one epsilon (it was 4 when chunking was the
# only noise measured: a 3B shape then failed on rounding, 0.22 against 0.20, while one
# skipped prefix token on the tiny model passed by 0.006).
SELF_TEST_MARGIN = 2.0
SELF_TEST_FLOOR_EPS = 1.0
SELF_TEST_FLOOR_FP32_EPS = 32.0


class _Info(Protocol):
    @property
    def vocab_size(self) -> int: ...


class Forwards(Protocol):
    """What the self-test runs: ``ModelRunner``'s buffers and forwards, called with
    ``ModelRunner``'s arguments."""

    @property
    def info(self) -> _Info: ...

    layout: KVLayout
    new_buffer: Callable[..., KVBuffer]
    prefill: Callable[..., torch.Tensor]
    decode: Callable[..., torch.Tensor]
    prefix_parts: Callable[..., list[PrefixPart]]
    as_cached: Callable[[torch.Tensor], tuple[list[torch.Tensor], PrefixPart | None]]


def check_shared_prefix(runner: Forwards, tokens: int = 64) -> bool:
    """Whether reading a prefix in place gives the logits of copying it.

    The bound is the dtype's own noise, measured here: how far a cold prefill moves
    when it is only chunked differently (a fixed tolerance either rejects bfloat16
    rounding or lets real errors through in float32).
    """
    gen = torch.Generator().manual_seed(0)
    vocab = max(2, min(runner.info.vocab_size, 1000))
    ids = torch.randint(1, vocab, (tokens,), generator=gen).tolist()
    half = tokens // 2
    try:
        with exact_float_rows():
            noise, error, scale = _shared_prefix_trial(runner, ids, half)
    except Exception as err:  # noqa: BLE001 - any failure means: copy, as before
        _LOGGER.warning("Shared-prefix attention unavailable (%s): prefixes are copied", err)
        return False
    eps = torch.finfo(runner.layout.dtype).eps
    floor = max(SELF_TEST_FLOOR_EPS * eps, SELF_TEST_FLOOR_FP32_EPS * torch.finfo().eps)
    bound = SELF_TEST_MARGIN * noise + floor * scale
    _LOGGER.debug(
        "Shared-prefix self-test: error %.3g, noise %.3g, bound %.3g", error, noise, bound
    )
    if not error <= bound:  # also rejects NaN
        _LOGGER.warning(
            "Shared-prefix attention disagrees with the model (%.3g > %.3g): prefixes are copied",
            error,
            bound,
        )
        return False
    return True


def _shared_prefix_trial(runner: Forwards, ids: list[int], half: int) -> tuple[float, float, float]:
    """``(noise, error, scale)``: max logit differences of a prefill and a decode step.

    *noise*: one cold prefill against one chunked at ``half``, and its last token's
    logits against a decode step's for that token (two correct kernels: in bfloat16
    on a deep model they part by as much as reading in place does, 0.19 on a
    Llama-3.2-3B shape where chunking alone parted by 0). *error*: the tail read in
    place against the same tail on a copy of the same prefix KV. *scale*: the
    largest logit.
    """
    n = len(ids)
    cold = runner.new_buffer(1, n + 1)
    cold_logits = runner.prefill(cold, ids)
    chunked = runner.new_buffer(1, n + 1)
    runner.prefill(chunked, ids[:half])
    chunked_logits = runner.prefill(chunked, ids[half:])
    prefix = cold.read_segment(0, 0, half)
    copied = runner.new_buffer(1, n + 1)
    copied.write_segment(0, 0, prefix)
    copied.set_length(half)
    copied_logits = runner.prefill(copied, ids[half:])
    own = runner.new_buffer(1, n + 1)
    shared, window = runner.as_cached(prefix)
    own_logits = runner.prefill(own, ids[half:], shared, window)
    step = ([ids[0]], [n], None)
    cold_step = runner.decode(cold, *step)
    chunked_step = runner.decode(chunked, *step)
    copied_step = runner.decode(copied, *step)
    own_step = runner.decode(own, *step, runner.prefix_parts(shared, window))
    stepped = runner.new_buffer(1, n + 1)
    runner.prefill(stepped, ids[:-1])
    stepped_last = runner.decode(stepped, [ids[-1]], [n - 1], None)

    def diff(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a.reshape(-1) - b.reshape(-1)).abs().max())

    noise = max(
        diff(cold_logits, chunked_logits),
        diff(cold_step, chunked_step),
        diff(cold_logits, stepped_last),
    )
    error = max(diff(own_logits, copied_logits), diff(own_step, copied_step))
    return noise, error, float(cold_logits.abs().max()) + 1.0
