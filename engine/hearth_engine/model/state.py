"""Recurrent state of hybrid models: per-row state layers and snapshots at prefix boundaries.

Hybrid models (Qwen3.5's gated linear attention, LFM2's short convolutions, Granite 4's
Mamba-2 layers) mix attention layers, which keep KV per token, with layers that keep a
fixed-size state: a convolution window and, for linear attention and state space, a
recurrent matrix. Such a state sums up *every* token before it, so unlike KV it cannot
be cut at any token: a cached prefix can only be resumed where its state was saved.

* ``StateLayer`` is transformers' own ``LinearAttentionLayer`` (what the models' forward
  reads and writes through ``Cache.get_conv_state`` and friends), with rows that can be
  read out and written in, so a working buffer can be snapshotted, restored and batched.
* ``Snapshot`` is the state of every state layer of one row after a given token: what a
  pin keeps at its boundary, next to its attention layers' KV. A sliding-window model's
  snapshot is of the same kind: its sliding layers' last window of KV, all they need to
  go on (``kv_manager.py``).
* ``SnapshotTable`` finds the snapshot at the longest boundary inside a cache match.
  Where snapshots are taken (``KVManager.store``): at the end of every pin and of every
  cached prompt (and its generated tokens), the points the next request resumes from.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from transformers.cache_utils import LinearAttentionLayer

# Unpinned snapshots kept per engine (the least recently used go first): at most this
# many, and at most ``max_unpinned_bytes`` together (KVManager: a quarter of the KV
# budget). Each is a few MB (Qwen3.5-0.8B in bfloat16: 18.8 MB; Granite 4 tiny at 10 of
# its 40 layers: 13.7 MB), so a handful of recent conversations stay resumable.
MAX_UNPINNED = 16


def _nbytes(tensor: torch.Tensor | None) -> int:
    return 0 if tensor is None else tensor.numel() * tensor.element_size()


class StateLayer(LinearAttentionLayer):
    """One state layer of a working buffer; its tensors are ``[rows, ...]``."""

    def read_row(self, row: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Copies of ``(conv, recurrent)`` of ``row`` (``None`` where the model keeps none)."""
        if not self.has_previous_state[0]:
            raise RuntimeError("a state layer was read before any token ran through it")
        conv = self.conv_states[0]
        rec = self.recurrent_states[0] if self.is_recurrent_states_initialized[0] else None
        return (
            None if conv is None else conv[row].clone(),
            None if rec is None else rec[row].clone(),
        )

    def write_rows(
        self, convs: Sequence[torch.Tensor | None], recs: Sequence[torch.Tensor | None]
    ) -> None:
        """Set every row's state at once (rows in order): the layer resumes after them."""
        if convs and convs[0] is not None:
            conv = torch.stack([c for c in convs if c is not None])
            self.conv_states[0] = conv
            self.conv_kernel_size[0] = conv.shape[-1]
            self.is_conv_states_initialized[0] = True
            self.dtype, self.device = conv.dtype, conv.device
        if recs and recs[0] is not None:
            self.recurrent_states[0] = torch.stack([r for r in recs if r is not None])
            self.is_recurrent_states_initialized[0] = True
        self.has_previous_state[0] = True

    @property
    def nbytes(self) -> int:
        return _nbytes(self.conv_states[0]) + _nbytes(self.recurrent_states[0])


@dataclass(frozen=True)
class Snapshot:
    """The state of every state layer (in layer order) after ``tokens`` tokens.

    For a model with sliding-window layers, ``window`` is the state those layers need to
    go on: their KV of the last ``min(window, tokens)`` tokens, ``[Ls, 2, H, w, D]``
    (``KVManager`` keeps no older sliding KV).
    """

    tokens: int
    conv: tuple[torch.Tensor | None, ...]
    recurrent: tuple[torch.Tensor | None, ...]
    window: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        return sum(_nbytes(t) for t in (*self.conv, *self.recurrent, self.window))

    @classmethod
    def capture(cls, layers: Iterable[StateLayer], row: int, tokens: int) -> Snapshot:
        pairs = [layer.read_row(row) for layer in layers]
        return cls(tokens, tuple(c for c, _ in pairs), tuple(r for _, r in pairs))

    def tensors(self) -> dict[str, torch.Tensor]:
        """Named tensors for the store: ``conv.<i>`` and ``recurrent.<i>`` (i: state layer)."""
        out = {f"conv.{i}": t for i, t in enumerate(self.conv) if t is not None}
        out |= {f"recurrent.{i}": t for i, t in enumerate(self.recurrent) if t is not None}
        return out

    @classmethod
    def from_tensors(cls, tokens: int, layers: int, tensors: dict[str, torch.Tensor]) -> Snapshot:
        """The inverse of ``tensors``; a ``ValueError`` when names are missing or extra."""
        conv = tuple(tensors.get(f"conv.{i}") for i in range(layers))
        rec = tuple(tensors.get(f"recurrent.{i}") for i in range(layers))
        known = sum(t is not None for t in (*conv, *rec))
        if known != len(tensors) or any(c is None for c in conv):
            raise ValueError("state tensors do not match the model's state layers")
        return cls(tokens, conv, rec)

    def to(self, device: torch.device) -> Snapshot:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return Snapshot(
            self.tokens,
            tuple(map(move, self.conv)),
            tuple(map(move, self.recurrent)),
            move(self.window),
        )


Key = tuple[str, tuple[int, ...]]  # (namespace, tokens)


class SnapshotTable:
    """Snapshots by ``(namespace, tokens)``; those of pinned prefixes are never dropped.

    ``pinned`` lists the current pins' ``(namespace, tokens)`` (the radix cache's pin
    records): asked when something is to be dropped, so a re-pin or an unpin needs no
    bookkeeping here. ``longest`` answers "where inside this match can I resume?" by
    trying the lengths that have snapshots, longest first: a tuple hash each (about 15
    us for 5,000 tokens), and an exact comparison on a hit.
    """

    def __init__(
        self,
        pinned: Callable[[], Iterable[tuple[str, Sequence[int]]]],
        max_unpinned: int = MAX_UNPINNED,
        max_unpinned_bytes: int | None = None,
    ) -> None:
        self.max_unpinned = max_unpinned
        self.max_unpinned_bytes = max_unpinned_bytes
        self._pinned = pinned
        self._items: OrderedDict[Key, Snapshot] = OrderedDict()
        self._lengths: dict[str, dict[int, int]] = {}  # namespace -> length -> count
        # Kept as plain ints, so other threads (stats) read them without iterating.
        self.nbytes = 0
        self.count = 0

    def put(self, namespace: str, tokens: Sequence[int], snapshot: Snapshot) -> None:
        key = (namespace, tuple(tokens))
        old = self._items.get(key)
        if old is None:
            counts = self._lengths.setdefault(namespace, {})
            counts[len(tokens)] = counts.get(len(tokens), 0) + 1
        self.nbytes += snapshot.nbytes - (old.nbytes if old is not None else 0)
        self._items[key] = snapshot
        self.count = len(self._items)
        self._items.move_to_end(key)
        self._trim(key)

    def get(self, namespace: str, tokens: Sequence[int]) -> Snapshot | None:
        key = (namespace, tuple(tokens))
        snapshot = self._items.get(key)
        if snapshot is not None:
            self._items.move_to_end(key)
        return snapshot

    def longest(self, namespace: str, tokens: Sequence[int], limit: int) -> int:
        """The longest ``n <= limit`` with a snapshot of ``tokens[:n]`` (0 when none)."""
        for n in sorted(self._lengths.get(namespace, {}), reverse=True):
            if 0 < n <= limit and (namespace, tuple(tokens[:n])) in self._items:
                return n
        return 0

    def clear(self) -> int:
        """Drop every snapshot no pin holds; returns the bytes freed."""
        return self._drop(self._unpinned())

    def _unpinned(self) -> list[Key]:
        held = {(ns, tuple(tokens)) for ns, tokens in self._pinned()}
        return [k for k in self._items if k not in held]  # least recently used first

    def _trim(self, newest: Key) -> None:
        # ``newest`` stays whatever its size: its prefix was just cached (a pin's is
        # pinned only after this), and without it that cache entry would be useless.
        unpinned = self._unpinned()  # least recently used first
        cap = self.max_unpinned_bytes
        if cap is not None:  # one larger than the cap alone never pushes the others out
            self._drop([k for k in unpinned if self._items[k].nbytes > cap and k != newest])
            unpinned = [k for k in unpinned if k in self._items]
        drop = max(0, len(unpinned) - self.max_unpinned)
        if cap is not None:
            kept = sum(self._items[k].nbytes for k in unpinned[drop:])
            while drop < len(unpinned) and kept > cap and unpinned[drop] != newest:
                kept -= self._items[unpinned[drop]].nbytes
                drop += 1
        self._drop([k for k in unpinned[:drop] if k != newest])

    def _drop(self, keys: list[Key]) -> int:
        freed = 0
        for key in keys:
            freed += self._items.pop(key).nbytes
            namespace, tokens = key
            counts = self._lengths[namespace]
            counts[len(tokens)] -= 1
            if not counts[len(tokens)]:
                del counts[len(tokens)]
        self.nbytes -= freed
        self.count = len(self._items)
        return freed
