"""KV tensors: the preallocated working cache of a running sequence, and cached segments.

Layouts (``L`` layers, ``H`` KV heads, ``D`` head dim, ``T`` tokens, ``B`` rows):

* a **segment** (what a radix-tree node holds) is one tensor ``[L, 2, H, T, D]``;
* a **buffer** (the working cache of running sequences) is ``[L, 2, B, H, cap, D]``.

``L`` counts the layers that keep KV. A hybrid model's other layers (linear attention,
convolutions) keep a fixed-size state per row instead (``state.py``): a buffer holds
it beside the KV, and the model sees one ``Cache`` layer per model layer.

HF's ``DynamicCache`` concatenates on every forward, allocating and copying the whole
cache each step; on machines where page faults are slow that dominates a warm suffix.
``KVBuffer`` writes in place into a buffer sized up front and hands the model views.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from .state import Snapshot, StateLayer


@dataclass(frozen=True)
class KVLayout:
    """Shape facts of a model's KV cache."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device
    # Sliding-window layers (indices) and their window in tokens: such a layer only
    # ever reads the last ``window`` tokens of a prefix.
    sliding: tuple[int, ...] = ()
    window: int | None = None
    # Model layers (indices) that keep a recurrent or convolution state instead of KV;
    # ``layers`` counts the others.
    state_layers: tuple[int, ...] = ()

    @property
    def bytes_per_token(self) -> int:
        """Bytes of one token's KV over all layers (what a working buffer holds)."""
        item = torch.empty((), dtype=self.dtype).element_size()
        return self.layers * 2 * self.kv_heads * self.head_dim * item

    @property
    def layer_bytes_per_token(self) -> int:
        return self.bytes_per_token // self.layers

    @property
    def trims_windows(self) -> bool:
        """Whether cached prefixes keep their sliding layers' last ``window`` tokens only
        (the rest of those layers is never read again; see ``kv_manager.py``). Not where
        every layer slides: the radix tree's segments would hold no KV, and so nothing
        would bound their number."""
        return bool(self.sliding) and self.window is not None and len(self.sliding) < self.layers

    @property
    def segment_layers(self) -> tuple[int, ...]:
        """The layers a cached segment holds, in order: all, or the full-attention ones
        of a model that trims its windows (its sliding layers' tail is a snapshot)."""
        trimmed = self.sliding if self.trims_windows else ()
        return tuple(i for i in range(self.layers) if i not in trimmed)

    @property
    def segment_bytes_per_token(self) -> int:
        """Bytes one token of a cached segment holds."""
        return len(self.segment_layers) * self.layer_bytes_per_token

    def window_tokens(self, tokens: int) -> int:
        """Tokens of sliding KV a prefix of ``tokens`` keeps (0: it trims nothing)."""
        return min(tokens, self.window) if self.trims_windows and self.window is not None else 0

    def prefix_bytes(self, tokens: int) -> int:
        """Bytes a cached prefix of ``tokens`` holds, in memory and in the store: every
        token of its segment layers, and the last ``window`` of trimmed sliding ones."""
        trimmed = self.layers - len(self.segment_layers)
        kept = self.window_tokens(tokens)
        return (len(self.segment_layers) * tokens + trimmed * kept) * self.layer_bytes_per_token


class BufferLayer(CacheLayerMixin):
    """One layer's view into a ``KVBuffer``: ``update`` writes in place, returns views."""

    is_sliding = False
    is_croppable = True

    def __init__(self, store: torch.Tensor, length: int) -> None:
        super().__init__()
        self.store = store  # [2, B, H, cap, D]
        self._k, self._v = store[0], store[1]  # [B, H, cap, D] views, made once
        self.length = length
        self.device = store.device
        self.is_initialized = True
        self._refresh()

    def _refresh(self) -> None:
        self.keys = self._k.narrow(2, 0, self.length)
        self.values = self._v.narrow(2, 0, self.length)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to do: the storage exists before the first forward."""

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = key_states.shape[-2]
        end = self.length + n
        if end > self.store.shape[-2]:
            raise RuntimeError(f"KV buffer overflow: {end} > {self.store.shape[-2]}")
        self._k.narrow(2, self.length, n).copy_(key_states)
        self._v.narrow(2, self.length, n).copy_(value_states)
        self.length = end
        self._refresh()
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    def crop(self, tokens_to_remove: int) -> None:
        self.length -= abs(tokens_to_remove)
        self._refresh()


class KVBuffer(Cache):
    """A transformers ``Cache`` over one preallocated ``[L, 2, B, H, cap, D]`` tensor.

    All rows share one length (``length``); rows that hold fewer tokens are left-padded
    and masked by the caller.
    """

    def __init__(
        self,
        layout: KVLayout,
        rows: int,
        capacity: int,
        length: int = 0,
        storage: torch.Tensor | None = None,
    ) -> None:
        self.layout = layout
        shape = (layout.layers, 2, rows, layout.kv_heads, capacity, layout.head_dim)
        if storage is None:
            storage = torch.empty(math.prod(shape), dtype=layout.dtype, device=layout.device)
        self.storage = storage  # flat; may be larger than needed (recycled by BufferPool)
        self.donated = False  # its storage went to the prefix cache (BufferPool.donate)
        self.data = storage[: math.prod(shape)].view(shape)
        self.kv_layers = [BufferLayer(self.data[i], length) for i in range(layout.layers)]
        self.state_layers = [StateLayer() for _ in layout.state_layers]
        layers: list[BufferLayer | StateLayer] = list(self.kv_layers)
        for index, layer in zip(layout.state_layers, self.state_layers, strict=True):
            layers.insert(index, layer)
        super().__init__(layers=layers)

    @property
    def rows(self) -> int:
        return self.data.shape[2]

    @property
    def capacity(self) -> int:
        return self.data.shape[4]

    @property
    def length(self) -> int:
        return self.kv_layers[0].length

    def set_length(self, length: int) -> None:
        for layer in self.kv_layers:
            layer.length = length
            layer._refresh()

    @property
    def nbytes(self) -> int:
        state = sum(layer.nbytes for layer in self.state_layers)
        return self.data.numel() * self.data.element_size() + state

    def snapshot(self, row: int, tokens: int) -> Snapshot:
        """A copy of ``row``'s recurrent state (valid after its ``tokens``-th token)."""
        return Snapshot.capture(self.state_layers, row, tokens)

    def restore(self, snapshots: list[Snapshot]) -> None:
        """Give row ``i`` the state of ``snapshots[i]`` (one per row, every row)."""
        for i, layer in enumerate(self.state_layers):
            layer.write_rows([s.conv[i] for s in snapshots], [s.recurrent[i] for s in snapshots])

    def write_segment(
        self, row: int, start: int, segment: torch.Tensor, layers: Sequence[int] | None = None
    ) -> None:
        """Copy a ``[L, 2, H, T, D]`` segment into ``row`` at column ``start`` (``layers``:
        the buffer layers it holds, in order, when not all of them)."""
        end = start + segment.shape[3]
        if layers is None or len(layers) == self.layout.layers:
            self.data[:, :, row, :, start:end] = segment
            return
        for i, layer in enumerate(layers):
            self.data[layer, :, row, :, start:end] = segment[i]

    def read_layers(self, row: int, start: int, end: int, layers: Sequence[int]) -> torch.Tensor:
        """A new ``[len(layers), 2, H, end-start, D]`` tensor of ``layers`` of ``row``."""
        return torch.stack([self.data[i, :, row, :, start:end] for i in layers])

    def read_segment(self, row: int, start: int, end: int) -> torch.Tensor:
        """A contiguous copy of columns ``[start, end)`` of ``row``: ``[L, 2, H, T, D]``."""
        return self.data[:, :, row, :, start:end].clone()

    def zero_columns(self, row: int, start: int, end: int) -> None:
        self.data[:, :, row, :, start:end] = 0


def segment_nbytes(segment: torch.Tensor) -> int:
    return segment.numel() * segment.element_size()


def split_segment(segment: torch.Tensor, at: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Split a segment into two independent tensors (clones: exact byte accounting).

    Views would keep the whole original alive as long as either half lives, so evicting
    one half would free nothing. The price: until the caller drops ``segment``, its bytes
    exist twice; ``RadixCache._split`` makes room for that before calling this.
    """
    return segment[:, :, :, :at].clone(), segment[:, :, :, at:].clone()


def segment_tokens(segment: torch.Tensor) -> int:
    return int(segment.shape[3])


def kv_range(  # noqa: PLR0917
    shared: Sequence[torch.Tensor],
    buffer: KVBuffer,
    row: int,
    offset: int,
    start: int,
    end: int,
    layers: Sequence[int] | None = None,
) -> torch.Tensor:
    """A new ``[L, 2, H, end-start, D]`` tensor of a sequence's tokens ``[start, end)``.

    The sequence's KV is the ``shared`` segments (read in place) followed by columns
    from ``offset`` of ``row`` of its working ``buffer``. ``layers``: the buffer layers
    to take (those the segments hold), when not all of them.
    """
    pieces = []
    pos = 0
    for segment in shared:
        count = segment_tokens(segment)
        lo, hi = max(start, pos), min(end, pos + count)
        if lo < hi:
            pieces.append(segment[:, :, :, lo - pos : hi - pos])
        pos += count
    lo = max(start, pos)
    if lo < end:
        a, b = offset + lo - pos, offset + end - pos
        if layers is None or len(layers) == buffer.layout.layers:
            pieces.append(buffer.data[:, :, row, :, a:b])
        else:  # already a new tensor
            taken = buffer.read_layers(row, a, b, layers)
            if not pieces:
                return taken
            pieces.append(taken)
    if not pieces:
        raise ValueError(f"empty KV range [{start}, {end})")
    return torch.cat(pieces, dim=3) if len(pieces) > 1 else pieces[0].clone()


class BufferPool:
    """Recycles working-cache storage between requests, and counts what is handed out.

    Fresh multi-megabyte tensors page-fault on first touch, which on a VM costs more than
    the copy itself (measured here: copying a 2k-token prefix into a new buffer took
    140 ms, into reused memory 12 ms). Up to ``max_free`` freed buffers, together at
    most ``max_free_bytes``, are kept, and the smallest one that is big enough is reused.
    Beyond ``max_free`` buffers the smallest are dropped (the large ones cost the most
    to fault in again); beyond ``max_free_bytes`` the largest are dropped (a batch of
    long prompts makes multi-GB decode buffers, which kept four at a time grew the
    engine to 11 GB under load).

    ``live_bytes``: the storage of the buffers handed out and not yet given back, and
    ``live_excess`` the part of it beyond what they asked for (a reused, larger storage).
    """

    def __init__(self, layout: KVLayout, max_free: int = 4, max_free_bytes: int = 1 << 30) -> None:
        self.layout = layout
        self.max_free = max_free
        self.max_free_bytes = max_free_bytes
        self._free: list[torch.Tensor] = []
        self._live: dict[int, tuple[int, int]] = {}  # id(storage): (bytes, excess bytes)
        self._item = torch.empty((), dtype=layout.dtype).element_size()
        self._lock = threading.Lock()

    def nbytes_for(self, rows: int, capacity: int) -> int:
        """Bytes a buffer of ``rows`` × ``capacity`` tokens takes."""
        return self._numel(rows, capacity) * self._item

    def _numel(self, rows: int, capacity: int) -> int:
        layout = self.layout
        return layout.layers * 2 * rows * layout.kv_heads * capacity * layout.head_dim

    def reusable(self, rows: int, capacity: int, max_excess: int | None = None) -> bool:
        """Whether ``buffer`` would reuse a freed storage (no new memory)."""
        with self._lock:
            return self._fit(self._numel(rows, capacity), max_excess) is not None

    def _fit(self, need: int, max_excess: int | None) -> int | None:
        limit = 4 * need + (1 << 20)
        if max_excess is not None:
            limit = min(limit, need + max_excess // self._item)
        fits = [i for i, t in enumerate(self._free) if need <= t.numel() <= limit]
        return min(fits, key=lambda i: self._free[i].numel()) if fits else None

    def buffer(
        self, rows: int, capacity: int, length: int = 0, max_excess: int | None = None
    ) -> KVBuffer:
        """A buffer, in a freed storage that fits (at most ``max_excess`` bytes larger
        than needed, when given) or a new one."""
        need = self._numel(rows, capacity)
        with self._lock:
            index = self._fit(need, max_excess)
            storage = self._free.pop(index) if index is not None else None
        if storage is None:
            storage = torch.empty(need, dtype=self.layout.dtype, device=self.layout.device)
        with self._lock:
            size = storage.numel() * self._item
            self._live[id(storage)] = (size, size - need * self._item)
        return KVBuffer(self.layout, rows, capacity, length, storage)

    def donate(self, buffer: KVBuffer) -> None:
        """``buffer``'s storage now belongs to someone else (the prefix cache holds a
        view of it): it is no longer counted here, and ``release`` does not recycle it."""
        with self._lock:
            self._live.pop(id(buffer.storage), None)
            buffer.donated = True

    def release(self, buffer: KVBuffer | None) -> None:
        if buffer is None:
            return
        with self._lock:
            if buffer.donated:
                return
            self._live.pop(id(buffer.storage), None)
            if any(t is buffer.storage for t in self._free):
                return
            self._free.append(buffer.storage)
            self._free.sort(key=lambda t: t.numel())
            while len(self._free) > self.max_free:
                self._free.pop(0)
            while self._free and self._free_bytes() > self.max_free_bytes:
                self._free.pop()

    def drop_free(self) -> int:
        """Let go of every buffer kept for reuse (the engine has been idle); their bytes."""
        with self._lock:
            dropped = self._free_bytes()
            self._free.clear()
        return dropped

    def _free_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._free)

    @property
    def free_bytes(self) -> int:
        with self._lock:
            return self._free_bytes()

    @property
    def live_bytes(self) -> int:
        with self._lock:
            return sum(size for size, _ in self._live.values())

    @property
    def live_excess(self) -> int:
        with self._lock:
            return sum(excess for _, excess in self._live.values())

    def clear(self) -> None:
        with self._lock:
            self._free.clear()
