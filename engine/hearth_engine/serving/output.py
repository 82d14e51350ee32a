"""Output processing: a sampled token becomes text for the client, or ends the request.

Runs on the engine's worker thread. ``accept`` records a token, emits its text (held
back while it could still become a stop string, see ``detok``) and says whether the
sequence is done and why; ``finish`` closes the request's figures and sends the last
event. Counters live in ``Counters``; the server turns them into ``/v1/stats`` and
``/metrics``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..config import EngineConfig
from ..model.runner import ModelRunner
from .sequence import FinishEvent, RequestStats, Sequence, TokenEvent


@dataclass
class Counters:
    """Engine-wide running totals (written by the worker thread only)."""

    requests: int = 0
    requests_failed: int = 0
    requests_cancelled: int = 0
    query_tokens: int = 0
    hit_tokens: int = 0
    prompt_tokens: int = 0
    prefill_tokens: int = 0
    prefill_seconds: float = 0.0
    generated_tokens: int = 0
    decode_seconds: float = 0.0
    decode_steps: int = 0
    mixed_steps: int = 0  # decode steps that also ran a prefill chunk (scheduler.MIX_MAX_TOKENS)
    forced_tokens: int = 0  # generated tokens the grammar forced (no step of their own)
    extend_steps: int = 0  # steps that fed a row several tokens at once (forced ones)
    pin_rebuilds: int = 0
    pin_restores: int = 0
    pin_reuses: int = 0
    store_failures: int = 0


class OutputProcessor:
    def __init__(self, config: EngineConfig, runner: ModelRunner, counters: Counters) -> None:
        self.counters = counters
        self.context_length = runner.info.context_length
        self.stop_token_ids = stop_token_ids(runner, config.extra_stop_tokens)
        self.jump_forward = config.jump_forward
        # Called with each finished request's figures before its last event is sent
        # (the stats window: a client reading /v1/stats right after its response must
        # find its request there).
        self.finished_listeners: list[Callable[[RequestStats], None]] = []

    def hold_stops(self, logits: torch.Tensor, rows: list[Sequence]) -> None:
        """Forbid ending tokens to rows still short of ``min_tokens`` (``logits``: [B, V])."""
        vocab = logits.shape[-1]
        for i, seq in enumerate(rows):
            if len(seq.generated) < seq.params.min_tokens:
                # Ids past the logits (a tokenizer's added tokens beyond the model's
                # vocabulary) cannot be sampled anyway: indexing them would fail the batch.
                ids = [t for t in (*self.stop_token_ids, *seq.params.stop_token_ids) if t < vocab]
                with torch.inference_mode():  # the logits are inference tensors
                    logits[i, ids] = float("-inf")

    def accept(self, seq: Sequence, token: int) -> str | None:
        """Record a sampled token, and after it the tokens its grammar forces (when
        ``jump_forward``): emit their text; returns a finish reason, or None.

        Forced tokens get no forward pass of their own: the next step feeds them all at
        once (``Sequence.unfed``), so ``{"name": "`` costs one step, not four.
        """
        reason = self._accept_one(seq, token)
        if reason is not None or seq.constraint is None or not self.jump_forward:
            return reason
        for forced in seq.constraint.forced():
            self.counters.forced_tokens += 1
            reason = self._accept_one(seq, forced)
            if reason is not None:
                return reason
        return None

    def _accept_one(self, seq: Sequence, token: int) -> str | None:
        now = time.monotonic()
        seq.generated.append(token)
        self.counters.generated_tokens += 1
        if len(seq.generated) == 1:
            seq.first_token_at = now
            seq.stats.ttft_ms = (now - seq.arrival) * 1000
            seq.stats.prefill_ms = (now - seq.prefill_started) * 1000
        if token in self.stop_token_ids or token in seq.params.stop_token_ids:
            return "stop"
        text = seq.stream.push(token)
        if text or len(seq.generated) == 1:
            seq.emit(TokenEvent(token, text))
        if seq.stream.stopped:
            return "stop"
        # Constrained: the reply ends where the grammar does (after the last tool call
        # closes: no rambling), or if the grammar refused the token.
        if seq.constraint is not None and (
            not seq.constraint.advance(token) or seq.constraint.done
        ):
            return "stop"
        if len(seq.generated) >= seq.params.max_tokens or seq.total_len >= self.context_length:
            return "length"
        return None

    def finish(self, seq: Sequence, reason: str) -> None:
        """Close the request's figures and send its ``FinishEvent`` (KV already released)."""
        now = time.monotonic()
        seq.stats.completion_tokens = len(seq.generated)
        seq.stats.decode_ms = (now - seq.first_token_at) * 1000 if seq.first_token_at else 0.0
        self.counters.requests += 1
        self.counters.prompt_tokens += len(seq.prompt)
        tail = seq.stream.finish() if seq.stream is not None else ""
        for listener in self.finished_listeners:
            listener(seq.stats)
        seq.emit(FinishEvent(reason, tail, seq.stats))


def stop_token_ids(runner: ModelRunner, extra: tuple[str, ...]) -> frozenset[int]:
    """End-of-sequence ids: the model's, the tokenizer's, and ``extra`` tokens it knows."""
    tokenizer = runner.tokenizer
    ids: set[int] = set()
    eos = getattr(runner.model.generation_config, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, list | tuple):
        ids.update(int(e) for e in eos)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    vocab = tokenizer.get_vocab()
    for token in extra:
        if token in vocab:
            ids.add(int(vocab[token]))
    return frozenset(ids)
