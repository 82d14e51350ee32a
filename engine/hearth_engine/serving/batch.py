"""Continuous batching of decode steps over one left-padded KV buffer.

Rows hold sequences of different lengths. Every row ends at the same column ``E``
(``buffer.length``), so a decode step writes one new column for all rows; shorter rows
are left-padded with zeros and masked out. The buffer is rebuilt (rows copied to their
new places) only when the set of rows changes or it runs out of room.

The buffer holds only each row's *own* KV: the cached prefixes the rows start with are
read in place (``PrefixPart``), one part per distinct segment with the rows that read
it, so the house prompt that every request shares sits in memory once.

New buffers come from ``allocate`` (``KVManager.new_buffer``), which makes room for them
within the KV budget first: during a rebuild the old buffer and the new one both exist.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from ..cache.budget import GROWTH_TOKENS
from ..model.attention import PrefixPart
from ..model.kv import BufferPool, KVBuffer
from ..model.runner import ModelRunner
from .sequence import Sequence

__all__ = ["GROWTH_TOKENS", "DecodeBatch"]

Allocate = Callable[[int, int, int], KVBuffer]  # (rows, capacity, length)


def _room(seq: Sequence) -> int:
    """Columns a row's buffer should have free: its next tokens, at most a growth step,
    and at least what it has to feed now (tokens a grammar forced)."""
    return max(min(seq.remaining_decode, GROWTH_TOKENS), len(seq.unfed))


class DecodeBatch:
    def __init__(
        self, runner: ModelRunner, pool: BufferPool, allocate: Allocate | None = None
    ) -> None:
        self.runner = runner
        self.pool = pool
        self._allocate: Allocate = allocate or pool.buffer
        self.rows: list[Sequence] = []
        self.buffer: KVBuffer | None = None
        self._mask: torch.Tensor | None = None  # [B, cap] bool, or None when unpadded
        self.parts: list[PrefixPart] = []

    @property
    def nbytes(self) -> int:
        return self.buffer.nbytes if self.buffer is not None else 0

    def set_rows(self, rows: list[Sequence]) -> None:
        """Make ``rows`` the batch, copying each one's KV from wherever it lives now."""
        old = self.buffer
        if not rows:
            self.rows, self.buffer, self._mask = [], None, None
        elif len(rows) == 1 and rows[0].kv is not old and self._has_room(rows[0], rows[0].kv):
            # A single sequence decodes in place in its own prefill buffer: no copy.
            self.rows, self.buffer, self._mask = list(rows), rows[0].kv, None
        else:
            self._rebuild(rows)
            return
        self.parts = self._parts(self.rows)
        if old is not None and old is not self.buffer:
            self.pool.release(old)

    def _parts(self, rows: list[Sequence]) -> list[PrefixPart]:
        """One part per distinct shared segment (then per distinct sliding window), with
        the batch rows that read it."""
        groups: dict[tuple[int, tuple[int, ...], int | None], tuple[PrefixPart, list[int]]] = {}
        for row, seq in enumerate(rows):
            for part in self.runner.prefix_parts(seq.shared, seq.window):
                key = (part.segment.data_ptr(), tuple(part.segment.shape), part.start)
                groups.setdefault(key, (part, []))[1].append(row)
        parts = []
        for part, members in groups.values():
            every = len(members) == len(rows)
            index = None if every else torch.tensor(members, device=part.segment.device)
            parts.append(replace(part, rows=index))
        return parts

    def _has_room(self, seq: Sequence, buffer: KVBuffer) -> bool:
        return buffer.capacity - seq.own_len >= _room(seq)

    def _rebuild(self, rows: list[Sequence]) -> None:
        end = max(seq.own_len for seq in rows)
        room = max(_room(seq) for seq in rows)
        buffer = self._allocate(len(rows), end + room + 1, end)
        sources = {id(seq.kv): seq.kv for seq in rows}
        if self.buffer is not None:
            sources[id(self.buffer)] = self.buffer
        padded = False
        # A hybrid model's rows bring their recurrent state along (read before the
        # rows move: a source may be this batch's own buffer).
        states = (
            [seq.kv.snapshot(seq.kv_row, seq.kv_len) for seq in rows] if buffer.state_layers else []
        )
        for row, seq in enumerate(rows):
            start = end - seq.own_len
            if start:
                padded = True
                buffer.zero_columns(row, 0, start)
            src: KVBuffer = seq.kv
            buffer.data[:, :, row, :, start:end] = src.data[
                :, :, seq.kv_row, :, seq.kv_offset : seq.kv_offset + seq.own_len
            ]
            seq.kv, seq.kv_row, seq.kv_offset = buffer, row, start
        if states:
            buffer.restore(states)
        for src in sources.values():
            self.pool.release(src)
        self._mask = None
        if padded:
            cols = torch.arange(buffer.capacity, device=buffer.data.device)[None, :]
            starts = torch.tensor([s.kv_offset for s in rows], device=buffer.data.device)[:, None]
            self._mask = cols >= starts  # [B, cap]
        self.rows, self.buffer = list(rows), buffer
        self.parts = self._parts(self.rows)

    def step(self, token_ids: list[int]) -> torch.Tensor:
        """Feed one token per row (in ``rows`` order); returns logits [B, V]."""
        buffer, positions, mask = self._inputs()
        logits = self.runner.decode(buffer, token_ids, positions, mask, self.parts)
        for seq in self.rows:
            seq.kv_len += 1
        return logits

    def extend(self, token_ids: list[int]) -> torch.Tensor:
        """Feed the batch's only row several tokens in one forward (the prefill path:
        tokens a grammar forced); returns the last one's logits [1, V]."""
        assert len(self.rows) == 1
        assert self.buffer is not None
        seq = self.rows[0]
        if self.buffer.length + len(token_ids) > self.buffer.capacity:
            self._rebuild(self.rows)
        assert seq.kv is self.buffer
        assert seq.kv_offset == 0
        logits = self.runner.prefill(self.buffer, token_ids, seq.shared, seq.window)
        seq.kv_len += len(token_ids)
        return logits[None]

    def mixed_step(
        self, token_ids: list[int], chunk: Sequence, chunk_ids: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``step`` and the next prefill chunk of ``chunk`` (not a row) in one forward
        (``ModelRunner.mixed``); the rows' logits [B, V] and the chunk's last [V]. The
        caller advances ``chunk``."""
        buffer, positions, mask = self._inputs()
        assert chunk.kv is not None
        assert chunk.kv is not buffer
        logits, chunk_logits = self.runner.mixed(
            buffer,
            token_ids,
            positions,
            mask,
            self.parts,
            chunk.kv,
            chunk_ids,
            chunk.shared,
            chunk.window,
        )
        for seq in self.rows:
            seq.kv_len += 1
        return logits, chunk_logits

    def _inputs(self) -> tuple[KVBuffer, list[int], torch.Tensor | None]:
        """The buffer (grown when full), the rows' positions and the padding mask."""
        assert self.buffer is not None
        if self.buffer.length + 1 > self.buffer.capacity:
            self._rebuild(self.rows)
        buffer = self.buffer
        positions = [seq.kv_len for seq in self.rows]
        mask = None if self._mask is None else self._mask[:, : buffer.length + 1]
        return buffer, positions, mask
