"""The loaded weights on 2 MiB pages (``model/huge_pages.py``).

The parser is checked on hand-written ``smaps`` text; the real call on this process,
where the system offers transparent huge pages and Linux has ``MADV_COLLAPSE`` (6.1):
a tensor that fills its pages must end up on huge pages. Elsewhere that part is skipped
(there is nothing to ask for), and the call must do nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from hearth_engine.model import huge_pages

from .conftest import linux_at_least

MIB = 1 << 20
SMAPS = """\
7f0000000000-7f0000a00000 rw-p 00000000 00:00 0
Size:              10240 kB
Rss:               10240 kB
VmFlags: rd wr mr mw me ac
7f0000a00000-7f0001400000 rw-p 00000000 00:00 0
Size:              10240 kB
Rss:                 512 kB
VmFlags: rd wr mr mw me ac
7f0001400000-7f0001e00000 rw-s 00000000 00:05 1234                       /dev/shm/x
Size:              10240 kB
Rss:               10240 kB
7f0001e00000-7f0002800000 r--p 00000000 08:01 99                         /usr/lib/libx.so
Size:              10240 kB
Rss:               10240 kB
55d000100000-55d000b00000 rw-p 00000000 00:00 0                          [heap]
Size:              10240 kB
Rss:               10000 kB
7f0003000000-7f0003180000 rw-p 00000000 00:00 0
Size:               1536 kB
Rss:                1536 kB
"""


def test_dense_private_memory_is_chosen_cut_to_whole_huge_pages() -> None:
    regions = list(huge_pages.dense_regions(SMAPS))
    # The dense anonymous region (10 MiB from a 2 MiB boundary), and the heap, cut inward
    # to its whole huge pages; not the sparse one, the shared file, the library, or a
    # region smaller than one huge page.
    assert regions == [
        (0x7F0000000000, 0x7F0000A00000),
        (0x55D000200000, 0x55D000A00000),
    ]


def test_the_mode_is_read_from_the_bracketed_word(tmp_path: Path) -> None:
    mode = tmp_path / "enabled"
    mode.write_text("always [madvise] never\n")
    assert huge_pages.thp_mode(mode) == "madvise"
    mode.write_text("[always] madvise never\n")
    assert huge_pages.thp_mode(mode) == "always"
    assert huge_pages.thp_mode(tmp_path / "missing") == ""


def test_a_filled_tensor_ends_up_on_huge_pages() -> None:
    if huge_pages.thp_mode() not in {"always", "madvise"}:
        assert huge_pages.back_with_huge_pages() == 0
        pytest.skip("this system offers no transparent huge pages")
    if not linux_at_least(6, 1):
        pytest.skip("no MADV_COLLAPSE before Linux 6.1: khugepaged moves memory later")
    before = huge_pages.huge_mib()
    weights = torch.ones(64 * MIB // 4)  # 64 MiB, every page written
    after = huge_pages.back_with_huge_pages()
    assert after - before >= 32, (before, after, os.getpid())
    assert float(weights.sum()) == weights.numel()  # the data is the same after the move
