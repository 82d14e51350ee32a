"""Where Hearth keeps prepared models, and how a build lands there atomically."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

MARKER = "hearth-build.json"
"""Written last into a finished model folder; a folder without it is an unfinished build."""


def cache_root() -> Path:
    """``$HEARTH_CACHE_DIR`` or ``~/.cache/hearth``."""
    env = os.environ.get("HEARTH_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "hearth"


def models_dir() -> Path:
    return cache_root() / "models"


def is_built(folder: Path, version: str) -> bool:
    marker = folder / MARKER
    try:
        return json.loads(marker.read_text()).get("version") == version
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_once(folder: Path, version: str, build: Callable[[Path], None]) -> Path:
    """Run ``build(tmpdir)`` unless ``folder`` already holds this ``version``.

    The build writes into a temporary sibling folder which is renamed into place, so a
    crash never leaves a half-written model that looks finished. A file lock makes
    concurrent callers (two test sessions) wait for one build instead of racing.
    """
    if is_built(folder, version):
        return folder
    with _locked(folder.parent / f".{folder.name}.lock"):
        if is_built(folder, version):
            return folder
        # Holding the lock, any temporary folder left here is from a build that was
        # killed before it could clean up.
        for stale in folder.parent.glob(f".{folder.name}.*"):
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
        try:
            build(tmp)
            (tmp / MARKER).write_text(json.dumps({"version": version}))
            if folder.exists():
                shutil.rmtree(folder)
            tmp.rename(folder)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return folder
