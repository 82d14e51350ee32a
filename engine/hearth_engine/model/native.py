"""Hearth's C++ kernels: built once per host into ``~/.cache/hearth``, loaded, or skipped.

One extension module, ``hearth_native`` (``kernels/``):

* ``decode_attention.cpp``: the decode attention of the CPU path (see its header): one
  call per layer and step that reads each cached key once for every grouped head and
  row, split over threads, in float32 (bfloat16 KV by AVX512-BF16: ``attention_bf16.h``,
  or on AMX tiles: ``attention_amx.h``);
* ``prefix_attention.cpp``: the warm prefill's attention over a cached prefix part (many
  queries, no mask) and over its own keys (causal), in bfloat16 dot products on CPUs
  with AVX512-BF16, or in float32 with AVX2 and FMA (``prefix_f32.h``);
* ``decode_linear.cpp``: the linears of a decode step, from weights re-laid out once
  as tiles of 16 output features (``linear.py``): a call costs 1-2 us, where oneDNN's
  costs ~17 us, and the weights stream faster;
* ``quant_linear.cpp``: linears from 4- and 8-bit weights that stay packed (GGUF's
  Q4_0/Q4_K/Q5_K/Q6_K/Q8_0 and ``--quantize int4``; ``model/quant/``): decode rows
  through integer dots, prefill through a dequantized scratch matrix
  (``quant_dequant.h``); one header per instruction-set path: AVX-512 VNNI
  (``quant_avx512.h``), AVX2 (``quant_avx2.h``), Arm's SDOT (``quant_neon.h``), generic
  code elsewhere (``quant_generic.h``), over ``quant_common.h``;
* ``layer_ops.cpp``: a decode step's RMSNorm and rotary embedding, one call each
  (``decoder.py``), with torch's roundings;
* ``decode_step.cpp``: a one-token step's decoder layers in one call, with the kernels
  above and torch's own operations in the Python loop's order (``native_step.py``);
* ``vec.h``: the vector helpers they share.

It is compiled with ``torch.utils.cpp_extension`` for the host's own instruction set, or
for the ``HEARTH_CPU`` class's (``cpu_class.py``: ``-march=x86-64-v3`` for ``avx2``), so
the build folder is keyed by the torch version, the CPU (``hardware.host_key``: model
name and flags) and a hash of the flags and sources: a cache copied to another CPU or
torch is rebuilt, never loaded, and each class has a folder of its own.

Nothing depends on it. Building takes 35 s to a minute on a small CPU, so an engine whose
host has no build yet builds it on a background thread (``prepare``) and uses torch's
kernels until it is ready; ``scripts/setup`` builds it ahead, and a built one is loaded
at start (a file import: no compiler needed). A failed build (no C++ compiler, no ninja,
a torch without headers) or load is logged in one line, and torch's kernels serve from
then on. ``HEARTH_NATIVE=0`` turns it off; ``HEARTH_NATIVE_MODULE=<file.so>`` loads that
build instead (the aarch64 check under emulation: docs/development.md).

The same sources build on x86 (AVX2, AVX-512, AMX paths where the compiler targets them)
and on aarch64, where every kernel takes its generic vector path (GCC vector extensions,
which it lowers to NEON); ``prefix_attention`` refuses there as on x86 CPUs without
AVX512-BF16, and its caller uses torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import logging
import os
import platform
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import torch

from .. import cpu_class
from ..cpu_class import CpuClass
from .hardware import host_key
from .prepare.cache_dir import cache_root

_LOGGER = logging.getLogger(__name__)

NAME = "hearth_native"
KERNELS = Path(__file__).parent / "kernels"
SOURCES = tuple(
    KERNELS / f
    for f in (
        "module.cpp",
        "decode_attention.cpp",
        "prefix_attention.cpp",
        "decode_linear.cpp",
        "quant_linear.cpp",
        "layer_ops.cpp",
        "decode_step.cpp",
    )
)
HEADERS = tuple(
    KERNELS / f
    for f in (
        "hearth_native.h",
        "quant_linear.h",
        "quant_common.h",
        "quant_avx512.h",
        "quant_avx2.h",
        "quant_neon.h",
        "quant_generic.h",
        "quant_dequant.h",
        "decode_step.h",
        "vec.h",
        "attention_amx.h",
        "attention_bf16.h",
        "prefix_amx.h",
        "prefix_common.h",
        "prefix_f32.h",
    )
)
ENV_SWITCH = "HEARTH_NATIVE"
AMX_SWITCH = "HEARTH_AMX"  # "0": no AMX tiles in attention (decode: vectors; prefill: torch)
# A module built elsewhere (scripts/lib/aarch64_check.sh cross-compiles one), loaded
# instead of the host's build: for checks only, as nothing verifies it fits this torch.
PREBUILT = "HEARTH_NATIVE_MODULE"
# The host's instruction set, by ``platform.machine()``: GCC spells it -march=native on
# x86 and -mcpu=native on Arm (the CPU's own tuning and extensions: dotprod on an A55 or
# A76, not on a Pi 4's A72); elsewhere the compiler's default.
ARCH_FLAGS = {
    "x86_64": ("-march=native",),
    "amd64": ("-march=native",),
    "aarch64": ("-mcpu=native",),
    "arm64": ("-mcpu=native",),
}
# The float rules that let the dot product vectorise (reassociation only: infinities and
# NaNs keep their meaning).
MATH_FLAGS = (
    "-fopenmp",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-fno-signed-zeros",
    "-fassociative-math",
)


def compile_flags(machine: str | None = None, cls: CpuClass | None = None) -> tuple[str, ...]:
    """The C++ flags for ``machine`` (default: this one's ``platform.machine()``), or for
    the x86 class ``cls`` (``HEARTH_CPU``) instead of the host's own instruction set."""
    arch = (
        cls.march
        if cls is not None
        else ARCH_FLAGS.get((machine or platform.machine()).lower(), ())
    )
    return ("-O3", *arch, *MATH_FLAGS)


def cflags() -> tuple[str, ...]:
    """This process's flags: the host's, or its ``HEARTH_CPU`` class's."""
    return compile_flags(cls=cpu_class.selected())


STALE_LOCK_S = 900.0  # the longest wait for another process's build (one takes a minute)
LOCK_POLL_S = 1.0  # how often a build lock held by another process is tried again
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
HEAD_SIZES = (16, 32, 64, 96, 128, 256)
PREFIX_HEAD_SIZES = (32, 64, 128, 256)  # prefix_attention.cpp's


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.module: ModuleType | None = None
        self.error: str | None = None
        self.thread: threading.Thread | None = None
        self.paused = False


_STATE = _State()


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1") not in {"0", "false", "off", "no"}


def build_dir() -> Path:
    """``~/.cache/hearth/kernels/<torch>-<host key>-<source hash>``."""
    base = cache_root() / "kernels"
    digest = hashlib.sha256(" ".join(cflags()).encode())
    for path in (*SOURCES, *HEADERS):
        digest.update(path.read_bytes())
    source = digest.hexdigest()[:12]
    return base / f"{torch.__version__}-{host_key()}-{source}"


def load() -> ModuleType | None:
    """Load the kernels, building them first (once per host and version) when they are
    not in the cache; ``None`` if they cannot be had.

    Thread-safe; a failure is remembered (and logged once), so later calls return
    ``None`` at once.
    """
    if not enabled():
        return None
    with _STATE.lock:
        if _STATE.module is not None or _STATE.error is not None:
            return _STATE.module
        started = time.monotonic()
        prebuilt = os.environ.get(PREBUILT)
        try:
            module = _import(Path(prebuilt)) if prebuilt else _load_or_build(build_dir())
        except Exception as err:  # noqa: BLE001 - any build or load failure means "skip"
            text = str(err).strip()
            reason = text.splitlines()[-1] if text else type(err).__name__
            _STATE.error = reason
            _LOGGER.warning("Native kernels unavailable, using torch's (%s)", reason)
            return None
        _STATE.module = module
        tiles = module.use_attention_amx(amx_wanted())
        _LOGGER.info(
            "Native kernels ready (%.1f s)%s",
            time.monotonic() - started,
            ", attention on AMX tiles" if tiles else "",
        )
        return module


def amx_wanted() -> bool:
    """Whether attention may run on AMX tiles: not with ``HEARTH_AMX=0``, nor under a
    ``HEARTH_CPU`` class below ``amx`` (whose build has no tiles anyway)."""
    chosen = cpu_class.selected()
    below = chosen is not None and "amx_tile" not in chosen.flags
    return os.environ.get(AMX_SWITCH, "1") != "0" and not below


def _load_or_build(folder: Path) -> ModuleType:
    """Import the built module, or build it (a folder whose module does not import is
    built again from scratch)."""
    with _build_lock(folder):
        # cpp_extension holds ``lock`` while it builds, and waits forever for one that
        # another process holds. Holding the build lock, nobody else builds here: a
        # ``lock`` now was left by a build that was killed (a test's background build
        # ends with its process), and would block every later one.
        lock = folder / "lock"
        if lock.exists():
            _LOGGER.warning("Removing the lock of a native build that did not finish")
            with contextlib.suppress(OSError):
                lock.unlink()
        built = sorted(folder.glob(f"{NAME}*.so"))
        if built:
            try:
                return _import(built[0])
            except ImportError as err:
                _LOGGER.warning("Rebuilding the native kernels (%s)", err)
                shutil.rmtree(folder, ignore_errors=True)
        return _build(folder)


@contextlib.contextmanager
def _build_lock(folder: Path) -> Iterator[None]:
    """Hold ``<folder>.flock`` (an OS lock: it goes with its process) while loading or
    building ``folder``, waiting for another holder in a bounded loop: looked at every
    ``LOCK_POLL_S``, ``TimeoutError`` after ``STALE_LOCK_S`` (the kernels are skipped)."""
    import fcntl  # POSIX only, as the build is

    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.with_name(folder.name + ".flock"), "a") as handle:
        deadline = time.monotonic() + STALE_LOCK_S
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"another process has been building the native kernels for "
                        f"{STALE_LOCK_S:.0f} s"
                    ) from None
                time.sleep(LOCK_POLL_S)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(folder: Path) -> ModuleType:
    from torch.utils.cpp_extension import load as load_extension

    _LOGGER.info(
        "Building the native kernels (once for this host; about a minute): %s", " ".join(cflags())
    )
    bin_dir = str(Path(sys.executable).parent)  # a venv's ninja (requirements/engine.txt)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join(filter(None, (bin_dir, os.environ.get("PATH"))))
    folder.mkdir(parents=True, exist_ok=True)
    return load_extension(
        name=NAME,
        sources=[str(path) for path in SOURCES],
        extra_cflags=list(cflags()),
        extra_ldflags=["-fopenmp"],
        build_directory=str(folder),
        verbose=False,
    )


def _import(path: Path) -> ModuleType:
    """Import a built extension module from its file (needs no compiler or ninja)."""
    spec = importlib.util.spec_from_file_location(NAME, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def is_built() -> bool:
    """Whether this host's build is in the cache (loading it then takes a second)."""
    if os.environ.get(PREBUILT):
        return enabled()
    return enabled() and any(build_dir().glob(f"{NAME}*.so"))


def prepare() -> None:
    """Load the kernels now when they are built, else build them in the background.

    An engine calls this at start: a built kernel serves from the first request (the
    same arithmetic throughout a run), and a missing one never delays start-up.
    """
    if is_built():
        load()
    else:
        start()


def state() -> str:
    """``active``, ``building``, ``off`` or ``failed`` (for ``/v1/stats``)."""
    if _STATE.module is not None:
        return "active"
    if not enabled():
        return "off"
    if _STATE.error is not None:
        return "failed"
    return "building" if _STATE.thread is not None else "off"


def start() -> None:
    """Build and load on a background thread (idempotent); ``module`` answers when done."""
    if not enabled() or not all(path.is_file() for path in SOURCES):
        return
    with _STATE.lock:
        if _STATE.thread is not None or _STATE.module is not None or _STATE.error is not None:
            return
        _STATE.thread = threading.Thread(target=load, name="hearth-native-build", daemon=True)
        _STATE.thread.start()


def wait(timeout: float | None = None) -> None:
    """Wait for a background build started by ``start`` (tests, benchmarks)."""
    thread = _STATE.thread
    if thread is not None:
        thread.join(timeout)


def module() -> ModuleType | None:
    """The loaded kernels, or ``None`` while building, after a failure, when off, or
    while ``paused``."""
    return None if _STATE.paused else _STATE.module


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Torch's kernels serve inside the block (benchmarks compare the two)."""
    before, _STATE.paused = _STATE.paused, True
    try:
        yield
    finally:
        _STATE.paused = before


def error() -> str | None:
    """Why the kernels are not in use, once a build or load has failed."""
    return _STATE.error


def disable(reason: str) -> None:
    """Stop using the kernels (a call they refused); logged once."""
    with _STATE.lock:
        if _STATE.module is None:
            return
        _STATE.module = None
        _STATE.error = reason
    _LOGGER.warning("Native kernels disabled, using torch's (%s)", reason)


def reset() -> None:
    """Forget the loaded module and any failure (tests)."""
    with _STATE.lock:
        _STATE.module = None
        _STATE.error = None
        _STATE.thread = None
