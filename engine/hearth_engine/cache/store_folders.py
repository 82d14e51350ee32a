"""The prefix store's folders: each namespace's manifest and the folder itself.

``PrefixStore`` (store.py) writes and reads the KV files; this half keeps the folder
they live in: the manifest of current pins (``pins.json``: versioned, synced, renamed
into place; ``prune`` deletes only what a read manifest no longer lists) and the folder's
ownership (its lock, a crash's ``.tmp-*`` files, a broken manifest moved aside). See
store.py's docstring for the rules both halves keep. ``StoreFolders`` is a base of
``PrefixStore`` and works on the state ``PrefixStore.__init__`` makes (declared below).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .store_lock import FolderLock

_LOGGER = logging.getLogger(__name__)

# What a write failure is called in the one warning it gets.
_WRITE_ERRORS = {
    errno.ENOSPC: "disk full",
    errno.EROFS: "read-only",
    errno.EACCES: "permission denied",
}

FORMAT = "hearth-kv/2"
MANIFEST = "pins.json"
KEY_RE = re.compile(r"^[0-9a-f]{64}$")  # a store key: sha256 hex


@dataclass(frozen=True)
class ManifestEntry:
    name: str
    key: str
    tokens: int


class ManifestError(ValueError):
    """A manifest that is there but cannot be read (or not as a manifest of its namespace)."""


@dataclass
class FolderState:
    """What this store may do in one namespace's folder, settled when it first uses it."""

    lock: FolderLock
    owner: bool  # holds the lock: may write, sweep and delete
    prunable: bool  # a manifest was read (or there was nothing to list): unlisted files may go
    manifest_ok: bool  # a manifest may be written (the old one read, or moved aside)


class StoreFolders:
    """The manifest and folder half of ``PrefixStore`` (see the module docstring)."""

    root: Path
    writable: bool
    _opened_at: float
    _lock: threading.RLock
    _folders: dict[str, FolderState]
    _handed_out: dict[str, int]
    _written: dict[str, int]
    _saved_at: dict[Path, int]
    _warned: set[str]

    def _warn_cannot_write(self, err: OSError) -> None:
        """One warning per kind of write failure (a full disk, a read-only file system)."""
        reason = _WRITE_ERRORS.get(err.errno or 0, err.strerror or str(err))
        self._warn_once(
            f"save:{reason}",
            f"prefix store {self.root}: cannot write ({reason}); serving pins from memory only",
        )

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            _LOGGER.warning(message)

    def _discard(self, path: Path) -> None:
        with contextlib.suppress(OSError):
            path.unlink()

    def folder(self, namespace: str) -> Path:
        """The folder of ``namespace``'s files (it may not exist yet)."""
        return self.root / hashlib.sha256(namespace.encode()).hexdigest()[:16]

    # -- manifest of current pins ------------------------------------------------------

    def read_manifest(self, namespace: str) -> list[ManifestEntry]:
        """The pins ``namespace``'s manifest lists; [] if it is absent or unreadable (logged)."""
        try:
            manifest = self._parse_manifest(namespace)
        except ManifestError as err:
            _LOGGER.warning("Ignoring %s (%s)", self.folder(namespace) / MANIFEST, err)
            return []
        return [] if manifest is None else manifest[0]

    def _parse_manifest(self, namespace: str) -> tuple[list[ManifestEntry], int] | None:
        """The pins and version of ``namespace``'s manifest; None if there is none.

        ManifestError if it is there but cannot be read, in whole or in part: a manifest
        that is not fully understood never decides which files go.
        """
        path = self.folder(namespace) / MANIFEST
        try:
            data = json.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError, RecursionError) as err:
            raise ManifestError(str(err) or type(err).__name__) from err
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ManifestError("not a manifest of this format")
        if data.get("namespace") != namespace:
            raise ManifestError("the manifest of another namespace")
        version = data.get("version", 0)
        if not isinstance(version, int):
            raise ManifestError("bad version")
        try:
            entries = [
                ManifestEntry(str(e["name"]), str(e["key"]), int(e["tokens"]))
                for e in data.get("pins", [])
            ]
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as err:
            raise ManifestError(f"bad pin entry ({err!r})") from err
        # A key that cannot name a file names nothing to keep: that entry alone is dropped.
        return [e for e in entries if KEY_RE.match(e.key)], version

    def _file_version(self, namespace: str) -> int:
        try:
            manifest = self._parse_manifest(namespace)
        except ManifestError:
            return 0
        return 0 if manifest is None else manifest[1]

    def next_version(self, namespace: str) -> int:
        """A version for a new manifest snapshot, above every earlier one (also on disk).

        Take it in the same critical section as the snapshot itself: versions order the
        snapshots, and ``write_manifest`` ignores one older than the last written.
        """
        with self._lock:
            if namespace not in self._handed_out:
                self._handed_out[namespace] = self._file_version(namespace)
            self._handed_out[namespace] += 1
            return self._handed_out[namespace]

    def write_manifest(self, namespace: str, entries: list[ManifestEntry], version: int) -> bool:
        """Write ``entries`` as the manifest of ``namespace``, unless a newer one is there.

        Returns True if it was written; False if ``version`` is not newer than the last
        manifest written (in this process or on disk), or the write failed (warned once).
        """
        if not self.writable:
            return False
        with self._lock:
            if version > self._handed_out.get(namespace, 0):
                raise ValueError("manifest versions come from next_version")
            claimed = self._claim(namespace)
            if not claimed.owner or not claimed.manifest_ok:
                return False
            if version <= max(self._written.get(namespace, 0), self._file_version(namespace)):
                _LOGGER.debug("Skipping manifest version %d: a newer one is written", version)
                return False
            data = {
                "format": FORMAT,
                "namespace": namespace,
                "version": version,
                "pins": [{"name": e.name, "key": e.key, "tokens": e.tokens} for e in entries],
            }
            folder = self.folder(namespace)
            tmp = None
            try:
                folder.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=folder)
                with os.fdopen(fd, "w") as handle:
                    json.dump(data, handle)
                    handle.flush()
                    os.fsync(handle.fileno())  # its data on disk before its name
                os.replace(tmp, folder / MANIFEST)
                tmp = None
                sync_folder(folder)  # and the rename itself
            except OSError as err:
                self._warn_once(
                    "manifest", f"prefix store {self.root}: cannot write {MANIFEST} ({err})"
                )
                return False
            finally:
                if tmp is not None:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
            self._written[namespace] = version
            return True

    def prune(self, namespace: str, keep: set[str], version: int) -> None:
        """Delete ``namespace``'s stored prefixes that manifest ``version`` does not list.

        Does nothing unless ``version`` is the manifest last written, and keeps files
        saved after that version was handed out (a snapshot cannot know about them).
        Files of other namespaces are never touched, and none at all in a run that found
        the manifest unreadable, or missing while files were there.
        """
        if not self.writable:
            return
        with self._lock:
            if self._written.get(namespace) != version:
                return
            claimed = self._claim(namespace)
            if not claimed.owner or not claimed.prunable:
                return
            self._drop_legacy()
            for path in self.folder(namespace).glob("*.safetensors"):
                if path.stem in keep or not KEY_RE.match(path.stem):
                    continue
                if self._saved_at.get(path, -1) >= version:
                    continue
                self._saved_at.pop(path, None)
                self._discard(path)

    def _drop_legacy(self) -> None:
        """Delete files of the flat ``hearth-kv/1`` layout: nothing can read them now."""
        legacy = [p for p in self.root.glob("*.safetensors") if KEY_RE.match(p.stem)]
        legacy += [p for p in [self.root / MANIFEST] if p.is_file()]
        if legacy:
            _LOGGER.info("Deleting %d prefix store file(s) of an older format", len(legacy))
        for path in legacy:
            self._discard(path)

    # -- the folder: its lock, a crash's leftovers, a broken manifest -------------------

    def _claim(self, namespace: str) -> FolderState:
        """What this store may do in ``namespace``'s folder, settled on first use."""
        with self._lock:
            known = self._folders.get(namespace)
            if known is not None:
                return known
            path = self.folder(namespace)
            lock = FolderLock(path)
            owner = self.writable and self._acquire(lock)
            if owner:
                self._sweep_temporary(path)
            try:
                manifest, problem = self._parse_manifest(namespace), None
            except ManifestError as err:
                manifest, problem = None, str(err)
            if problem is not None:
                prunable, manifest_ok = False, owner and self._set_aside(namespace, problem)
                if not owner:
                    _LOGGER.warning(
                        "Prefix store: %s is unreadable (%s); keeping every stored file",
                        path / MANIFEST,
                        problem,
                    )
            else:
                prunable, manifest_ok = manifest is not None or not self._has_files(path), True
                if not prunable:
                    _LOGGER.warning(
                        "Prefix store %s holds files but no %s; keeping them all", path, MANIFEST
                    )
            claimed = FolderState(lock, owner, prunable, manifest_ok)
            self._folders[namespace] = claimed
            return claimed

    def _acquire(self, lock: FolderLock) -> bool:
        try:
            if lock.acquire():
                return True
        except OSError as err:  # the lock file cannot be made: nothing can be written there
            self._warn_cannot_write(err)
            return False
        _LOGGER.warning(
            "Prefix store %s is in use by another engine: restoring its pins, but writing "
            "and deleting nothing there (give each engine its own --prefix-store)",
            lock.path.parent,
        )
        return False

    def _sweep_temporary(self, folder: Path) -> None:
        """Delete ``.tmp-*`` files older than this store: a crashed write's (under the
        folder's lock, nobody else is writing there)."""
        swept = 0
        for path in folder.glob(".tmp-*"):
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < self._opened_at:
                    path.unlink()
                    swept += 1
        if swept:
            _LOGGER.info("Deleted %d unfinished prefix store file(s) of an earlier run", swept)

    def _set_aside(self, namespace: str, problem: str) -> bool:
        """Move an unreadable manifest out of the way (kept for a look); whether it moved,
        so that a new manifest can be written without losing it."""
        path = self.folder(namespace) / MANIFEST
        aside = path.with_name(f"{MANIFEST}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
        try:
            os.replace(path, aside)
            sync_folder(path.parent)
        except FileNotFoundError:
            return True
        except OSError as err:
            _LOGGER.warning(
                "Prefix store: %s is unreadable (%s); keeping every stored file, and the "
                "manifest as it is: it cannot be moved aside (%s), so none is written",
                path,
                problem,
                err,
            )
            return False
        _LOGGER.warning(
            "Prefix store: %s is unreadable (%s); keeping every stored file; it is now %s",
            path,
            problem,
            aside.name,
        )
        return True

    @staticmethod
    def _has_files(folder: Path) -> bool:
        return any(KEY_RE.match(p.stem) for p in folder.glob("*.safetensors"))


def sync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable, where the file system can sync a folder."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)
