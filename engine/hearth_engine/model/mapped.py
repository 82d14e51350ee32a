"""Weights read straight from the model's files (memory-mapped) copied into the process.

transformers loads safetensors by mapping the files: a weight stored in the dtype it is
served in stays a view of its file. The lean forward then makes its own copies of the
linears (fused, packed, tiled) and drops transformers' ones, but the embedding and the
norms keep the whole mapping alive, and every page a load step once read stays counted
in the process's RSS (as file pages). Measured with the default model (269 MB bf16): 233
MiB of ``RssFile`` that only the embedding (54 MiB) still used. Copying what is mapped
into ordinary memory right after loading lets the mapping go: the copies of the linears
are freed once the lean forward has made its own (and given back at the end of start-up,
``hardware.release_free_memory``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

MAPS = Path("/proc/self/maps")


def mapped_ranges(maps: str, files: Iterable[Path]) -> list[tuple[int, int]]:
    """``(start, end)`` of the mappings of ``files`` in ``/proc/<pid>/maps`` text."""
    wanted = {os.path.realpath(f) for f in files}
    ranges = []
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and os.path.realpath(fields[5].strip()) in wanted:
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            ranges.append((lo, hi))
    return ranges


def copy_mapped_weights(model: Any, folder: Path) -> int:
    """Copy the model's parameters and buffers that live in a mapping of ``folder``'s
    weight files into ordinary memory; returns the bytes copied (0 off Linux)."""
    try:
        maps = MAPS.read_text()
    except OSError:
        return 0
    ranges = mapped_ranges(maps, folder.glob("*.safetensors"))
    if not ranges:
        return 0
    copied = 0
    for tensor in [*model.parameters(), *model.buffers()]:
        if tensor.device.type != "cpu" or tensor.numel() == 0:
            continue
        pointer = tensor.data_ptr()
        if any(lo <= pointer < hi for lo, hi in ranges):
            tensor.data = tensor.data.clone()
            copied += tensor.numel() * tensor.element_size()
    return copied
