"""One writer per prefix-store folder: an exclusive ``flock`` on a lock file inside it.

The lock is held from the first time a store writes to a folder until the store is
closed (or the process exits: the kernel drops a dead process's locks, so a crash never
leaves a folder locked). ``flock`` locks belong to an open file, so two stores in one
process exclude each other as two processes do.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import weakref
from pathlib import Path

LOCK_FILE = ".lock"


class FolderLock:
    """A non-blocking exclusive lock on ``folder``; ``acquire`` says whether it is held."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / LOCK_FILE
        self._fd: int | None = None
        self._finalizer: weakref.finalize | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> bool:
        """Take the lock if no one else holds it. OSError if the lock file cannot be made."""
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except OSError:
            os.close(fd)
            raise
        self._fd = fd
        # A store dropped without close() still lets go of its folder.
        self._finalizer = weakref.finalize(self, _close_quietly, fd)
        return True

    def release(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        self._fd, self._finalizer = None, None


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)  # closing the only descriptor of the open file drops the lock
