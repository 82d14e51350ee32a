"""Sampling parameters and the choice of the next token from logits."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# Temperatures below this are greedy (as in vLLM): dividing logits by a tiny temperature
# overflows float32 to inf, and softmax of inf - inf is NaN.
GREEDY_BELOW = 1e-5


class SamplingError(ValueError):
    """No token can be chosen from this row's logits (every token masked, or NaN).

    Raised for one request's row only: the engine fails that request and every other
    row of the batch goes on.
    """


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop. ``temperature < GREEDY_BELOW`` is greedy."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = field(default=())
    # End-of-sequence and stop token ids cannot be sampled before this many tokens.
    min_tokens: int = 0

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError("min_tokens must be between 0 and max_tokens")
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError("temperature must be between 0 and 2")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")


class Sampler:
    """Per-request sampler; owns the request's random generator (seeded when asked)."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self._generator: torch.Generator | None = None
        if params.temperature >= GREEDY_BELOW:
            self._generator = torch.Generator()
            if params.seed is not None:
                self._generator.manual_seed(params.seed)
            else:
                self._generator.seed()

    def __call__(self, logits: torch.Tensor) -> int:
        """``logits``: [V] float32 on any device; returns a token id.

        Raises ``SamplingError`` when no token can be chosen: every logit is -inf (a
        grammar and ``min_tokens`` that leave nothing allowed) or NaN (a broken forward).
        """
        params = self.params
        if self._generator is None:
            best, token = torch.max(logits, dim=-1)
            if not bool(best > float("-inf")):  # all -inf, or NaN (max propagates NaN)
                raise SamplingError(_no_token(logits))
            return int(token)
        row = logits.float().cpu()
        if not bool(torch.isfinite(row.max())):  # all -inf, +inf or NaN
            raise SamplingError(_no_token(row))
        probs = torch.softmax(row / params.temperature, dim=-1)
        if params.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            cumulative = torch.cumsum(sorted_probs, dim=-1)
            # Keep the smallest set whose mass reaches top_p (always at least one token).
            drop = cumulative - sorted_probs > params.top_p
            sorted_probs[drop] = 0.0
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        if not bool(torch.isfinite(probs).all()) or float(probs.sum()) <= 0.0:
            raise SamplingError("sampling failed: the token probabilities are not finite")
        return int(torch.multinomial(probs, 1, generator=self._generator))


def _no_token(logits: torch.Tensor) -> str:
    if bool(torch.isnan(logits).any()):
        return "sampling failed: the model produced NaN logits"
    return (
        "no token may follow: every token is forbidden here (for example min_tokens "
        "forbids ending the reply where the grammar allows nothing else)"
    )
