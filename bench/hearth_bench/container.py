"""The engine's image (``addon/Dockerfile``, built by ``scripts/image``) run with podman:
the container tests and ``scripts/bench household --configs hearth_container`` both
drive it through this class, as ``EngineProcess`` drives the engine on this machine.

The container runs its own launcher (the add-on's entrypoint), published on a free
loopback port, with ``/data`` a folder here; every request carries the key the
container made on first start. Standard library only.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from .harness.server import free_port

ROOT = Path(__file__).resolve().parents[2]
IMAGE_SCRIPT = ROOT / "scripts" / "image"
KERNELS_S = 900.0  # the first start builds the kernels: a minute, more on busy cores


class ContainerError(RuntimeError):
    """The container stopped, or did not answer in time (the message ends with its log)."""


def podman(
    *args: str, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *args], capture_output=True, text=True, check=check, timeout=timeout
    )


def run_flags() -> list[str]:
    """The podman flags that run containers on this machine (``scripts/image``)."""
    done = subprocess.run([IMAGE_SCRIPT, "--run-flags"], capture_output=True, text=True, check=True)
    return done.stdout.split()


def build_image() -> str:
    """Build the image (seconds when nothing changed) and return its tag."""
    done = subprocess.run([IMAGE_SCRIPT], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ContainerError(f"scripts/image failed:\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1]


class ContainerEngine:
    """One engine container; ``start`` returns once it answers ``/health``."""

    def __init__(
        self,
        image: str,
        data: Path,
        env: dict[str, str] | None = None,
        *,
        kernels: Path | None = None,
    ) -> None:
        self.image = image
        self.data = data
        self.env = env or {}
        self.kernels = kernels  # a kernel cache shared between runs (benchmarks)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.id = ""

    @property
    def api_key(self) -> str:
        return (self.data / "api-key").read_text().strip()

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    def start(self, timeout: float = 300) -> ContainerEngine:
        self.data.mkdir(parents=True, exist_ok=True)
        args = ["run", "-d", "--init", *run_flags(), "-p", f"127.0.0.1:{self.port}:8765"]
        args += ["-v", f"{self.data}:/data"]
        if self.kernels is not None:
            self.kernels.mkdir(parents=True, exist_ok=True)
            args += ["-v", f"{self.kernels}:/data/cache/kernels"]
        for name, value in self.env.items():
            args += ["-e", f"{name}={value}"]
        self.id = podman(*args, self.image).stdout.strip()
        return self.wait_healthy(timeout)

    def restart(self, timeout: float = 300) -> ContainerEngine:
        podman("restart", "-t", "20", self.id)
        return self.wait_healthy(timeout)

    def status(self) -> str:
        return podman("inspect", "-f", "{{.State.Status}}", self.id, check=False).stdout.strip()

    def wait_healthy(self, timeout: float) -> ContainerEngine:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.status() not in {"running", "created"}:
                raise ContainerError(f"container {self.status()}:\n{self.logs()[-3000:]}")
            try:
                if self.request("GET", "/health", key=None)[0] == 200:
                    return self
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.5)
        raise ContainerError(f"no /health in {timeout:.0f} s:\n{self.logs()[-3000:]}")

    def wait_kernels(self, timeout: float = KERNELS_S) -> str:
        """Wait until the kernels built for this CPU are in use (or failed): their state."""
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = str(self.request("GET", "/v1/stats")[1].get("native_attention", ""))
            if state in {"active", "failed", "off"}:
                return state
            time.sleep(2)
        return state

    def request(
        self, method: str, path: str, body: Any = None, key: str | None = "own"
    ) -> tuple[int, Any]:
        """``(status, JSON body)``; ``key``: ``"own"`` (the container's), another, or none."""
        headers = {"Content-Type": "application/json"}
        if key == "own":
            key = self.api_key
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=600) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"null")

    def logs(self) -> str:
        done = podman("logs", self.id, check=False)
        return done.stdout + done.stderr

    def engine_rss_mib(self) -> float:
        """The largest resident set among the container's processes (the engine), read
        from /proc on this machine."""
        pid = podman("inspect", "-f", "{{.State.Pid}}", self.id).stdout.strip()
        best = 0.0
        for each in [pid, *_descendants(pid)]:
            status = Path(f"/proc/{each}/status")
            if status.exists():
                for line in status.read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        best = max(best, int(line.split()[1]) / 1024)
        return best

    def stop(self, log_path: Path | None = None) -> None:
        if not self.id:
            return
        if log_path is not None:
            log_path.write_text(self.logs())
        podman("rm", "-f", "-t", "10", self.id, check=False)


def _descendants(pid: str) -> list[str]:
    found: list[str] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        children = task / "children"
        for child in children.read_text().split() if children.exists() else []:
            found += [child, *_descendants(child)]
    return found
