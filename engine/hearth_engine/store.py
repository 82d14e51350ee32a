"""On-disk store of pinned prefixes (safetensors), so a restart restores instead of recomputing.

* A file is named by ``sha256(namespace + tokens)``: reproducible across restarts, and
  a pin name never becomes part of a path.
* Each file carries its namespace and token ids; a load verifies both, so a file from
  another model, a truncated file or a corrupt one is logged, ignored and rebuilt.
* Writes go to a temporary file that is renamed into place. If the disk is full or
  read-only, the engine keeps serving from memory and warns once per kind of error.
* ``pins.json`` lists the current pins (name → file), so the engine can restore them
  at start-up before any client asks.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from safetensors.torch import save as serialize

_LOGGER = logging.getLogger(__name__)

FORMAT = "hearth-kv/1"
MANIFEST = "pins.json"
_KEY_RE = re.compile(r"^[0-9a-f]{64}$")


def prefix_key(namespace: str, tokens: list[int] | tuple[int, ...]) -> str:
    digest = hashlib.sha256()
    digest.update(FORMAT.encode())
    digest.update(b"\0")
    digest.update(namespace.encode())
    digest.update(b"\0")
    digest.update(",".join(map(str, tokens)).encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class ManifestEntry:
    name: str
    key: str
    tokens: int


class PrefixStore:
    """Reads and writes pinned KV under one folder. All methods are thread-compatible."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._warned: set[str] = set()
        self.writable = True
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            self._warn_once(
                "mkdir", f"prefix store {root} cannot be created ({err}); pins stay in memory only"
            )
            self.writable = False

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            _LOGGER.warning(message)

    def path_for(self, key: str) -> Path:
        if not _KEY_RE.match(key):
            raise ValueError("bad store key")
        return self.root / f"{key}.safetensors"

    def save(self, namespace: str, tokens: list[int], kv: torch.Tensor) -> bool:
        """Write the KV of ``tokens``; returns False (after one warning) when it cannot."""
        if not self.writable:
            return False
        key = prefix_key(namespace, tokens)
        target = self.path_for(key)
        if target.exists():
            return True
        tensors = {
            "kv": kv.detach().to("cpu").contiguous(),
            "tokens": torch.tensor(tokens, dtype=torch.int64),
        }
        metadata = {"format": FORMAT, "namespace": namespace, "n_tokens": str(len(tokens))}
        # Serialize in memory, then write with plain file I/O: the OS error (ENOSPC,
        # EROFS, ...) arrives as an OSError with its errno, not as a serializer error.
        data = serialize(tensors, metadata=metadata)
        tmp_name = None
        try:
            fd, tmp_name = tempfile.mkstemp(prefix=".tmp-", suffix=".safetensors", dir=self.root)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp_name, target)
            tmp_name = None
            return True
        except OSError as err:
            kind = {
                errno.ENOSPC: "disk full",
                errno.EROFS: "read-only",
                errno.EACCES: "permission denied",
            }
            reason = kind.get(err.errno or 0, err.strerror or str(err))
            self._warn_once(
                f"save:{reason}",
                f"prefix store {self.root}: cannot write ({reason}); serving pins from memory only",
            )
            return False
        finally:
            if tmp_name is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp_name)

    def load(self, namespace: str, tokens: list[int]) -> torch.Tensor | None:
        """The stored KV of ``tokens``, or None if absent or unusable (logged)."""
        path = self.path_for(prefix_key(namespace, tokens))
        if not path.exists():
            return None
        try:
            with open(path, "rb") as handle:
                header_len = int.from_bytes(handle.read(8), "little")
                meta = json.loads(handle.read(header_len)).get("__metadata__", {})
            if meta.get("format") != FORMAT or meta.get("namespace") != namespace:
                raise ValueError("written by another model or format")
            data = load_file(path)
            stored = data["tokens"].tolist()
            if stored != list(tokens):
                raise ValueError("token ids differ")
            kv = data["kv"]
            if kv.dim() != 5 or kv.shape[3] != len(tokens):
                raise ValueError(f"unexpected KV shape {tuple(kv.shape)}")
            return kv
        except (OSError, ValueError, KeyError, SafetensorError, RuntimeError) as err:
            _LOGGER.warning(
                "Ignoring prefix store file %s (%s); it will be rebuilt", path.name, err
            )
            self._discard(path)
            return None

    def _discard(self, path: Path) -> None:
        with contextlib.suppress(OSError):
            path.unlink()

    def remove(self, namespace: str, tokens: list[int] | tuple[int, ...]) -> None:
        self._discard(self.path_for(prefix_key(namespace, tokens)))

    # -- manifest of current pins ------------------------------------------------------

    def read_manifest(self, namespace: str) -> list[ManifestEntry]:
        path = self.root / MANIFEST
        try:
            data: dict[str, Any] = json.loads(path.read_text())
            if data.get("namespace") != namespace:
                return []
            return [
                ManifestEntry(str(e["name"]), str(e["key"]), int(e["tokens"]))
                for e in data.get("pins", [])
                if _KEY_RE.match(str(e.get("key", "")))
            ]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            _LOGGER.warning("Ignoring %s (%s)", path, err)
            return []

    def load_by_key(self, namespace: str, key: str) -> tuple[list[int], torch.Tensor] | None:
        """Load a stored prefix by file key (for start-up restore from the manifest)."""
        path = self.path_for(key)
        if not path.exists():
            return None
        try:
            tokens = load_file(path)["tokens"].tolist()
        except (OSError, ValueError, KeyError, SafetensorError, RuntimeError) as err:
            _LOGGER.warning(
                "Ignoring prefix store file %s (%s); it will be rebuilt", path.name, err
            )
            self._discard(path)
            return None
        if prefix_key(namespace, tokens) != key:
            return None
        kv = self.load(namespace, tokens)
        return None if kv is None else (tokens, kv)

    def write_manifest(self, namespace: str, entries: list[ManifestEntry]) -> None:
        if not self.writable:
            return
        data = {
            "namespace": namespace,
            "pins": [{"name": e.name, "key": e.key, "tokens": e.tokens} for e in entries],
        }
        target = self.root / MANIFEST
        try:
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=self.root)
            with os.fdopen(fd, "w") as handle:
                json.dump(data, handle)
            os.replace(tmp, target)
        except OSError as err:
            self._warn_once(
                "manifest", f"prefix store {self.root}: cannot write {MANIFEST} ({err})"
            )

    def prune(self, keep: set[str]) -> None:
        """Delete stored prefixes that no current pin uses."""
        if not self.writable:
            return
        for path in self.root.glob("*.safetensors"):
            if path.stem not in keep and _KEY_RE.match(path.stem):
                self._discard(path)
