"""Where the household fixture of a scaled demo house is kept, keyed by what made it.

``scripts/bench household --house-scale N`` replays prompts captured from the demo house
with N guest suites. The committed fixture (``bench/fixtures/household.json``) stays the
plain house's; a scaled one is captured on first use into
``~/.cache/hearth/household/house-scale-N-<model>-<key>.json`` (``HEARTH_CACHE_DIR`` moves
the cache). The key is a hash of everything the prompts follow from: N, the model (the
plugin fits a house too big for the model's context to it), the files of ``config/``
(house.yaml, configuration.yaml, the demo integration, scale.py among them), the plugin's
sources, the capture's own code and Home Assistant's version. Change any of them and the
next run captures again; the older file is left where it is.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

from .harness.stack import ROOT, RUNTIME_FILES

KEY_CHARS = 16
CAPTURE_SOURCES = (
    "harness/capture.py",
    "harness/fixture.py",
    "harness/proxy.py",
    "harness/stack.py",
    "house_scale.py",
)


def cache_dir() -> Path:
    """``$HEARTH_CACHE_DIR`` or ``~/.cache/hearth``, as scripts/lib/common.sh has it."""
    return Path(os.environ.get("HEARTH_CACHE_DIR") or Path.home() / ".cache" / "hearth")


def ha_version(root: Path = ROOT) -> str:
    """The version of Home Assistant in ``.venv/ha`` (its dist-info folder), or ``unknown``."""
    found = sorted((root / ".venv" / "ha" / "lib").glob("python*/site-packages/homeassistant-*"))
    infos = [p.name for p in found if p.name.endswith(".dist-info")]
    if not infos:
        return "unknown"
    return infos[-1].removeprefix("homeassistant-").removesuffix(".dist-info")


def _files(folder: Path, skip: set[str] = frozenset()) -> Iterator[Path]:
    """The files under ``folder`` in a fixed order: no byte code, no folder linked in, and
    nothing at the top whose name is in ``skip`` or starts with ``home-assistant``."""
    for top, dirs, names in os.walk(folder):  # links to folders are listed, not entered
        here = Path(top)
        kept = (n for n in names if here != folder or not _skipped(n, skip))
        dirs[:] = sorted(
            d for d in dirs if d != "__pycache__" and (here != folder or not _skipped(d, skip))
        )
        for name in sorted(kept):
            path = here / name
            if path.is_file() and not path.is_symlink() and path.suffix != ".pyc":
                yield path


def _skipped(name: str, skip: set[str]) -> bool:
    return name in skip or name.startswith("home-assistant")


def inputs(root: Path = ROOT) -> Iterator[Path]:
    """The files a capture's prompts follow from (config/ without what a run writes)."""
    # config/custom_components/hearth is a link (not entered): the plugin comes next.
    yield from _files(root / "config", RUNTIME_FILES | {"README.md"})
    yield from _files(root / "custom_components" / "hearth")
    bench = root / "bench" / "hearth_bench"
    yield from (bench / name for name in CAPTURE_SOURCES)


def model_name(model: str) -> str:
    """A model as the key takes it: a name as given, a folder or file by its full path."""
    return model if re.fullmatch(r"[\w.-]+", model) else str(Path(model).resolve())


def fixture_key(rooms: int, model: str, root: Path = ROOT) -> str:
    """The hash of the inputs of a capture of the house with ``rooms`` guest suites."""
    head = f"house-scale {rooms}\nmodel {model_name(model)}\nha {ha_version(root)}\n"
    digest = hashlib.sha256(head.encode())
    for path in inputs(root):
        digest.update(f"{path.relative_to(root)}\n".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:KEY_CHARS]


def fixture_path(rooms: int, model: str, root: Path = ROOT) -> Path:
    """Where the fixture of the house with ``rooms`` guest suites, captured with
    ``model``, is (or will be) kept."""
    label = re.sub(r"[^\w.-]+", "_", Path(model).name) or "model"
    key = fixture_key(rooms, model, root)
    return cache_dir() / "household" / f"house-scale-{rooms}-{label}-{key}.json"
