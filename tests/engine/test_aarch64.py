"""The C++ kernels on aarch64 (Home Assistant Green and Yellow, Raspberry Pis), checked
on an x86 machine: ``scripts/lib/aarch64_check.sh`` cross-compiles them against an aarch64
torch and runs the kernel exactness tests in an aarch64 Python under qemu (emulation:
correctness, not speed). Minutes cold, about two warm; skipped where its tools are
missing (``apt-get install -y g++-aarch64-linux-gnu qemu-user-static``).
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "lib" / "aarch64_check.sh"
TOOLS = ("aarch64-linux-gnu-g++", "qemu-aarch64-static", "apt-get", "dpkg-deb")
MISSING = [tool for tool in TOOLS if shutil.which(tool) is None]


@pytest.mark.skipif(
    platform.machine() != "x86_64",
    reason="the emulated check runs on x86 hosts; on aarch64 the kernel tests run natively",
)
@pytest.mark.skipif(
    bool(MISSING),
    reason=f"no {', '.join(MISSING)}: apt-get install -y g++-aarch64-linux-gnu qemu-user-static",
)
@pytest.mark.timeout(3600)
def test_the_kernels_build_and_pass_their_exactness_tests_on_aarch64() -> None:
    done = subprocess.run(
        ["bash", str(SCRIPT), "-q", "-rs"], capture_output=True, text=True, check=False
    )
    tail = (done.stdout + done.stderr)[-6000:]
    assert done.returncode == 0, tail
    # the inner run's summary: kernel tests ran under emulation, none failed
    summary = re.search(r"(\d+) passed", done.stdout)
    assert summary is not None, tail
    assert int(summary.group(1)) >= 30, tail
    assert "failed" not in done.stdout.splitlines()[-1], tail
    assert "aarch64" in done.stderr, tail  # the script's log names what it built
