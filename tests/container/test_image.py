"""The engine's image (addon/Dockerfile), built with scripts/image and run with podman.

One container runs the whole story a Home Assistant OS user goes through: first start
(API key made, kernels built for this CPU into /data), a pinned house and a chat over it,
a refused request without the key, a restart that restores the pin from /data.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hearth_bench.container import ContainerEngine, podman, run_flags

from .conftest import ROOT

START_S = 300.0  # model load on 2 busy cores; the kernels build in the background
HOUSE = "You control a home. Devices:\n" + "\n".join(
    f"- light.room_{n}: Room {n} Lamp (area Room {n}; aliases: lamp {n}, light {n})"
    for n in range(120)
)


@pytest.fixture(scope="module")
def container(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ContainerEngine]:
    running = ContainerEngine(image, tmp_path_factory.mktemp("data"))
    started = time.monotonic()
    try:
        running.start(START_S)
        print(f"\n[container] first start healthy in {time.monotonic() - started:.1f} s")
        yield running
    finally:
        print(f"[container] log tail:\n{running.logs()[-1500:]}")
        running.stop()


def _chat(container: ContainerEngine) -> dict[str, Any]:
    status, body = container.request(
        "POST",
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "system", "content": HOUSE},
                {"role": "user", "content": "Turn on the Room 7 Lamp"},
            ],
            "max_tokens": 8,
            "temperature": 0,
        },
    )
    assert status == 200, body
    return body


def test_first_start_makes_a_private_key(container: ContainerEngine) -> None:
    key = container.data / "api-key"
    assert len(key.read_text().strip()) >= 40
    assert key.stat().st_mode & 0o777 == 0o600


def test_requests_without_the_key_are_refused(container: ContainerEngine) -> None:
    """The add-on listens on every interface of its network: the key is required."""
    status, body = container.request("GET", "/v1/models", key=None)
    assert status == 401, body
    assert body["error"]["type"]
    status, _ = container.request("GET", "/v1/models", key="wrong")
    assert status == 401
    assert container.request("GET", "/v1/models")[0] == 200


def test_chat_over_a_pinned_house(container: ContainerEngine) -> None:
    status, pin = container.request(
        "PUT", "/v1/prefixes/house", {"messages": [{"role": "system", "content": HOUSE}]}
    )
    assert status == 200, pin
    assert pin["state"] == "ready" and pin["tokens"] > 1000
    reply = _chat(container)
    cached = reply["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= pin["tokens"] - 8, reply["usage"]
    print(f"[container] idle engine RSS after the pin: {container.engine_rss_mib():.0f} MiB")


def test_kernels_built_for_this_cpu_in_data(container: ContainerEngine) -> None:
    """The image carries a compiler, not kernels: the first start builds them for the
    CPU it runs on, into /data (kept across restarts and image updates)."""
    assert container.wait_kernels() == "active", container.logs()[-3000:]
    assert list((container.data / "cache" / "kernels").glob("*/hearth_native*.so"))


def test_restart_restores_the_pin_from_data(container: ContainerEngine) -> None:
    container.restart(START_S)
    status, pins = container.request("GET", "/v1/prefixes")
    assert status == 200
    (house,) = [p for p in pins["data"] if p["name"] == "house"]
    assert house["restored"] is True, house
    reply = _chat(container)
    assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] >= house["tokens"] - 8
    # Loaded from /data after the restart, not built again.
    assert container.logs().count("Building the native kernels") == 1


def test_bad_option_stops_with_a_clear_line(image: str, tmp_path: Path) -> None:
    (tmp_path / "options.json").write_text(json.dumps({"model": "/share/nothing.gguf"}))
    done = subprocess.run(
        [
            "podman",
            "run",
            "--rm",
            *run_flags(),
            "--network",
            "none",
            "-v",
            f"{tmp_path}:/data",
            image,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert "model /share/nothing.gguf does not exist" in done.stderr
    assert "Traceback" not in done.stderr


def test_image_names_no_archive(image: str) -> None:
    """The base was made from this machine's apt sources; the image keeps none of them."""
    done = podman(
        "run", "--rm", *run_flags(), "--network", "none", "--entrypoint", "sh", image,
        "-c", "cat /etc/apt/sources.list* /etc/apt/sources.list.d/* 2>/dev/null | grep -c '^deb'",
        check=False,
    )  # fmt: skip
    assert done.stdout.strip() == "0", done.stdout


def test_addon_repository_layout() -> None:
    """What the add-on store reads: repository.yaml at the root, and one add-on folder
    with its config, build file, Dockerfile, docs, icon and logo."""
    assert (ROOT / "repository.yaml").is_file()
    for name in ("config.yaml", "build.yaml", "Dockerfile", "DOCS.md", "icon.png", "logo.png"):
        assert (ROOT / "addon" / name).is_file(), name
