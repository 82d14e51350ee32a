"""The engine's torch-free parts, on any Python the package supports.

``scripts/test`` runs this folder twice: with the engine's env (Python 3.11, torch) and
with Home Assistant's (Python 3.14, no torch), so ``pip install ./engine`` on 3.13+
installs code that runs there. The cache bookkeeping, the request schemas and the
Host/Origin guard must import without torch.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

TORCH_FREE = (
    "hearth_engine.cache.radix",
    "hearth_engine.cache.budget",
    "hearth_engine.constraints.limits",
    "hearth_engine.server.errors",
    "hearth_engine.server.guard",
    "hearth_engine.server.schemas",
)


@pytest.mark.parametrize("name", TORCH_FREE)
def test_imports_without_torch(name: str) -> None:
    """In a fresh interpreter, so an earlier test's torch import cannot hide one."""
    code = f"import sys, {name}; sys.exit('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr or f"{name} imports torch"


def test_guard_on_this_python() -> None:
    guard = importlib.import_module("hearth_engine.server.guard")
    assert guard.split_host("[::1]:8765") == "::1"
    built = guard.Guard.build(api_key=None, allowed_hosts=["hearth.lan"], allowed_origins=[])
    assert built.host_allowed("hearth.lan")
    assert built.host_allowed("localhost")
    assert not built.host_allowed("evil.example")


def test_schema_limits_on_this_python() -> None:
    limits = importlib.import_module("hearth_engine.constraints.limits")
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert 0 < limits.schema_bytes(tools) < limits.DEFAULT_LIMITS.max_schema_bytes
