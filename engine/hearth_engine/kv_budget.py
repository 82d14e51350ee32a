"""The KV budget's default: a share of the memory this box (or container) has left.

Home Assistant's own boxes are small (HA Green: 4 GB, of which Home Assistant takes about
1 GB), and the engine often runs in a container (an add-on) whose cgroup limit is lower
than the RAM the kernel reports. So on a CPU the default is

    budget = clamp(room / 4, 256 MiB, 1 GiB)
    room   = min(MemAvailable, cgroup limit - cgroup usage)

measured once the model is loaded, so ``room`` is what is left beside the weights:

* a **quarter**, because the budget is the KV's ceiling, not all the engine adds: the
  working buffers it reserves inside it, the allocator's slack and the page cache of the
  model file come on top, and Home Assistant and its add-ons keep growing after the
  engine starts. On an HA Green (about 1.7 GB left) that is about 430 MiB: 19k tokens of
  the default model, three pinned houses of 6k tokens;
* at least **256 MiB**: one pinned house of the demo's size (6.3k tokens of the default
  model, 145 MiB) with room to serve requests beside it; below that the cache cannot do
  its job, and ``--kv-cache-mb`` is the way to say so;
* at most **1 GiB**: 46k tokens of the default model. On a CPU decode slows with the
  context long before that, so a larger cache only raises the engine's resident memory.

On CUDA it is a fifth of the free VRAM (at most 16 GiB): no household service shares it.
No torch here: the rule is a pure function of memory figures, read by ``read_host``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MIB = 1 << 20
CPU_SHARE = 4  # the budget is room / CPU_SHARE
CPU_FLOOR = 256 * MIB
CPU_CEILING = 1024 * MIB
CUDA_SHARE = 5
CUDA_CEILING = 16 * 1024 * MIB
# cgroup v1 reports "no limit" as a huge number near 2^63 (rounded to pages).
NO_LIMIT = 1 << 60

CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class HostMemory:
    """Memory figures in bytes: ``available`` is /proc/meminfo's MemAvailable; the
    cgroup's ``limit``/``usage`` are ``None`` where there is no limit."""

    available: int
    cgroup_limit: int | None = None
    cgroup_usage: int | None = None

    @property
    def room(self) -> int:
        """What this process can still take: the smaller of the host's and the cgroup's."""
        if self.cgroup_limit is None:
            return self.available
        left = self.cgroup_limit - (self.cgroup_usage or 0)
        return max(0, min(self.available, left))


@dataclass(frozen=True)
class Budget:
    bytes: int
    rule: str  # one line: how it was chosen (logged at start, shown in /v1/stats)


def cpu_budget(memory: HostMemory) -> Budget:
    """``clamp(room / 4, 256 MiB, 1 GiB)`` with the figures it came from."""
    share = memory.room // CPU_SHARE
    chosen = min(max(share, CPU_FLOOR), CPU_CEILING)
    where = f"{memory.available // MIB} MiB available"
    if memory.cgroup_limit is not None:
        where += (
            f", cgroup limit {memory.cgroup_limit // MIB} MiB"
            f" with {(memory.cgroup_usage or 0) // MIB} MiB used"
        )
    bound = " (the floor)" if share < CPU_FLOOR else " (the ceiling)" if share > CPU_CEILING else ""
    return Budget(
        chosen,
        f"a quarter of {memory.room // MIB} MiB of room ({where}), between"
        f" {CPU_FLOOR // MIB} and {CPU_CEILING // MIB} MiB{bound}",
    )


def cuda_budget(free: int) -> Budget:
    chosen = min(max(free // CUDA_SHARE, CPU_FLOOR), CUDA_CEILING)
    return Budget(
        chosen,
        f"a fifth of {free // MIB} MiB of free GPU memory, between {CPU_FLOOR // MIB}"
        f" and {CUDA_CEILING // MIB} MiB",
    )


def parse_limit(text: str) -> int | None:
    """A cgroup memory limit file's value (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``): ``None`` for no limit ("max", or v1's huge number)."""
    value = text.strip()
    if not value or value == "max":
        return None
    number = int(value)
    return None if number >= NO_LIMIT else number


def cgroup_dirs(proc_cgroup: str, root: Path = CGROUP_ROOT) -> list[tuple[Path, str, str]]:
    """Where this process's memory limit can be read, nearest first: ``(folder, limit
    file, usage file)`` for cgroup v2 (``0::/path``) and v1 (``N:memory:/path``), each at
    the process's own path and at the root (inside a container the namespace's root is
    the container's own cgroup)."""
    found: list[tuple[Path, str, str]] = []
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        rel = path.strip().lstrip("/")
        if controllers == "":
            for folder in (root / rel, root):
                found.append((folder, "memory.max", "memory.current"))
        elif "memory" in controllers.split(","):
            for folder in (root / "memory" / rel, root / "memory"):
                found.append((folder, "memory.limit_in_bytes", "memory.usage_in_bytes"))
    return found


def read_cgroup(
    root: Path = CGROUP_ROOT, proc: Path = Path("/proc/self/cgroup")
) -> tuple[int | None, int | None]:
    """``(limit, usage)`` of the nearest cgroup with a memory limit, else ``(None, None)``."""
    try:
        text = proc.read_text()
    except OSError:
        return None, None
    for folder, limit_file, usage_file in cgroup_dirs(text, root):
        try:
            limit = parse_limit((folder / limit_file).read_text())
        except (OSError, ValueError):
            continue
        if limit is None:
            continue
        try:
            usage = int((folder / usage_file).read_text().strip())
        except (OSError, ValueError):
            usage = None
        return limit, usage
    return None, None


def read_host(meminfo: Path = Path("/proc/meminfo"), root: Path = CGROUP_ROOT) -> HostMemory:
    """This host's figures (``psutil`` off Linux, where there is no /proc/meminfo)."""
    available = None
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        available = None
    if available is None:
        import psutil

        available = int(psutil.virtual_memory().available)
    limit, usage = read_cgroup(root)
    return HostMemory(available, limit, usage)
