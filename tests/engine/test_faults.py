"""Storage faults: a full disk or a read-only store never stops the engine serving.

These mount real small tmpfs file systems (a 64 KiB one that fills up, and a read-only
one), so the engine meets the real ENOSPC and EROFS errors. Mounting needs root (CI runs
as root); elsewhere the tests skip and say why.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hearth_engine.server.metrics import engine_stats
from hearth_engine.serving.sampling import SamplingParams

from .test_engine import tokens


@contextlib.contextmanager
def tmpfs(path: Path, *, size_kb: int, read_only: bool = False) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def store_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "cannot write" in r.getMessage()]


@pytest.mark.parametrize(("read_only", "reason"), [(False, "disk full"), (True, "read-only")])
async def test_store_failure_warns_once_and_keeps_serving(
    make_engine, tmp_path: Path, caplog: pytest.LogCaptureFixture, read_only: bool, reason: str
) -> None:
    caplog.set_level(logging.WARNING)
    with tmpfs(tmp_path / "store", size_kb=64, read_only=read_only) as store:
        engine = make_engine(prefix_store=store)
        for i in range(3):  # each pin is ~300 KiB of KV: it can never be written
            house = tokens(300 + i, 300)
            status = await engine.pin(f"house{i}", house)
            assert status.state == "ready"
            _, _, fin = await engine.generate(house + [4, 5], SamplingParams(max_tokens=2))
            assert (fin.stats.cached_tokens, fin.stats.pin) == (300, f"house{i}")
        await engine.shutdown()
        assert engine_stats(engine)["store_failures_total"] >= (0 if read_only else 3)
    warnings = store_warnings(caplog)
    assert len(warnings) >= 1
    assert len(set(warnings)) == len(warnings)  # each kind of failure is reported once
    assert any(reason in w for w in warnings)
