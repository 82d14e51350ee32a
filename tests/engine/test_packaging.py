"""``pip install ./engine`` on the Pythons users have: 3.13 (Debian 13) and 3.14 (Home
Assistant's own). PyPI's torch for them is the multi-GB CUDA build, so pip resolves
(``--dry-run``) rather than installs; the torch-free parts run on 3.14 in
``tests/portable`` (scripts/test runs that folder with Home Assistant's env).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _pythons() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for version in ("3.13", "3.14"):
        pyenv = Path.home().glob(f".pyenv/versions/{version}*/bin/python")
        candidates: list[str | None] = sorted(str(p) for p in pyenv)
        candidates.append(shutil.which(f"python{version}"))
        if version == "3.14":  # scripts/setup's private interpreter, for Home Assistant
            candidates.append(str(ROOT / ".venv" / "ha" / "bin" / "python"))
        for candidate in filter(None, candidates):
            if _runs(candidate):
                found[version] = Path(candidate)
                break
    return found


def _runs(python: str) -> bool:  # a pyenv shim without that version fails here
    done = subprocess.run([python, "-c", "pass"], capture_output=True, check=False)
    return done.returncode == 0


def _resolve(python: Path, tmp: Path) -> dict:
    report = tmp / f"report-{python.stat().st_ino}.json"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--dry-run",
         "--ignore-installed", "--quiet", "--report", str(report), str(ROOT / "engine")],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(report.read_text())


def test_engine_resolves_on_python_3_13_and_3_14(tmp_path: Path) -> None:
    pythons = _pythons()
    if not pythons:
        pytest.skip("no Python 3.13 or 3.14 on this machine")
    with ThreadPoolExecutor(len(pythons)) as pool:
        reports = dict(
            zip(pythons, pool.map(lambda p: _resolve(p, tmp_path), pythons.values()), strict=True)
        )
    for version, report in reports.items():
        assert report["environment"]["python_version"] == version
        names = {item["metadata"]["name"].lower() for item in report["install"]}
        assert {"hearth-engine", "torch", "transformers", "llguidance"} <= names, version
