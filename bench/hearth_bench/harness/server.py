"""Start and stop a real engine server process on a free loopback port."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from .process import ServerStartError, wait_healthy


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EngineProcess:
    """``python -m hearth_engine serve`` as a child process; logs go to ``log_path``."""

    def __init__(
        self,
        args: Sequence[str],
        log_path: Path,
        port: int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [*args, "--host", "127.0.0.1", "--port", str(self.port)]
        self.log_path = log_path
        self.env = dict(env or {})  # on top of this process's environment
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 300) -> EngineProcess:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        env.update(self.env)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hearth_engine", "serve", *self.args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        log.close()
        try:
            wait_healthy(self.proc, self.url, timeout, "engine")
        except ServerStartError as err:
            self.stop()
            raise RuntimeError(f"{err}; see {self.log_path}") from err
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


@contextlib.contextmanager
def engine_process(args: Sequence[str], log_path: Path) -> Iterator[EngineProcess]:
    proc = EngineProcess(args, log_path).start()
    try:
        yield proc
    finally:
        proc.stop()
