"""The KV budget's default (kv_budget.py): a quarter of the room, 256 MiB to 1 GiB, where
room is the smaller of MemAvailable and what the cgroup limit leaves. No torch."""

from __future__ import annotations

from pathlib import Path

import pytest

from hearth_engine.kv_budget import (
    CPU_CEILING,
    CPU_FLOOR,
    HostMemory,
    cgroup_dirs,
    cpu_budget,
    parse_limit,
    read_cgroup,
    read_host,
)

MIB = 1 << 20
GIB = 1 << 30


@pytest.mark.parametrize(
    ("memory", "expected"),
    [
        # An HA Green: 4 GB, Home Assistant and the engine's weights loaded, 1.7 GB left.
        (HostMemory(1700 * MIB), 425 * MIB),
        # A big workstation: the ceiling.
        (HostMemory(20 * GIB), CPU_CEILING),
        # Almost nothing left: the floor, not less.
        (HostMemory(300 * MIB), CPU_FLOOR),
        # A container limited to 2 GiB on that workstation, 1 GiB of it used: its room.
        (HostMemory(20 * GIB, 2 * GIB, 1 * GIB), 256 * MIB),
        (HostMemory(20 * GIB, 3 * GIB, 1 * GIB), 512 * MIB),
        # A cgroup limit above what the host has left: the host's figure wins.
        (HostMemory(1200 * MIB, 8 * GIB, 0), 300 * MIB),
        # Usage over the limit (it can briefly be): room 0, the floor.
        (HostMemory(8 * GIB, GIB, GIB + MIB), CPU_FLOOR),
    ],
)
def test_cpu_budget_is_a_quarter_of_the_room_clamped(memory: HostMemory, expected: int) -> None:
    assert cpu_budget(memory).bytes == expected


def test_the_rule_line_names_its_figures() -> None:
    rule = cpu_budget(HostMemory(20 * GIB, 3 * GIB, GIB)).rule
    assert "2048 MiB of room" in rule and "cgroup limit 3072 MiB" in rule
    assert "(the ceiling)" in cpu_budget(HostMemory(20 * GIB)).rule
    assert "(the floor)" in cpu_budget(HostMemory(100 * MIB)).rule


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("max\n", None),  # cgroup v2, no limit
        ("9223372036854771712\n", None),  # cgroup v1, no limit
        ("2147483648\n", 2 * GIB),
        ("", None),
    ],
)
def test_parse_limit(text: str, expected: int | None) -> None:
    assert parse_limit(text) == expected


def test_cgroup_dirs_for_v2_and_v1(tmp_path: Path) -> None:
    v2 = cgroup_dirs("0::/system.slice/addon.scope\n", tmp_path)
    assert v2[0] == (tmp_path / "system.slice/addon.scope", "memory.max", "memory.current")
    assert v2[1] == (tmp_path, "memory.max", "memory.current")
    v1 = cgroup_dirs("4:memory:/docker/abc\n3:cpuset:/\n", tmp_path)
    assert [d[0] for d in v1] == [tmp_path / "memory/docker/abc", tmp_path / "memory"]
    assert v1[0][1:] == ("memory.limit_in_bytes", "memory.usage_in_bytes")


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_read_cgroup_v2_limit_at_the_namespace_root(tmp_path: Path) -> None:
    """Inside a container the process's path (``0::/``) is the container's own cgroup."""
    proc = tmp_path / "cgroup"
    _write(proc, "0::/\n")
    _write(tmp_path / "fs/memory.max", "1073741824\n")
    _write(tmp_path / "fs/memory.current", "104857600\n")
    assert read_cgroup(tmp_path / "fs", proc) == (GIB, 100 * MIB)


def test_read_cgroup_v1_nearest_limited_wins_and_no_limit_is_none(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    _write(proc, "4:memory:/docker/abc\n")
    root = tmp_path / "fs"
    _write(root / "memory/docker/abc/memory.limit_in_bytes", "9223372036854771712\n")
    _write(root / "memory/memory.limit_in_bytes", "9223372036854771712\n")
    assert read_cgroup(root, proc) == (None, None)
    _write(root / "memory/docker/abc/memory.limit_in_bytes", "536870912\n")
    _write(root / "memory/docker/abc/memory.usage_in_bytes", "1048576\n")
    assert read_cgroup(root, proc) == (512 * MIB, MIB)


def test_read_host_reads_memavailable(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  4000000 kB\nMemFree: 100 kB\nMemAvailable:  1740800 kB\n")
    host = read_host(meminfo, tmp_path / "no-cgroups")
    assert host.available == 1740800 * 1024
