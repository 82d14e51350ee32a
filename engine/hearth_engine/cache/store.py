"""On-disk store of pinned prefixes (safetensors), so a restart restores instead of recomputing.

Layout: one folder per namespace (model fingerprint + dtype + salt), named by a hash of
it, holding that namespace's KV files and its manifest::

    root/<sha256(namespace)[:16]>/<key>.safetensors   the KV of one pinned prefix
    root/<sha256(namespace)[:16]>/pins.json           the current pins (name -> key)

* A namespace only ever reads, writes and prunes its own folder: the same store after a
  ``--dtype`` change keeps the other dtype's pins.
* A file is named by ``sha256(format + namespace + tokens)``: reproducible across
  restarts, and a pin name never becomes part of a path.
* A file holds its token ids, its KV as one or more ``[L, 2, H, T_i, D]`` pieces in token
  order (``kv.0``, ``kv.1``, ...: a pin's cached segments are written as they are, never
  concatenated first), and metadata: format, namespace, token count and a CRC-32 of all
  tensor bytes. A load reads the file once, through safetensors' own reader, and checks
  all of it, so a file from another model, a truncated, garbled or bit-flipped one is
  logged, deleted and rebuilt; it never raises. A read that fails for a reason that may
  pass (EIO, EMFILE, EACCES...) deletes nothing: it is logged and counted.
* A model with sliding-window layers (``keep_windows``) keeps, for those layers, only
  the last ``window`` tokens, as the cache does (``KVManager``): the ``kv.i`` pieces
  hold the other layers, and a ``window`` tensor ``[Ls, 2, H, w, D]`` the sliding ones'
  tail. A load gives both back as they are (``StoredPrefix.window``).
* A hybrid model (``keep_states``) also stores the state of its state layers at the
  prefix's end (``state.conv.i``, ``state.recurrent.i``, in their own dtypes): without
  it the KV could not be resumed, so a file without it is unusable for such a model.
* Writes go to a temporary file that is renamed into place. If the disk is full or
  read-only, the engine keeps serving from memory and warns once per kind of error.
* Manifests carry a version from ``next_version``; an older snapshot that arrives after
  a newer one is ignored, and so is its ``prune``. A manifest is synced before it is
  renamed into place, and its folder after.
* Nothing is deleted on a guess. The first time a store uses a folder (``open``, or its
  first write) it takes the folder's lock (``store_lock``): without it, another engine
  owns the folder, and this store only reads. With it, the store sweeps ``.tmp-*`` files
  older than itself (a crash's), and reads the manifest: only after a manifest it could
  read does it ``prune``. An unreadable one is moved aside (``pins.json.corrupt-<time>``)
  and every file is kept for the rest of the run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
from safetensors import SafetensorError, safe_open

from .store_folders import FORMAT, KEY_RE, FolderState, ManifestEntry, StoreFolders, sync_folder

_LOGGER = logging.getLogger(__name__)


_CHECKSUM_PLACEHOLDER = "crc32:00000000"
# safetensors dtype names of the tensors this store writes.
_DTYPES = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float64: "F64",
    torch.int64: "I64",
}
_TORCH_DTYPES = {name: dtype for dtype, name in _DTYPES.items()}
# What a malformed file can raise from safetensors, json, int() or torch while it is read
# (an OSError is not one: the disk, not the file, may be at fault).
_UNREADABLE = (
    ValueError,
    KeyError,
    TypeError,
    OverflowError,
    SafetensorError,
    RuntimeError,
)


def prefix_key(namespace: str, tokens: Sequence[int]) -> str:
    digest = hashlib.sha256()
    digest.update(FORMAT.encode())
    digest.update(b"\0")
    digest.update(namespace.encode())
    digest.update(b"\0")
    digest.update(",".join(map(str, tokens)).encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class Windows:
    """Which layers slide (indices of ``layers``) and over how many tokens."""

    layers: int
    sliding: tuple[int, ...]
    window: int

    @property
    def full(self) -> list[int]:
        return [i for i in range(self.layers) if i not in self.sliding]

    def kept(self, tokens: int) -> int:
        """Tokens of sliding KV a prefix of ``tokens`` keeps."""
        return min(self.window, tokens)


@dataclass(frozen=True)
class StoredPrefix:
    """What a store file holds: token ids, ``[L, 2, H, T, D]`` KV (of the full layers
    only, with ``window`` the sliding layers' tail, for a model with sliding windows),
    and named state tensors."""

    tokens: list[int]
    kv: torch.Tensor
    state: dict[str, torch.Tensor]
    window: torch.Tensor | None = None


class UnusableFileError(ValueError):
    """A store file that parses but does not hold what it should."""


def _raw(tensor: torch.Tensor) -> Any:
    """The bytes of a contiguous CPU tensor, as a buffer (no copy)."""
    return tensor.reshape(-1).view(torch.uint8).numpy()


# numpy's integer of each element size: numpy has no bfloat16, so bytes go through these.
_SAME_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _runs_for_writing(tensor: torch.Tensor) -> Iterator[np.ndarray]:
    """The bytes of any tensor in C order, as the contiguous runs it already has: a pin's
    segment, a slice ``[..., :used, :]`` of the cache's pool, is one run per layer, K or
    V, and head. Nothing is copied (a device's tensor is brought over first).

    This runs on the store's I/O thread, so torch's copy kernels are not used: the first
    parallel kernel a thread runs gives it an OpenMP pool of its own, kept while the
    thread lives, and with more pools than cores GNU OpenMP's threads sleep between
    parallel regions instead of spinning, so the worker's every step waits for their
    wake-ups (``hardware.on_passing_thread``). Measured on 2 cores: a warm request's
    prefill took 85 ms instead of 65 ms for the rest of the engine's life once the first
    pin was written. A copy by numpy would avoid that but took 320 ms for a 3,226-token
    pin of the default model (141 MiB); the runs take none.
    """
    array = tensor.detach().to("cpu").view(_SAME_SIZE[tensor.element_size()]).numpy()
    if array.size == 0:
        return
    lead = next(
        (k for k in range(array.ndim) if array[(0,) * k].flags.c_contiguous),
        array.ndim,
    )
    if lead == array.ndim:  # no run longer than one element: numpy copies it
        yield np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        return
    for index in np.ndindex(*array.shape[:lead]):
        yield array[index].reshape(-1).view(np.uint8)


class PrefixStore(StoreFolders):
    """Reads and writes pinned KV under one root, one folder per namespace. Thread-safe."""

    def __init__(self, root: Path, on_failure: Callable[[], None] | None = None) -> None:
        self.root = root
        self.on_failure = on_failure  # called for each read that failed and may not next time
        self._warned: set[str] = set()
        self.writable = True
        self._opened_at = time.time()  # older ``.tmp-*`` files are a crash's
        self._lock = threading.RLock()  # guards the dicts below, manifests and prune
        self._folders: dict[str, FolderState] = {}
        self._handed_out: dict[str, int] = {}  # namespace -> last version from next_version
        self._written: dict[str, int] = {}  # namespace -> version of the manifest on disk
        self._saved_at: dict[Path, int] = {}  # file -> last version handed out when saved
        self.windows: Windows | None = None
        self.state_layers = 0  # a hybrid model's state layers: each file holds their state
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            self._warn_once(
                "mkdir", f"prefix store {root} cannot be created ({err}); pins stay in memory only"
            )
            self.writable = False

    def keep_windows(self, layers: int, sliding: tuple[int, ...], window: int | None) -> None:
        """Store only the last ``window`` tokens of the ``sliding`` layers (of ``layers``)."""
        self.windows = Windows(layers, tuple(sliding), window) if sliding and window else None

    def keep_states(self, layers: int) -> None:
        """Files hold (and must hold) the state of ``layers`` state layers."""
        self.state_layers = layers

    def open(self, namespace: str) -> list[ManifestEntry]:
        """Start using ``namespace``'s folder (at start-up): take its lock or only read it,
        sweep a crash's ``.tmp-*`` files, check its manifest. Returns the pins it lists."""
        if not self._claim(namespace).manifest_ok:
            return []  # unreadable: warned once by _claim
        return self.read_manifest(namespace)

    def close(self) -> None:
        """Let go of every folder's lock; the store writes nothing after this."""
        with self._lock:
            self.writable = False
            for folder in self._folders.values():
                folder.lock.release()

    def holds(self, namespace: str, key: str) -> bool:
        """Whether a file for ``key`` is on disk (usable or not)."""
        return self.path_for(namespace, key).exists()

    def path_for(self, namespace: str, key: str) -> Path:
        if not KEY_RE.match(key):
            raise ValueError("bad store key")
        return self.folder(namespace) / f"{key}.safetensors"

    # -- KV files ----------------------------------------------------------------------

    def save(
        self,
        namespace: str,
        tokens: Sequence[int],
        kv: torch.Tensor | Sequence[torch.Tensor],
        state: dict[str, torch.Tensor] | None = None,
        window: torch.Tensor | None = None,
    ) -> bool:
        """Write the KV of ``tokens``; returns False (after one warning) when it cannot.

        ``kv`` is one ``[L, 2, H, T, D]`` tensor or several ``[L, 2, H, T_i, D]`` pieces in
        token order (a pin's cached segments). The pieces are streamed to the file one at
        a time, from the contiguous runs they already have (nothing is copied).
        ``state``: a hybrid model's state tensors at the end of ``tokens`` (``Snapshot``).
        ``window``: with ``keep_windows``, the sliding layers' last tokens
        ``[Ls, 2, H, w, D]``, and ``kv`` holds the other layers.
        """
        pieces = self._check_pieces(tokens, [kv] if isinstance(kv, torch.Tensor) else list(kv))
        state = dict(state or {})
        if bool(state) != bool(self.state_layers):
            raise ValueError("state tensors go with (and only with) a model's state layers")
        if (window is None) != (self.windows is None):
            raise ValueError("a sliding window goes with (and only with) sliding layers")
        if window is not None and not self._fits_windows(pieces[0], window, len(tokens)):
            raise ValueError("KV pieces and window do not have the model's layers")
        if any(t.dtype not in _DTYPES for t in state.values()):
            raise ValueError("cannot store a state of this dtype")
        if not self.writable or not self._claim(namespace).owner:
            return False
        target = self.path_for(namespace, prefix_key(namespace, tokens))
        if target.exists():
            self._mark_saved(namespace, target)  # a pin made again: its file is current
            return True
        tmp_name = None
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(
                prefix=".tmp-", suffix=".safetensors", dir=target.parent
            )
            with os.fdopen(fd, "wb") as handle:
                self._write(handle, namespace, tokens, pieces, state, window=window)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp_name, target)
            tmp_name = None
            sync_folder(target.parent)
        except OSError as err:
            self._warn_cannot_write(err)
            return False
        finally:
            if tmp_name is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp_name)
        self._mark_saved(namespace, target)
        return True

    def _fits_windows(self, piece: torch.Tensor, window: torch.Tensor, tokens: int) -> bool:
        """Whether ``piece`` holds the full layers and ``window`` the sliding layers' last
        tokens of a prefix of ``tokens`` (same dtype, heads and head size)."""
        windows = self.windows
        return (
            windows is not None
            and piece.shape[0] == len(windows.full)
            and window.shape[0] == len(windows.sliding)
            and window.shape[3] == windows.kept(tokens)
            and window.dtype == piece.dtype
            and window.shape[1:3] + window.shape[4:] == piece.shape[1:3] + piece.shape[4:]
        )

    def _mark_saved(self, namespace: str, path: Path) -> None:
        """Remember that ``path`` is wanted by a pin newer than every snapshot so far."""
        with self._lock:
            self._saved_at[path] = self._handed_out.get(namespace, 0)

    @staticmethod
    def _check_pieces(tokens: Sequence[int], pieces: list[torch.Tensor]) -> list[torch.Tensor]:
        """The non-empty pieces; ValueError if they cannot be the KV of ``tokens``."""
        pieces = [p for p in pieces if p.dim() != 5 or p.shape[3] > 0]
        if any(p.dim() != 5 for p in pieces):
            raise ValueError("KV pieces must be [L, 2, H, T, D] tensors")
        if not pieces:
            raise ValueError("no KV to store")
        first = pieces[0]
        if any(
            p.dtype != first.dtype or p.shape[:3] + p.shape[4:] != first.shape[:3] + first.shape[4:]
            for p in pieces
        ):
            raise ValueError("KV pieces differ in dtype or shape")
        if first.dtype not in _DTYPES:
            raise ValueError(f"cannot store KV of dtype {first.dtype}")
        if sum(p.shape[3] for p in pieces) != len(tokens):
            raise ValueError("KV pieces do not cover the tokens")
        return pieces

    def _write(
        self,
        handle: BinaryIO,
        namespace: str,
        tokens: Sequence[int],
        pieces: list[torch.Tensor],
        state: dict[str, torch.Tensor],
        *,
        window: torch.Tensor | None = None,
    ) -> None:
        """Write a safetensors file piece by piece; the checksum is filled in at the end.

        The checksum goes first in the header, as a fixed-width placeholder that is
        overwritten once all data is written, so the data is only passed over once.
        Tensor bytes are written in native order: little-endian, as safetensors requires,
        on every platform torch ships for.
        """
        token_tensor = torch.tensor(list(tokens), dtype=torch.int64)
        meta = {
            "checksum": _CHECKSUM_PLACEHOLDER,  # first: nothing caller-given precedes it
            "format": FORMAT,
            "namespace": namespace,
            "n_tokens": str(len(tokens)),
            "pieces": str(len(pieces)),
        }
        # (name, tensor): each written from the runs it already has (_runs_for_writing).
        entries: list[tuple[str, torch.Tensor]] = [("tokens", token_tensor)]
        entries += [(f"kv.{i}", p) for i, p in enumerate(pieces)]
        if self.windows is not None and window is not None:
            sliding = ",".join(map(str, self.windows.sliding))
            meta |= {"sliding": sliding, "window": str(window.shape[3])}
            entries.append(("window", window))
        entries += [(f"state.{name}", t) for name, t in sorted(state.items())]
        header: dict[str, Any] = {"__metadata__": meta}
        offset = 0
        for name, tensor in entries:
            size = tensor.numel() * tensor.element_size()
            header[name] = {
                "dtype": _DTYPES[tensor.dtype],
                "shape": list(tensor.shape),
                "data_offsets": [offset, offset + size],
            }
            offset += size
        encoded = json.dumps(header, separators=(",", ":")).encode()
        encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
        handle.write(len(encoded).to_bytes(8, "little"))
        handle.write(encoded)
        crc = 0
        for _, tensor in entries:
            for run in _runs_for_writing(tensor):
                crc = zlib.crc32(run, crc)
                handle.write(run)
        handle.seek(8 + encoded.index(_CHECKSUM_PLACEHOLDER.encode()))
        handle.write(f"crc32:{crc:08x}".encode())

    def load(self, namespace: str, tokens: Sequence[int]) -> torch.Tensor | None:
        """The stored KV ``[L, 2, H, T, D]`` of ``tokens``, or None if absent or unusable."""
        loaded = self.load_prefix(namespace, tokens)
        return None if loaded is None else loaded.kv

    def load_prefix(self, namespace: str, tokens: Sequence[int]) -> StoredPrefix | None:
        """Everything stored for ``tokens`` (KV and state), or None if absent or unusable."""
        loaded = self._read(self.path_for(namespace, prefix_key(namespace, tokens)), namespace)
        if loaded is None or loaded.tokens != list(tokens):  # a hash collision, in theory
            return None
        return loaded

    def load_by_key(self, namespace: str, key: str) -> tuple[list[int], torch.Tensor] | None:
        """Load a stored prefix's tokens and KV by file key."""
        loaded = self.load_prefix_by_key(namespace, key)
        return None if loaded is None else (loaded.tokens, loaded.kv)

    def load_prefix_by_key(self, namespace: str, key: str) -> StoredPrefix | None:
        """Load a stored prefix by file key (for start-up restore from the manifest)."""
        return self._read(self.path_for(namespace, key), namespace)

    def _read(self, path: Path, namespace: str) -> StoredPrefix | None:
        """Tokens and KV of a store file, read once and verified; None if unusable (logged)."""
        if not path.exists():
            return None
        try:
            with safe_open(path, framework="pt") as reader:
                return self._verified(reader, path.stem, namespace)
        except FileNotFoundError:
            return None
        except OSError as err:  # the disk or the process may be at fault, not the file
            _LOGGER.warning("Cannot read prefix store file %s (%s); keeping it", path.name, err)
            if self.on_failure is not None:
                self.on_failure()
            return None
        except _UNREADABLE as err:
            if not self._claim(namespace).owner:
                _LOGGER.warning("Ignoring prefix store file %s (%s)", path.name, err)
                return None
            _LOGGER.warning(
                "Ignoring prefix store file %s (%s); it will be rebuilt", path.name, err
            )
            self._discard(path)
            return None

    def _verified(self, reader: Any, key: str, namespace: str) -> StoredPrefix:
        meta = reader.metadata() or {}
        if meta.get("format") != FORMAT or meta.get("namespace") != namespace:
            raise UnusableFileError("written by another model or format")
        n_tokens, count = int(meta["n_tokens"]), int(meta["pieces"])
        names = [f"kv.{i}" for i in range(count)]
        windows = self._file_windows(meta)
        extra = ["window"] if windows is not None else []
        keys = set(reader.keys())
        states = sorted(k for k in keys if k.startswith("state."))
        if keys != {"tokens", *names, *extra, *states}:
            raise UnusableFileError("unexpected tensors")
        if bool(states) != bool(self.state_layers):
            raise UnusableFileError("written for another kind of model (state layers)")
        # Check every shape from the header before reading or allocating anything.
        shapes = [reader.get_slice(name).get_shape() for name in names + extra]
        dtypes = {reader.get_slice(name).get_dtype() for name in names + extra}
        if (
            count < 1
            or len(dtypes) != 1
            or reader.get_slice("tokens").get_shape() != [n_tokens]
            or any(len(s) != 5 or s[1:3] + s[4:] != shapes[0][1:3] + shapes[0][4:] for s in shapes)
            or any(s[0] != shapes[0][0] for s in shapes[:count])
            or sum(s[3] for s in shapes[:count]) != n_tokens
        ):
            raise UnusableFileError("unexpected KV shapes")
        if windows is not None:
            kept = int(meta["window"])
            full = len(windows.full)
            if shapes[0][0] != full or shapes[-1][0] != len(windows.sliding):
                raise UnusableFileError("unexpected KV shapes")
            if shapes[-1][3] != kept or kept != windows.kept(n_tokens):
                raise UnusableFileError("unexpected sliding-window length")
        token_tensor = reader.get_tensor("tokens")
        if token_tensor.dtype != torch.int64:
            raise UnusableFileError("token ids are not int64")
        crc = zlib.crc32(_raw(token_tensor))
        tokens = token_tensor.tolist()
        if prefix_key(namespace, tokens) != key:
            raise UnusableFileError("token ids do not match the file name")
        if _TORCH_DTYPES.get(dtypes.pop()) is None:
            raise UnusableFileError("unexpected KV dtype")
        if any(_TORCH_DTYPES.get(reader.get_slice(n).get_dtype()) is None for n in states):
            raise UnusableFileError("unexpected state dtype")
        pieces = []
        for name in names + extra + states:
            # A copy-on-write view of the mapped file: the checksum pass is what reads it.
            piece = reader.get_tensor(name)
            crc = zlib.crc32(_raw(piece), crc)
            pieces.append(piece)
        if meta.get("checksum") != f"crc32:{crc:08x}":
            raise UnusableFileError("checksum mismatch: the file is corrupt")
        state = {
            n.removeprefix("state."): t
            for n, t in zip(states, pieces[len(pieces) - len(states) :], strict=True)
        }
        pieces = pieces[: len(pieces) - len(states)]
        window = pieces.pop() if windows is not None else None
        # One piece as it is (no copy); several are joined into one tensor.
        kv = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=3)
        return StoredPrefix(tokens, kv, state, window)

    def _file_windows(self, meta: dict[str, str]) -> Windows | None:
        """The file's sliding layers, which must be this model's (None: a full file)."""
        if "sliding" not in meta:
            if self.windows is not None:
                raise UnusableFileError("written without sliding windows")
            return None
        sliding = tuple(int(i) for i in meta["sliding"].split(","))
        if self.windows is None or sliding != self.windows.sliding:
            raise UnusableFileError("written for other sliding-window layers")
        return self.windows
