"""Pinned prefixes: their life cycle (the disk store behind them is ``pin_store.py``).

A pin goes *warming* → *ready* (or *failed*). Re-pinning a name starts a new
**generation**: the old pin keeps serving until the new one is ready, and then the swap
is atomic (``RadixCache.pin``). A warming pin whose name was pinned again, or unpinned,
is *superseded*.

Threads:

* the event loop calls ``begin``, ``wait``, ``forget``, ``status`` and ``names``: they
  touch only this module's own records (under ``_lock``), never the cache;
* the worker calls ``start``, ``complete``, ``release``, ``fail`` and ``fail_all``:
  everything that changes the cache (and asks ``PinStore`` to write the store).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..cache.radix import CacheFullError, PinTooLargeError
from ..cache.store import PrefixStore, prefix_key
from ..config import CacheMode, EngineConfig
from .kv_manager import KVManager
from .output import Counters
from .pin_store import PinStore
from .sequence import Kind, Sequence


@dataclass
class PinStatus:
    name: str
    tokens: int
    hash: str
    state: str = "warming"  # warming | ready | failed
    prefill_ms: float = 0.0
    # Tokens this pin computed (its tokens less those it found cached): a re-pin that
    # keeps the pinned house's bytes computes only what follows them.
    prefilled_tokens: int = 0
    restored: bool = False
    error: str | None = None
    created_at: float = field(default_factory=time.time)
    ready_at: float | None = None
    generation: int = 0

    def as_dict(self, hits: int = 0, tokens_reused: int = 0) -> dict[str, Any]:
        return {
            "name": self.name,
            "tokens": self.tokens,
            "hash": self.hash,
            "state": self.state,
            "prefill_ms": round(self.prefill_ms, 3),
            "prefilled_tokens": self.prefilled_tokens,
            "restored": self.restored,
            "error": self.error,
            "created_at": self.created_at,
            "ready_at": self.ready_at,
            "hits": hits,
            "tokens_reused": tokens_reused,
        }


Waiter = Callable[[PinStatus], None]


class PinManager:
    def __init__(
        self,
        config: EngineConfig,
        namespace: str,
        kv: KVManager,
        counters: Counters,
        busy: Callable[[], bool] = lambda: False,
    ) -> None:
        """``busy``: whether the worker has requests to run (``PinStore``)."""
        self.mode = config.cache_mode
        self.namespace = namespace
        self.kv = kv
        self.counters = counters
        radix = self.mode is CacheMode.RADIX
        self.disk = PinStore(config.prefix_store, radix, kv, namespace, counters, busy=busy)
        self._lock = threading.RLock()  # guards the records below
        self._active: dict[str, PinStatus] = {}  # ready pins, or a failed first try
        self._pending: dict[str, PinStatus] = {}  # the latest attempt, still warming
        self._generation: dict[str, int] = {}
        self._waiters: dict[tuple[str, int], list[Waiter]] = {}

    @property
    def store(self) -> PrefixStore | None:
        """The prefix store the pins are saved to (``--prefix-store``), if any."""
        return self.disk.store

    def close(self) -> None:
        """Finish queued store writes, and let go of the store's folder."""
        self.disk.close()

    def flush(self, timeout: float | None = None) -> None:
        """Wait until the store tasks queued so far are done (tests, benchmarks)."""
        self.disk.flush(timeout)

    def restore_all(self) -> None:
        """At start-up (before the worker runs), bring back the previous run's pins."""
        self.disk.restore_all(self._restored)

    def _restored(self, name: str, tokens: list[int], started: float) -> bool:
        """Pin a prefix the store just cached (``PinStore.restore_all``); whether it is."""
        status = self.begin(name, tokens)
        self.counters.pin_restores += 1
        ms = (time.monotonic() - started) * 1000
        self._activate(name, status.generation, tokens, ms, restored=True, save=False)
        return name in self.kv.cache.pins()

    # ================================================================= event-loop side

    def check_fits(self, tokens: list[int], name: str | None = None) -> None:
        """Refuse now a pin that cannot fit: ``PinTooLargeError`` / ``CacheFullError``.

        The pins still warming up (but an earlier attempt at ``name``, which this one
        supersedes) will hold their bytes too: they count as if they were pinned.
        """
        if self.mode is not CacheMode.RADIX:
            return
        cache, bpt = self.kv.cache, self.kv.segment_bytes_per_token
        need = self.kv.layout.prefix_bytes(len(tokens))  # segments and a sliding window
        if need > cache.capacity_bytes:
            raise PinTooLargeError(
                f"the prefix is {len(tokens)} tokens ({need} bytes of KV) but the "
                f"KV cache budget is {cache.capacity_bytes} bytes; raise --kv-cache-mb"
            )
        new_tokens = len(tokens) - cache.match(self.namespace, tokens).length
        with self._lock:
            warming = [s for s in self._pending.values() if s.name != name]
        pending = sum(self.kv.layout.prefix_bytes(s.tokens) for s in warming)
        try:
            cache.check_fits(need - (len(tokens) - new_tokens) * bpt + pending)
        except CacheFullError as err:
            if not warming:
                raise
            raise CacheFullError(f"{err}, with {len(warming)} pins still warming up") from None

    def begin(self, name: str, tokens: list[int]) -> PinStatus:
        """A new attempt (generation) for ``name``: warming until the worker is done."""
        with self._lock:
            generation = self._generation.get(name, 0) + 1
            self._generation[name] = generation
            status = PinStatus(
                name, len(tokens), prefix_key(self.namespace, tokens)[:16], generation=generation
            )
            self._pending[name] = status
            return status

    def wait(self, status: PinStatus) -> asyncio.Future[PinStatus]:
        """A future (on the running loop) resolved when ``status``'s attempt ends."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[PinStatus] = loop.create_future()

        def resolve(result: PinStatus) -> None:
            def _set() -> None:
                if not done.done():
                    done.set_result(result)

            with contextlib.suppress(RuntimeError):  # loop closed: nobody listens
                loop.call_soon_threadsafe(_set)

        with self._lock:
            key = (status.name, status.generation)
            if status.state != "warming":  # already over
                resolve(status)
            else:
                self._waiters.setdefault(key, []).append(resolve)
        return done

    def forget(self, name: str) -> bool:
        """Drop ``name``'s records (the worker then releases it: ``release``)."""
        with self._lock:
            kept = self.disk.forget(name)
            known = name in self._active or name in self._pending or kept
            self._generation[name] = self._generation.get(name, 0) + 1
            self._active.pop(name, None)
            pending = self._pending.pop(name, None)
        if pending is not None:
            self._notify(pending.name, pending.generation, self._superseded(pending.name))
        return known

    def status(self, name: str) -> dict[str, Any] | None:
        """The latest attempt for ``name`` (warming, ready or failed), with hit counters.

        While a re-pin warms up, ``active`` describes the pin that requests still hit.
        """
        with self._lock:
            pending = self._pending.get(name)
            active = self._active.get(name)
        status = pending or active
        if status is None:
            return None
        record = self.kv.cache.pins().get(name)
        hits, reused = (record.hits, record.tokens_reused) if record else (0, 0)
        out = status.as_dict(hits, reused)
        if pending is not None and active is not None:
            out["active"] = active.as_dict(hits, reused)
        return out

    def names(self) -> list[str]:
        with self._lock:
            return sorted(set(self._active) | set(self._pending))

    # ================================================================= worker side

    def current(self, name: str, generation: int) -> bool:
        with self._lock:
            return self._generation.get(name) == generation

    def start(self, name: str, generation: int, tokens: list[int]) -> Sequence | None:
        """Begin an attempt: restore it from the store, or return a prefill to schedule."""
        if not self.current(name, generation):
            self.fail(name, generation, "superseded")
            return None
        if self.mode is CacheMode.NONE:
            self._resolve(name, generation, state="ready")
            return None
        started = time.monotonic()
        if self.disk.load(tokens):
            self.counters.pin_restores += 1
            ms = (time.monotonic() - started) * 1000
            self._activate(name, generation, tokens, ms, restored=True, save=False)
            return None
        seq = Sequence(Kind.PIN, tokens, self.namespace, pin_name=name)
        seq.pin_generation = generation
        return seq

    def complete(self, seq: Sequence, computed: bool, prefill_ms: float, prefilled: int) -> None:
        """A pin sequence's KV is in the cache (``KVManager.store``): pin and persist it.
        ``prefilled``: the tokens it computed (the rest were cached)."""
        name, generation = seq.pin_name, seq.pin_generation
        if name is None:
            raise ValueError("not a pin sequence")
        if self.mode is CacheMode.LAST_PROMPT:
            self._resolve(
                name, generation, state="ready", prefill_ms=prefill_ms, prefilled=prefilled
            )
            return
        if computed:
            self.counters.pin_rebuilds += 1
        else:
            self.counters.pin_reuses += 1
        if not self.kv.cache.contains(seq.namespace, seq.prompt):
            self.fail(name, generation, "the KV cache budget is in use by other pins")
            return
        self._activate(
            name, generation, seq.prompt, prefill_ms, restored=False, save=True, prefilled=prefilled
        )

    def release(self, name: str) -> None:
        """Unpin ``name`` in the cache (its KV stays cached, unpinned, until evicted)."""
        with contextlib.suppress(KeyError):
            self.kv.cache.unpin(name)
        self.disk.save_manifest()

    def fail(self, name: str, generation: int, error: str) -> None:
        self._resolve(name, generation, state="failed", error=error)

    def fail_all(self, error: str) -> None:
        """Every warming attempt fails (the worker is stopping)."""
        with self._lock:
            pending = list(self._pending.values())
        for status in pending:
            self.fail(status.name, status.generation, error)

    def _activate(
        self,
        name: str,
        generation: int,
        tokens: list[int],
        prefill_ms: float,
        *,
        restored: bool,
        save: bool,
        prefilled: int = 0,
    ) -> None:
        with self._lock:
            superseded = self._generation.get(name) != generation
            try:
                if not superseded:
                    self.kv.cache.pin(name, self.namespace, tokens)
            except CacheFullError as err:  # a split needs room it cannot make
                error: str | None = str(err)
            else:
                error = "superseded" if superseded else None
        if error is not None:
            self.fail(name, generation, error)
            return
        if save:
            self.disk.save_kv(tokens)
        # Queue the manifest before anyone hears "ready": a flush after that sees it.
        self.disk.save_manifest()
        self._resolve(
            name,
            generation,
            state="ready",
            prefill_ms=prefill_ms,
            restored=restored,
            prefilled=prefilled,
        )

    def _resolve(
        self,
        name: str,
        generation: int,
        *,
        state: str,
        prefill_ms: float = 0.0,
        restored: bool = False,
        error: str | None = None,
        prefilled: int = 0,
    ) -> None:
        with self._lock:
            status = self._pending.get(name)
            if status is None or status.generation != generation:
                self._notify(name, generation, self._superseded(name, error))
                return
            status.state = state
            status.prefill_ms = prefill_ms
            status.prefilled_tokens = prefilled
            status.restored = restored
            status.error = error
            status.ready_at = time.time()
            del self._pending[name]
            if state == "ready" or name not in self._active:
                self._active[name] = status
        self._notify(name, generation, status)

    @staticmethod
    def _superseded(name: str, error: str | None = None) -> PinStatus:
        return PinStatus(name, 0, "", state="failed", error=error or "superseded")

    def _notify(self, name: str, generation: int, result: PinStatus) -> None:
        with self._lock:
            waiters = self._waiters.pop((name, generation), [])
        for waiter in waiters:
            waiter(result)
