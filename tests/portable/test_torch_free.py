"""The engine's torch-free parts, on any Python the package supports.

``scripts/test`` runs this folder twice: with the engine's env (Python 3.11, torch) and
with Home Assistant's (Python 3.14, no torch), so ``pip install ./engine`` on 3.13+
installs code that runs there. The cache bookkeeping, the request schemas, the
Host/Origin guard and ``HEARTH_CPU`` (which the package applies before torch is
imported) must import without torch.
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
    "hearth_engine.cpu_class",
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


def test_cpu_class_on_this_python() -> None:
    """``HEARTH_CPU`` is read before torch: its choice and refusal need none."""
    cpu_class = importlib.import_module("hearth_engine.cpu_class")
    flags = "avx avx2 bmi1 bmi2 f16c fma abm movbe xsave sse4_1 sse4_2 ssse3 popcnt cx16 lahf_lm"
    assert cpu_class.resolve("avx2", flags.split(), "x86_64").name == "avx2"
    with pytest.raises(cpu_class.CpuClassError, match="lacks amx_bf16"):
        cpu_class.resolve("amx", flags.split(), "x86_64")
    assert cpu_class.host_class(flags.split(), "x86_64") == "avx2"
    assert cpu_class.environment(cpu_class.AVX2)["ATEN_CPU_CAPABILITY"] == "avx2"
    assert cpu_class.apply_environment({"HEARTH_CPU": "avx3"}) is None
