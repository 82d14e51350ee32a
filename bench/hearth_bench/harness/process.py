"""Waiting for a child server process to answer ``/health`` (standard library only: the
Home Assistant venv imports it too, through ``llama_server.py``)."""

from __future__ import annotations

import contextlib
import subprocess
import time
import urllib.error
import urllib.request


class ServerStartError(RuntimeError):
    """The child exited, or did not answer ``/health`` with 200 in time."""


def wait_healthy(proc: subprocess.Popen[bytes], url: str, timeout: float, name: str) -> None:
    """Return once ``url/health`` answers 200; raise ``ServerStartError`` if ``proc``
    exits first or ``timeout`` seconds pass (the caller stops it and adds its log)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerStartError(f"{name} exited with {proc.returncode}")
        with (
            contextlib.suppress(OSError, urllib.error.URLError),
            urllib.request.urlopen(f"{url}/health", timeout=2) as response,
        ):
            if response.status == 200:
                return
        time.sleep(0.2)
    raise ServerStartError(f"{name} not healthy after {timeout:.0f} s")
