"""Pinned prefixes on disk: the prefix store behind ``PinManager`` (pins.py).

A pin that becomes ready is written to the store (its KV, and a hybrid model's state or
a sliding model's window at its end), and the manifest names the pins; at start-up the
previous run's pins are read back (``restore_all``), and a pin whose prefix is no longer
cached is restored from its file instead of prefilled again (``load``).

Threads: the worker (and, before it runs, the start-up thread) calls everything here;
one I/O thread writes the store: KV files, then the manifest. A manifest task reads the
pins when it runs, not when it was queued, so the last one written is always the newest
state, whichever thread asked for it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from ..cache.radix import CacheFullError
from ..cache.store import ManifestEntry, PrefixStore, StoredPrefix, prefix_key
from ..model.state import Snapshot
from .kv_manager import KVManager
from .output import Counters

_LOGGER = logging.getLogger(__name__)

# A pin's file waits for a worker with no requests this long at most, asking this often.
WRITE_WAIT_S = 30.0
IDLE_POLL_S = 0.05

# Brings one stored pin back as a pin: (name, tokens, monotonic start of its restore) ->
# whether it is pinned now (``PinManager`` pins it; its KV is cached already).
Restore = Callable[[str, list[int], float], bool]


def _run_when_idle() -> None:
    """Give the calling thread the CPU only when nothing else wants it (Linux's
    ``SCHED_IDLE``; elsewhere nothing changes).

    The store's writes are work no request waits for, yet a pin's file is 100-200 MB to
    checksum and write. On a box of two to four cores the worker's threads use every
    core, so a write scheduled beside them takes its share of a request's prefill.
    """
    if hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE"):
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


class PinStore:
    def __init__(
        self,
        folder: Path | None,
        radix: bool,
        kv: KVManager,
        namespace: str,
        counters: Counters,
        *,
        busy: Callable[[], bool] = lambda: False,
    ) -> None:
        """The store in ``folder`` (``--prefix-store``; none: pins live in memory only),
        for ``namespace``'s pins in ``kv``'s cache; only a radix cache (``radix``) keeps
        pins to store. ``busy``: whether the worker has requests to run (a pin's file is
        written once it has none, ``WRITE_WAIT_S`` at most)."""
        self.store = PrefixStore(folder, on_failure=self._store_failed) if folder else None
        self.persistent = self.store is not None and radix
        self.kv = kv
        self.namespace = namespace
        self.counters = counters
        self._lock = threading.Lock()  # guards _kept
        # Stored pins not restored at start (no room, a passing read error): they stay in
        # the manifest, and on disk, until their name is pinned or unpinned.
        self._kept: dict[str, ManifestEntry] = {}
        self._restoring = False
        self.busy = busy
        self._closing = threading.Event()
        self._io = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="hearth-store", initializer=_run_when_idle
        )

    def close(self) -> None:
        """Finish queued store writes (at once: no more waiting for an idle worker), and
        let go of the store's folder."""
        self._closing.set()
        self._io.shutdown(wait=True)
        if self.store is not None:
            self.store.close()

    def forget(self, name: str) -> bool:
        """Stop keeping ``name``'s stored pin (pinned or unpinned again); whether it was kept."""
        with self._lock:
            return self._kept.pop(name, None) is not None

    def load(self, tokens: list[int]) -> bool:
        """Cache ``tokens``' prefix from the store when it is stored and not cached;
        whether it was."""
        if not self.persistent or self.kv.cache.contains(self.namespace, tokens):
            return False
        assert self.store is not None
        stored = self.store.load_prefix(self.namespace, tokens)
        return stored is not None and self._insert_stored(stored)

    def _insert_stored(self, stored: StoredPrefix) -> bool:
        """Cache a prefix read from the store (with its state, for a hybrid model, or its
        sliding layers' window)."""
        snapshot = None
        if stored.window is not None:
            snapshot = Snapshot(len(stored.tokens), (), (), stored.window)
        elif stored.state:
            layers = len(self.kv.layout.state_layers)
            try:
                snapshot = Snapshot.from_tensors(len(stored.tokens), layers, stored.state)
            except ValueError as err:
                _LOGGER.warning("Ignoring a stored pin: %s", err)
                return False
        return self.kv.insert_segment(self.namespace, stored.tokens, stored.kv, snapshot)

    def save_kv(self, tokens: list[int]) -> None:
        """Write the pin's KV from the cache's own segments (no extra copy here), and a
        hybrid model's state or a sliding model's window at its end. The write holds the
        segments until it runs (their storage is never recycled, only freed)."""
        if not self.persistent:
            return
        segments = self.kv.segments(self.namespace, tokens)
        if segments is None or self.store is None:
            return
        state, window = None, None
        if self.kv.snapshots is not None:
            snapshot = self.kv.snapshot(self.namespace, tokens)
            if snapshot is None:  # its KV alone could not be resumed
                return
            state, window = snapshot.tensors(), snapshot.window
        store, ns = self.store, self.namespace

        def save() -> None:
            self._wait_until_idle()
            if not store.save(ns, tokens, segments, state, window):
                self.counters.store_failures += 1

        self._submit_io(save)

    def save_manifest(self) -> None:
        if not self.persistent or self._restoring:
            # Mid-restore the cache holds only the pins restored so far: writing now
            # would prune the store files of the pins still to come.
            return
        store, ns, cache = self.store, self.namespace, self.kv.cache
        assert store is not None

        def write() -> None:
            # Read the pins now, on the I/O thread: tasks run in order, so the last
            # manifest written is the newest state (the store's versions guard it too).
            version = store.next_version(ns)
            pins = cache.pins()
            with self._lock:
                kept = [e for name, e in self._kept.items() if name not in pins]
            entries = [
                ManifestEntry(name, prefix_key(r.namespace, r.tokens), len(r.tokens))
                for name, r in pins.items()
            ]
            entries = sorted(entries + kept, key=lambda e: e.name)
            if store.write_manifest(ns, entries, version):
                store.prune(ns, {e.key for e in entries}, version)

        self._submit_io(write)

    def _wait_until_idle(self) -> None:
        """Hold a write back while the worker has requests (``WRITE_WAIT_S`` at most).

        Persistence is never urgent: it only has to outlive a restart. A write beside a
        request competes with it for the cores, the memory bus, the disk and Python's
        lock, even at idle priority. Measured on 2 cores with the household replay (seed
        2026, two rounds each, against the engine without a store): first tokens were 26 %
        later at the median when each pin was written at once, 7 % when it waited for a
        pause. A house's requests come with pauses between them; a worker busy for
        ``WRITE_WAIT_S`` gets its write then.
        """
        deadline = time.monotonic() + WRITE_WAIT_S
        while self.busy() and time.monotonic() < deadline:
            if self._closing.wait(IDLE_POLL_S):
                return

    def flush(self, timeout: float | None = None) -> None:
        """Wait until the store tasks queued so far are done (tests, benchmarks)."""
        self._io.submit(lambda: None).result(timeout)

    def _submit_io(self, task: Callable[[], None]) -> None:
        """Run store I/O off the worker thread; a failure is logged, never lost."""

        def done(future: Future[None]) -> None:
            error = future.exception()
            if error is not None:
                _LOGGER.error("Prefix store task failed: %s", error, exc_info=error)

        try:
            self._io.submit(task).add_done_callback(done)
        except RuntimeError:  # executor shut down: the engine is stopping
            _LOGGER.debug("store task dropped at shutdown")

    def restore_all(self, restore: Restore) -> None:
        """At start-up (before the worker runs), bring back the previous run's pins."""
        if not self.persistent:
            return
        assert self.store is not None
        self._restoring = True
        try:
            for entry in self.store.open(self.namespace):
                if not self._restore_entry(entry, restore) and self.store.holds(
                    self.namespace, entry.key
                ):
                    with self._lock:  # not restored, but its file is fine: keep both
                        self._kept[entry.name] = entry
        finally:
            self._restoring = False
        self.save_manifest()

    def _restore_entry(self, entry: ManifestEntry, restore: Restore) -> bool:
        """Bring one pin back from the store; False (after a warning) if it cannot be."""
        assert self.store is not None
        started = time.monotonic()
        loaded = self.store.load_prefix_by_key(self.namespace, entry.key)
        if loaded is None:
            return False
        tokens = loaded.tokens
        try:
            self.kv.cache.check_fits(self.kv.layout.prefix_bytes(len(tokens)))
        except CacheFullError as err:
            _LOGGER.warning("Not restoring pin %s (kept in the store): %s", entry.name, err)
            return False
        if not self._insert_stored(loaded):
            return False
        if not restore(entry.name, tokens, started):
            return False
        _LOGGER.info("Restored pin %s (%d tokens) from the prefix store", entry.name, len(tokens))
        return True

    def _store_failed(self) -> None:
        self.counters.store_failures += 1
