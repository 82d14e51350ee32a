"""``SnapshotTable``: where a hybrid model can resume, and which snapshots it keeps.

Unit tests of the bookkeeping (test_hybrid.py runs it through real models): the longest
snapshotted prefix inside a match, the least recently used unpinned snapshots dropped by
count and by bytes, pinned ones never, and the byte figure the stats report.
"""

from __future__ import annotations

import torch

from hearth_engine.model.state import Snapshot, SnapshotTable


def _snapshot(tokens: int, nbytes: int = 400) -> Snapshot:
    return Snapshot(tokens, (torch.zeros(nbytes // 4),), (None,))


def test_the_longest_snapshot_inside_a_match() -> None:
    table = SnapshotTable(list)
    prompt = list(range(100))
    table.put("ns", prompt[:10], _snapshot(10))
    table.put("ns", prompt[:40], _snapshot(40))
    table.put("ns", [*prompt[:20], 999], _snapshot(21))  # another path: never a prefix
    table.put("other", prompt[:60], _snapshot(60))  # another namespace
    assert table.longest("ns", prompt, 100) == 40
    assert table.longest("ns", prompt, 39) == 10
    assert table.longest("ns", prompt, 9) == 0
    assert table.longest("other", prompt, 59) == 0
    snapshot = table.get("ns", prompt[:40])
    assert snapshot is not None and snapshot.tokens == 40


def test_least_recently_used_unpinned_snapshots_go_first_pins_stay() -> None:
    pins: list[tuple[str, list[int]]] = [("ns", [0])]
    table = SnapshotTable(lambda: pins, max_unpinned=2)
    table.put("ns", [0], _snapshot(1))  # pinned
    for n in (1, 2, 3):
        table.put("ns", [n], _snapshot(1))
    assert table.get("ns", [0]) is not None
    assert table.get("ns", [1]) is None  # the oldest unpinned
    assert table.get("ns", [2]) is not None  # used just now: [3] is the oldest
    table.put("ns", [4], _snapshot(1))
    assert table.get("ns", [3]) is None
    assert table.count == 3 and table.nbytes == 3 * 400
    pins.clear()  # unpinned: now it counts against the limit too
    assert table.clear() == 3 * 400
    assert table.count == 0 and table.nbytes == 0
    assert table.longest("ns", [4], 1) == 0


def test_unpinned_snapshots_stay_within_their_bytes() -> None:
    table = SnapshotTable(list, max_unpinned=16, max_unpinned_bytes=1000)
    for n in range(5):
        table.put("ns", [n], _snapshot(1, 400))
    assert table.count == 2 and table.nbytes == 800  # the two newest
    assert table.get("ns", [4]) is not None and table.get("ns", [3]) is not None
    # Larger than the limit alone: kept while it is the newest (its prefix was just
    # cached, and a pin's is pinned only after this), the others make room.
    table.put("ns", [9], _snapshot(1, 2000))
    assert table.get("ns", [9]) is not None and table.count == 1
    table.put("ns", [4], _snapshot(1, 400))  # no longer the newest: it goes
    assert table.get("ns", [9]) is None and table.nbytes == 400
    table.put("ns", [3], _snapshot(1, 400))
    table.put("ns", [4], _snapshot(1, 400))  # replacing one counts its bytes once
    assert table.nbytes == 800


def test_a_snapshot_round_trips_through_named_tensors() -> None:
    conv = (torch.randn(6, 4), torch.randn(6, 4))
    rec = (torch.randn(2, 3, 3), None)
    snapshot = Snapshot(12, conv, rec)
    again = Snapshot.from_tensors(12, 2, snapshot.tensors())
    assert all(torch.equal(a, b) for a, b in zip(again.conv, conv, strict=True))
    assert again.recurrent[1] is None and torch.equal(again.recurrent[0], rec[0])
    assert again.nbytes == snapshot.nbytes
