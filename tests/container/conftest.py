"""The engine's container image and its launcher (addon/).

The launcher tests run anywhere. The image tests build ``addon/Dockerfile`` with
``scripts/image`` (podman, offline) and run the real container; where podman cannot
run containers here they skip and say why.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from hearth_bench.container import build_image

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = ROOT / "addon" / "rootfs" / "usr" / "local" / "bin" / "hearth-addon"


@pytest.fixture(scope="session")
def launcher() -> ModuleType:
    """The add-on's launcher script, imported as a module (it has no .py suffix)."""
    loader = importlib.machinery.SourceFileLoader("hearth_addon", str(LAUNCHER))
    spec = importlib.util.spec_from_loader("hearth_addon", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def image() -> str:
    """The image's tag, built (or found in podman's cache) by scripts/image."""
    check = subprocess.run(
        [ROOT / "scripts" / "image", "--check"], capture_output=True, text=True, check=False
    )
    if check.returncode != 0:
        lines = (check.stderr or check.stdout).strip().splitlines() or ["no output"]
        pytest.skip(f"podman cannot run containers here: {lines[-1]}")
    return build_image()
