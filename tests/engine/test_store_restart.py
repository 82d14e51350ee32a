"""Restarts over a prefix store that must keep its files (issue 26): a broken manifest,
a pin that no longer fits, a passing read error, two engines on one folder, files left
by a crash. Each runs real engines (the tiny model) on a real folder, one after another."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest

from hearth_engine.cache import store as store_module
from hearth_engine.cache.store import prefix_key
from hearth_engine.serving.engine import Engine

from .test_engine import tokens

HOUSE = tokens(26, 120)
BUDGET = 64 << 20


async def pin_and_close(make_engine: Any, store: Path) -> tuple[Engine, Path]:
    engine = make_engine(prefix_store=store)
    assert (await engine.pin("house", HOUSE)).state == "ready"
    engine.close()
    assert engine.pins.store is not None
    path = engine.pins.store.path_for(engine.namespace, prefix_key(engine.namespace, HOUSE))
    assert path.exists()
    return engine, path


async def drained(engine: Engine) -> None:
    """Wait until the worker has run the commands posted so far (FIFO), then the store
    tasks they queued."""
    await engine._call(lambda: None)
    engine.pins.flush(20)


def manifest_names(engine: Engine) -> list[str]:
    assert engine.pins.store is not None
    return [e.name for e in engine.pins.store.read_manifest(engine.namespace)]


async def test_a_broken_manifest_keeps_the_files_and_is_set_aside(
    make_engine: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: an unreadable pins.json restored nothing, and the manifest written
    after the restore pruned every stored file."""
    _, path = await pin_and_close(make_engine, tmp_path)
    manifest = path.parent / "pins.json"
    manifest.write_bytes(b"")  # what a crash before the data reached the disk leaves
    caplog.set_level(logging.WARNING)
    second = make_engine(prefix_store=tmp_path)
    second.pins.flush(20)
    assert second.pin_names() == []
    assert path.exists()
    (aside,) = path.parent.glob("pins.json.*")
    assert aside.name.startswith("pins.json.corrupt-") and aside.read_bytes() == b""
    assert "keeping every stored file" in caplog.text
    # The client pins again (the engine's instance id changed): the kept file restores it.
    status = await second.pin("house", HOUSE)
    assert status.state == "ready" and status.restored
    second.pins.flush(20)
    assert manifest_names(second) == ["house"]


async def test_a_pin_that_no_longer_fits_stays_on_disk(make_engine: Any, tmp_path: Path) -> None:
    """Regression: after a restart with a lower --kv-cache-mb, a pin that did not fit was
    left out of the new manifest and its file pruned; raising the budget again could not
    bring it back."""
    first, path = await pin_and_close(make_engine, tmp_path)
    need = first.kv.layout.prefix_bytes(len(HOUSE))
    small = make_engine(prefix_store=tmp_path, kv_cache_bytes=need // 2)
    small.pins.flush(20)
    assert small.pin_names() == []
    assert path.exists()
    assert manifest_names(small) == ["house"]  # still listed: skipped, not dropped
    small.close()
    large = make_engine(prefix_store=tmp_path, kv_cache_bytes=BUDGET)
    assert large.pin_status("house")["restored"] is True


async def test_a_pin_kept_on_disk_can_be_unpinned(make_engine: Any, tmp_path: Path) -> None:
    first, path = await pin_and_close(make_engine, tmp_path)
    small = make_engine(
        prefix_store=tmp_path, kv_cache_bytes=first.kv.layout.prefix_bytes(len(HOUSE)) // 2
    )
    assert small.unpin("house")  # a pin kept on disk is a pin that can be removed
    await drained(small)
    assert manifest_names(small) == []
    assert not path.exists()


async def test_a_passing_read_error_at_start_keeps_the_pin(
    make_engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: an EIO while restoring deleted the file; now it is counted and kept."""
    _, path = await pin_and_close(make_engine, tmp_path)
    real = store_module.safe_open

    def failing_open(*args: object, **kwargs: object) -> object:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(store_module, "safe_open", failing_open)
    second = make_engine(prefix_store=tmp_path)
    second.pins.flush(20)
    assert second.pin_names() == []
    assert second.counters.store_failures == 1
    assert path.exists() and manifest_names(second) == ["house"]
    second.close()
    monkeypatch.setattr(store_module, "safe_open", real)
    third = make_engine(prefix_store=tmp_path)
    assert third.pin_status("house")["restored"] is True


async def test_a_second_engine_on_the_folder_restores_but_writes_nothing(
    make_engine: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: two engines on one folder pruned each other's files."""
    first = make_engine(prefix_store=tmp_path)
    assert (await first.pin("house", HOUSE)).state == "ready"
    first.pins.flush(20)
    caplog.set_level(logging.WARNING)
    second = make_engine(prefix_store=tmp_path)
    assert second.pin_status("house")["restored"] is True
    office = tokens(27, 60)
    assert (await second.pin("office", office)).state == "ready"  # served from memory
    assert second.unpin("house")
    await drained(second)
    assert manifest_names(first) == ["house"]
    assert first.pins.store is not None
    assert first.pins.store.load(first.namespace, HOUSE) is not None
    assert first.pins.store.load(first.namespace, office) is None
    assert "in use by another engine" in caplog.text


async def test_temporary_files_of_a_crash_are_swept_at_start(
    make_engine: Any, tmp_path: Path
) -> None:
    _, path = await pin_and_close(make_engine, tmp_path)
    stale = path.parent / ".tmp-abc123.safetensors"
    stale.write_bytes(b"half a file")
    old = time.time() - 60
    os.utime(stale, (old, old))
    make_engine(prefix_store=tmp_path)
    assert not stale.exists()
    assert path.exists()


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux's SCHED_IDLE")
async def test_the_store_writes_only_on_cores_nothing_else_wants(
    make_engine: Any, tmp_path: Path
) -> None:
    """A pin's file (100-200 MB to copy, checksum and write) is written by a thread the
    kernel runs only when the worker's threads leave a core idle: with the store on, as
    the add-on runs, writes beside a request had delayed its prefill."""
    engine = make_engine(prefix_store=tmp_path)
    assert (await engine.pin("house", HOUSE)).state == "ready"
    policy = engine.pins.disk._io.submit(lambda: os.sched_getscheduler(0)).result(20)
    assert policy == os.SCHED_IDLE
    assert os.sched_getscheduler(0) != os.SCHED_IDLE  # the caller's own thread is untouched
    engine.pins.flush(20)
    assert manifest_names(engine) == ["house"]


async def test_a_pins_file_waits_for_a_worker_without_requests(
    make_engine: Any, tmp_path: Path
) -> None:
    """A pin's file is written between requests, not beside them (persistence only has
    to outlive a restart); closing the engine writes what still waits, at once."""
    engine = make_engine(prefix_store=tmp_path)
    assert not engine._has_requests()  # the worker's own answer, read by the store
    requests = [True]
    engine.pins.disk.busy = lambda: requests[0]
    assert (await engine.pin("house", HOUSE)).state == "ready"
    assert engine.pins.store is not None
    path = engine.pins.store.path_for(engine.namespace, prefix_key(engine.namespace, HOUSE))
    await asyncio.sleep(0.3)
    assert not path.exists()  # held back while requests run
    requests[0] = False
    engine.pins.flush(20)
    assert path.exists()

    second = make_engine(prefix_store=tmp_path / "second")
    second.pins.disk.busy = lambda: True  # requests without end: closing writes anyway
    assert (await second.pin("house", HOUSE)).state == "ready"
    started = time.monotonic()
    second.close()
    assert time.monotonic() - started < 10
    assert second.pins.store is not None
    assert second.pins.store.path_for(
        second.namespace, prefix_key(second.namespace, HOUSE)
    ).exists()
