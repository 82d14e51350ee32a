"""What running sequences may still need of the KV budget. No torch.

The KV budget covers the prefix cache, recurrent or window snapshots, and every working
buffer: a sequence's own prefill buffer, the decode batch, and buffers kept for reuse.
Working buffers are contiguous, so a decode batch that grows or changes rows is copied
into a new buffer while the old one still exists.

**Admission** (``KVManager.fits``) reserves, for every running sequence, the most its
working KV can ever take (``Demand``), and admits a sequence only when the reservations
of all running ones with it, plus what the cache cannot evict, fit the budget:

* its prefill buffer: own prompt (the part not read in place from the cache) + the first
  decode room (``GROWTH_TOKENS`` at most) + 1, and for a pin its copy into the cache;
* the decode batch: ``rows × cap`` with ``cap`` at most the longest own prompt +
  ``max_tokens`` + one growth step + 1 (rows are left-padded to one end column), twice:
  a rebuild copies the old batch (or the current one, if larger) into the new one.

Every allocation then makes room for itself before it happens (``make_room``), and
what a request leaves in the cache when it ends is cut to what fits. One exception: a
pin that cannot fit beside its own working buffer (a prefix of nearly the whole budget)
is computed while nothing else runs, and may pass the budget while it is copied into
the cache (``place(strict=False)``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# A decode buffer grows by at most this many tokens at a time (``batch.py``).
GROWTH_TOKENS = 256


class KVBudgetError(RuntimeError):
    """An allocation the admission reservations should have made room for did not fit."""


@dataclass(frozen=True)
class Demand:
    """The most KV one running sequence can take, in tokens of a working buffer."""

    buffer: int  # its prefill buffer: own prompt + first decode room + 1
    final: int  # own tokens it can reach: own prompt + decode steps (0: it never decodes)
    decode: int  # decode steps: max_tokens - 1 (0: a pin, or a single token)
    cached: int = 0  # tokens it copies into the cache beside its buffer (a pin's prompt)

    @classmethod
    def of(cls, own_prompt: int, max_tokens: int | None) -> Demand:
        """A request's demand (``max_tokens`` None: a pin, which only prefills and then
        copies what it computed into the cache while its buffer still exists)."""
        if max_tokens is None:
            return cls(own_prompt + 1, 0, 0, own_prompt)
        # The first token comes from the prefill; each decode step after it feeds one
        # token: ``max_tokens - 1`` steps (none: it never joins the decode batch).
        steps = max_tokens - 1
        room = min(max_tokens, GROWTH_TOKENS)
        return cls(own_prompt + room + 1, own_prompt + steps, steps)


def batch_tokens(demands: Iterable[Demand]) -> int:
    """Token columns (rows × capacity) a decode batch of ``demands`` can reach."""
    rows = [d for d in demands if d.decode]
    if not rows:
        return 0
    cap = max(d.final for d in rows) + min(max(d.decode for d in rows), GROWTH_TOKENS) + 1
    return len(rows) * cap


def reserved_bytes(demands: Iterable[Demand], batch_now: int, bytes_per_token: int) -> int:
    """Working bytes ``demands`` can take at once: their prefill buffers, and the decode
    batch twice (old and new during a rebuild; ``batch_now``: the current batch's bytes,
    which stays alive until the rebuild that drops finished rows)."""
    demands = list(demands)
    buffers = sum(d.buffer + d.cached for d in demands) * bytes_per_token
    batch = batch_tokens(demands) * bytes_per_token
    return buffers + max(batch, batch_now) + batch
