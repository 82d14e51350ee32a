"""A request's life inside the engine, and the events it produces. No torch here."""

from __future__ import annotations

import enum
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .sampling import SamplingParams

_IDS = itertools.count(1)


class Kind(enum.Enum):
    GENERATE = "generate"
    PIN = "pin"


class State(enum.Enum):
    WAITING = "waiting"
    PREFILLING = "prefilling"
    DECODING = "decoding"
    FINISHED = "finished"


@dataclass
class RequestStats:
    """Per-request figures, reported in ``usage.hearth`` and aggregated in metrics."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    # Where the first token's time went. The server's part comes first: waiting for the
    # prepare thread (behind other requests' and pins' rendering), then rendering,
    # tokenizing and compiling the grammar. Then the engine's: ``queue_ms`` waiting for
    # admission and ``prefill_ms`` from admission to the first token; ``pin_wait_ms`` is
    # the part of those two during which pin prefill ran instead.
    prepare_wait_ms: float = 0.0
    prepare_ms: float = 0.0
    queue_ms: float = 0.0
    prefill_ms: float = 0.0
    pin_wait_ms: float = 0.0
    ttft_ms: float = 0.0  # engine: submitted -> first token (queue + prefill)
    decode_ms: float = 0.0
    pin: str | None = None

    @property
    def prefill_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    @property
    def server_ttft_ms(self) -> float:
        """Request received -> first token, all of it inside the server."""
        return self.prepare_wait_ms + self.prepare_ms + self.ttft_ms

    @property
    def decode_tokens_per_s(self) -> float:
        steps = max(0, self.completion_tokens - 1)
        return steps / (self.decode_ms / 1000) if self.decode_ms > 0 and steps else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "prepare_wait_ms": round(self.prepare_wait_ms, 3),
            "prepare_ms": round(self.prepare_ms, 3),
            "queue_ms": round(self.queue_ms, 3),
            "prefill_ms": round(self.prefill_ms, 3),
            "pin_wait_ms": round(self.pin_wait_ms, 3),
            "ttft_ms": round(self.ttft_ms, 3),
            "server_ttft_ms": round(self.server_ttft_ms, 3),
            "decode_ms": round(self.decode_ms, 3),
            "decode_tokens_per_s": round(self.decode_tokens_per_s, 2),
            "pin": self.pin,
        }


@dataclass(frozen=True)
class TokenEvent:
    token_id: int
    text: str


@dataclass(frozen=True)
class FinishEvent:
    reason: str  # "stop" | "length" | "cancelled"
    text: str  # text released at the end (held back for stop strings)
    stats: RequestStats


@dataclass(frozen=True)
class ErrorEvent:
    message: str
    # 400: this request's own parameters made its step impossible (see ``SamplingError``);
    # 500: the engine failed it.
    status: int = 500


Event = TokenEvent | FinishEvent | ErrorEvent


@dataclass(eq=False)
class Sequence:
    """One generation or pin job. Mutated by the worker thread only, except ``cancelled``."""

    kind: Kind
    prompt: list[int]
    namespace: str
    params: SamplingParams = field(default_factory=SamplingParams)
    emit: Callable[[Event], None] = field(default=lambda event: None)
    pin_name: str | None = None
    pin_generation: int = 0
    id: int = field(default_factory=lambda: next(_IDS))
    state: State = State.WAITING
    cancelled: bool = False
    arrival: float = field(default_factory=time.monotonic)
    # Prefix cache
    lock_node: Any = None
    cached: int = 0
    # Requests wait for this one's prompt KV (see ``Engine._leader_for``).
    has_followers: bool = False
    # KV: ``kv_len`` tokens in all. The first ``shared_len`` are cached segments read in
    # place (``shared``, views of cache payloads, locked); the rest live in a working
    # buffer (``kv``, at row ``kv_row`` from column ``kv_offset``).
    shared: tuple[Any, ...] = ()
    shared_len: int = 0
    # A model that trims its windows: the sliding layers' KV just before the working
    # buffer, read in place (a ``PrefixPart`` with its own start; see ``KVManager``).
    window: Any = None
    kv: Any = None
    kv_row: int = 0
    kv_offset: int = 0
    kv_len: int = 0
    # Generation
    generated: list[int] = field(default_factory=list)
    stream: Any = None
    sampler: Any = None
    constraint: Any = None  # a ``constraints.Constraint``: the grammar the reply must follow
    stats: RequestStats = field(default_factory=RequestStats)
    prefill_started: float = 0.0
    first_token_at: float = 0.0

    @property
    def total_len(self) -> int:
        return len(self.prompt) + len(self.generated)

    @property
    def own_len(self) -> int:
        """Tokens whose KV is in the working buffer."""
        return self.kv_len - self.shared_len

    @property
    def remaining_prefill(self) -> int:
        return len(self.prompt) - self.kv_len

    @property
    def remaining_decode(self) -> int:
        return max(0, self.params.max_tokens - len(self.generated))

    @property
    def unfed(self) -> list[int]:
        """The tokens the next step feeds: the last sampled one, and any forced after it
        (jump-forward), none of which has KV yet."""
        return self.generated[max(0, self.kv_len - len(self.prompt)) :]

    def tokens_with_kv(self) -> list[int]:
        """Token ids whose KV this sequence holds (the last sampled token has none yet)."""
        return (self.prompt + self.generated)[: self.kv_len]
