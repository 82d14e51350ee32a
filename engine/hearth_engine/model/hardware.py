"""Device and dtype choice, and process-level tuning for CPU inference."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

from .. import cpu_class
from ..cpu_class import CpuClass, CpuClassError

T = TypeVar("T")

_LOGGER = logging.getLogger(__name__)

DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
    # For exactness tests: rounding noise small enough that greedy choices never flip.
    "float64": torch.float64,
    "fp64": torch.float64,
}


def host_key() -> str:
    """What code built for this host depends on besides its sources: Python, machine and
    CPU (model name and flags), and the ``HEARTH_CPU`` class when one is chosen. Keys the
    compiled step's and the native kernels' caches."""
    cpu = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith(("model name", "flags")):
                cpu += line
            if line.startswith("flags"):
                break
    facts = "|".join((platform.python_version(), platform.machine(), cpu))
    chosen = cpu_class.selected()
    if chosen is not None:  # native keeps the key it always had
        facts += f"|{chosen.name}"
    return hashlib.sha256(facts.encode()).hexdigest()[:12]


def pick_device(requested: str = "auto") -> torch.device:
    """``auto`` is CUDA when present, else CPU."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(requested)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {requested}: CUDA is not available on this machine")
    return device


def _cpu_flags() -> frozenset[str]:
    """The CPU's flags as the engine may use them: the host's, capped to ``HEARTH_CPU``
    (a warm prefill asks once a layer: remembered per value of the variable)."""
    return _capped_flags(os.environ.get(cpu_class.ENV))


@functools.cache
def _capped_flags(value: str | None) -> frozenset[str]:
    return cpu_class.capped_flags(cpu_class.host_flags(), cpu_class.resolve(value))


def check_cpu_class() -> CpuClass | None:
    """The ``HEARTH_CPU`` class (``None``: native), once torch has taken its cap; logged.

    ``CpuClassError`` (a ``ValueError``: one line, exit code 2) for a class this host
    cannot run, or when torch chose its kernels before the cap was set (torch was
    imported and used before ``hearth_engine``): its timings would be the host's.
    """
    chosen = cpu_class.selected()
    if chosen is not None:
        want = chosen.aten.upper()  # as torch names its capability
        have = torch.backends.cpu.get_cpu_capability()
        if have != want:
            raise CpuClassError(
                f"{cpu_class.ENV}={chosen.name}: torch already runs {have} kernels; set it "
                "in the environment before the process starts"
            )
    # The host's own class is the usual case: said only at debug, so that a start-up
    # error stays one line. An emulated class changes every timing: said at info.
    level = logging.DEBUG if chosen is None else logging.INFO
    _LOGGER.log(level, "CPU class: %s", cpu_class.describe(chosen))
    return chosen


def cpu_has_native_bf16() -> bool:
    """True when the CPU computes bf16 natively (AVX512-BF16, AMX or ARM BF16); never
    under ``HEARTH_CPU=avx2``."""
    return bool(_cpu_flags() & {"avx512_bf16", "amx_bf16", "bf16"})


def cpu_has_amx_bf16() -> bool:
    """True when the CPU has AMX bf16 tiles (Xeon since Sapphire Rapids) and
    ``HEARTH_CPU`` is ``amx`` or ``native``."""
    return "amx_bf16" in _cpu_flags()


def pick_dtype(device: torch.device, requested: str = "auto") -> torch.dtype:
    """bf16 where the hardware computes it natively, else fp32 (or fp16 on old GPUs)."""
    if requested != "auto":
        try:
            return DTYPES[requested]
        except KeyError:
            raise ValueError(
                f"--dtype {requested}: choose auto, {', '.join(sorted(DTYPES))}"
            ) from None
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_has_native_bf16() else torch.float32


def tune_cpu_allocator() -> None:
    """Keep freed tensor memory in the process instead of returning it to the OS.

    glibc serves large allocations with mmap and unmaps them on free, so every fresh KV
    or activation tensor page-faults again. On virtual machines a page fault is slow:
    measured here, cloning a 3 MB tensor 60 times took 175-214 ms by default and 32-85 ms
    with this. Memory stays bounded by the peak the engine already needs.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    ok = libc.mallopt(m_mmap_threshold, 1 << 30) and libc.mallopt(m_trim_threshold, 2**31 - 1)
    if not ok:
        _LOGGER.debug("mallopt tuning not applied")


def release_free_memory() -> bool:
    """Give the memory the allocator holds free back to the system (glibc's
    ``malloc_trim``); whether it could be asked.

    ``tune_cpu_allocator`` keeps freed memory for the next tensor of its size. That suits
    a request's buffers, but not one-off copies: the weights as loaded and their fused
    and re-laid-out intermediates at start-up, or a pin's prefill buffer and attention
    scratch. Measured with the default model and the demo house pinned: 100 MiB held
    after start-up and 135 MiB more after the pin. Called once each of those ends, when
    no request runs, so no request pays the page faults.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    trim = getattr(libc, "malloc_trim", None)  # glibc only (not musl)
    if trim is None:
        return False
    trim(0)
    return True


def set_threads(threads: int | None) -> None:
    if threads:
        torch.set_num_threads(threads)
    elif "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, os.cpu_count() or 1))


def on_passing_thread(run: Callable[[], T]) -> T:
    """``run()`` on a new thread that ends with it; its result, or its exception.

    For torch work done before the engine's worker takes over (loading the model,
    restoring pins). GNU OpenMP, which torch's CPU kernels run on, keeps a pool of worker
    threads for every thread that ever ran a parallel region, until that thread ends.
    While it counts more such threads than CPUs, every pool stops spinning between
    parallel regions and sleeps instead, and a decode step (hundreds of regions) waits
    for each wake-up. On a 2-core EPYC, the default model's decode step at a 512-token
    context took 18.8-20.0 ms on the worker when an executor thread had loaded the model
    (as ``asyncio.to_thread`` does), and 12.0-12.9 ms when a passing thread had. A thread
    that ends returns its pool, so only the worker's remains.
    """
    result: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(run())
        except BaseException as err:  # noqa: BLE001 - re-raised on the caller's thread
            error.append(err)

    thread = threading.Thread(target=target, name="hearth-setup", daemon=True)  # Ctrl-C: exit
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]
