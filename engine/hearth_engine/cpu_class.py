"""``HEARTH_CPU``: run the engine as a smaller x86 CPU would, on this one.

Home Assistant runs on CPUs of three x86 classes, and the engine computes differently on
each: ``avx2`` (x86-64-v3: an N100 mini PC, an older NUC, Zen 2/3; no AVX-512, no native
bf16), ``avx512`` (AVX-512 with VNNI and BF16 but no AMX: Zen 4, Cooper Lake) and
``amx`` (AVX-512 BF16 and AMX tiles: Xeons since Sapphire Rapids). ``HEARTH_CPU`` picks
one of them, so that a host of a higher class measures and tests the lower ones:

* Hearth's C++ kernels build with the class's instruction-set flags instead of
  ``-march=native`` (``compile_flags``), into a cache folder of their own;
* torch's own kernels are capped: ``ATEN_CPU_CAPABILITY`` (ATen's vectorised operators),
  ``ONEDNN_MAX_CPU_ISA`` (oneDNN: bf16 matrix products, packed linears) and
  ``MKL_ENABLE_INSTRUCTIONS`` (MKL: float32 matrix products), set by
  ``apply_environment`` before torch chooses its kernels;
* everything the engine decides from ``/proc/cpuinfo`` (bf16 by default, AMX tiles in
  attention, oneDNN-packed bf16 linears) sees the class's flags (``capped_flags``), so
  ``--dtype auto`` is float32 under ``avx2``, as on an N100.

``native`` (the default) is the host's own: ``-march=native`` and torch uncapped.

The ``avx512`` class has BF16: the AVX-512 CPUs a house buys new today are Zen 4 mini
PCs, which compute bf16 natively, and the kernels' vector bf16 paths (VDPBF16PS) are
what sets that class apart from ``amx``. An Ice or Tiger Lake (AVX-512 without BF16)
picks float32 as the ``avx2`` class does, so ``avx2`` measures it from below.

A class is emulated only in what the code may use: the host's caches, memory bandwidth
and clock stay its own, so a capped run's timings are what a CPU of the class does at
best, not its figures. A class the host cannot run is refused in one line, never run into
an illegal instruction. Classes are x86-64 only.

Torch-free: the package's ``__init__`` applies the environment before anything imports
torch.
"""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass
from pathlib import Path

ENV = "HEARTH_CPU"
NATIVE = "native"
X86 = frozenset({"x86_64", "amd64"})


class CpuClassError(ValueError):
    """A ``HEARTH_CPU`` the engine cannot honour: unknown, or above this host."""


@dataclass(frozen=True)
class CpuClass:
    """One x86 class: what its code may use and how each part is capped to it."""

    name: str
    march: tuple[str, ...]  # GCC's flags for Hearth's kernels
    flags: frozenset[str]  # the /proc/cpuinfo flags the class has (and the host needs)
    aten: str  # ATEN_CPU_CAPABILITY
    onednn: str  # ONEDNN_MAX_CPU_ISA
    mkl: str  # MKL_ENABLE_INSTRUCTIONS

    def describe(self, host: str) -> str:
        """``avx2 (emulated on a host with amx)`` or ``amx (the host's own)``."""
        if host == self.name:
            return f"{self.name} (the host's own)"
        return f"{self.name} (emulated on a host with {host})"


# x86-64-v2 and -v3 as GCC defines them (v3: AVX2, FMA, F16C, BMI1/2, LZCNT, MOVBE),
# in /proc/cpuinfo's names; v4 adds the AVX-512 foundation, BW, CD, DQ and VL.
_V2 = frozenset({"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"})
_V3 = _V2 | {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
_BF16 = frozenset({"avx512_vnni", "avx512_bf16"})

AVX2 = CpuClass("avx2", ("-march=x86-64-v3",), _V3, "avx2", "AVX2", "AVX2")
AVX512 = CpuClass(
    "avx512",
    ("-march=x86-64-v4", "-mavx512vnni", "-mavx512bf16"),
    _V4 | _BF16,
    "avx512",
    "AVX512_CORE_BF16",
    "AVX512_E3",  # MKL's AVX-512 with VNNI and bfloat16
)
AMX = CpuClass(
    "amx",
    ("-march=x86-64-v4", "-mavx512vnni", "-mavx512bf16", "-mamx-tile", "-mamx-bf16"),
    _V4 | _BF16 | {"amx_tile", "amx_bf16"},
    "avx512",  # ATen's highest; AMX reaches torch through oneDNN and MKL
    # oneDNN 3.12 counts AVX512-FP16 in its AMX level (avx10_1_512_amx): every CPU with
    # AMX-BF16 has it (Sapphire Rapids on).
    "AVX512_CORE_AMX",
    "AVX512_E4",  # MKL's AVX-512 with AMX
)
CLASSES = {c.name: c for c in (AVX2, AVX512, AMX)}  # lowest first


@functools.cache
def host_flags() -> frozenset[str]:
    """This CPU's ``/proc/cpuinfo`` flags (empty where there is no such file)."""
    try:
        return frozenset(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return frozenset()


def host_class(flags: Iterable[str] | None = None, machine: str | None = None) -> str:
    """The highest class the host runs; elsewhere its machine (``aarch64``), or
    ``x86-64`` below AVX2."""
    machine = (machine or platform.machine()).lower()
    if machine not in X86:
        return machine
    have = host_flags() if flags is None else frozenset(flags)
    runs = [c.name for c in CLASSES.values() if c.flags <= have]
    return runs[-1] if runs else "x86-64"


def resolve(
    value: str | None, flags: Iterable[str] | None = None, machine: str | None = None
) -> CpuClass | None:
    """The class ``value`` names (``None``: native); ``CpuClassError`` when it is
    unknown or this host lacks an instruction it needs."""
    name = (value or NATIVE).strip().lower()
    if name == NATIVE:
        return None
    if name not in CLASSES:
        raise CpuClassError(f"{ENV}={value}: choose {', '.join(CLASSES)} or {NATIVE}")
    machine = (machine or platform.machine()).lower()
    if machine not in X86:
        raise CpuClassError(
            f"{ENV}={name}: CPU classes are x86-64 only (this machine is {machine}); use {NATIVE}"
        )
    cls = CLASSES[name]
    have = host_flags() if flags is None else frozenset(flags)
    missing = sorted(cls.flags - have)
    if missing:
        runs = [c.name for c in CLASSES.values() if c.flags <= have]
        raise CpuClassError(
            f"{ENV}={name}: this CPU lacks {', '.join(missing)} "
            f"(it runs {', '.join([*runs, NATIVE])})"
        )
    return cls


def selected() -> CpuClass | None:
    """The class ``HEARTH_CPU`` names for this process (``None``: native)."""
    return resolve(os.environ.get(ENV))


def capped_flags(flags: Iterable[str], cls: CpuClass | None) -> frozenset[str]:
    """What the engine may assume of the CPU: the host's flags, less the AVX and AMX
    extensions that ``cls`` lacks (every class has the rest of x86-64-v3)."""
    have = frozenset(flags)
    if cls is None:
        return have
    return frozenset(f for f in have if not f.startswith(("avx", "amx")) or f in cls.flags)


def describe(cls: CpuClass | None = None, host: str | None = None) -> str:
    """How logs and benchmarks name the class: ``native (the host's own: amx)`` or
    ``avx2 (emulated on a host with amx)``."""
    host = host or host_class()
    return f"{NATIVE} (the host's own: {host})" if cls is None else cls.describe(host)


def report(cls: CpuClass | None = None, host: str | None = None) -> dict[str, object]:
    """``/v1/stats``' fields: the class, whether it is emulated, the host's class."""
    host = host or host_class()
    return {
        "cpu_class": NATIVE if cls is None else cls.name,
        "cpu_class_emulated": cls is not None and cls.name != host,
        "cpu_host_class": host,
    }


def environment(cls: CpuClass | None) -> dict[str, str]:
    """The variables that cap torch to ``cls`` (none for native)."""
    if cls is None:
        return {}
    return {
        "ATEN_CPU_CAPABILITY": cls.aten,
        "ONEDNN_MAX_CPU_ISA": cls.onednn,
        "MKL_ENABLE_INSTRUCTIONS": cls.mkl,
    }


def apply_environment(environ: MutableMapping[str, str] | None = None) -> CpuClass | None:
    """Cap torch to the ``HEARTH_CPU`` class: set its variables in ``environ`` (this
    process's, so its children's too). Torch reads them once, at its first operator
    (ATen) and its first matrix products (oneDNN, MKL), so this runs when ``hearth_engine`` is
    imported (``__init__``), before the engine touches torch. A class it cannot honour
    changes nothing here: ``selected`` raises its error where the engine starts."""
    env = os.environ if environ is None else environ
    try:
        cls = resolve(env.get(ENV))
    except CpuClassError:
        return None
    env.update(environment(cls))
    return cls
