"""``--house-scale N`` of scripts/develop and scripts/bench household|accuracy (issue 49.4).

The three entry points take N by the demo's own rule (hearth_demo/scale.py; its tests
are tests/hearth/test_demo_scale.py) and refuse a bad one with that rule's message,
scripts/develop before its set-up. The bench gives Home Assistant the scale through its
environment, and keeps a scaled house's household fixture in the cache under a key of
everything the capture follows from.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

import hearth_bench.accuracy.main as accuracy
import hearth_bench.household.main as household
from hearth_bench.harness import capture
from hearth_bench.harness.fixture import FIXTURE, FixtureMissingError, fixture_from_dict
from hearth_bench.harness.proxy import Recorded
from hearth_bench.harness.stack import ROOT, RUNTIME_FILES
from hearth_bench.house_scale import describe, environment, rooms_arg, scale_module
from hearth_bench.scaled_fixture import fixture_key, fixture_path, ha_version, inputs

MAX = 1000
NOT_A_NUMBER = "the house scale is a whole number of guest suites from 0 to 1000, not 'many'"
TOO_BIG = "the house scale is at most 1000 guest suites (6000 entities), not 1001"


def test_the_bench_reads_the_demos_own_rule() -> None:
    scale = scale_module()
    assert scale.__file__ == str(ROOT / "config/custom_components/hearth_demo/scale.py")
    assert (scale.MAX_ROOMS, scale.ENTITIES_PER_ROOM) == (MAX, 6)
    assert rooms_arg("32") == 32
    assert environment(32) == {"HEARTH_HOUSE_SCALE": "32"}
    assert environment(0) == {"HEARTH_HOUSE_SCALE": "0"}  # a shell's own value never leaks in


def test_the_house_a_run_used_is_one_line() -> None:
    assert describe(0, None) == "the demo house"
    assert describe(32, 298) == "the demo house + 32 guest suites: 298 entities exposed to Assist"
    assert describe(2, 80, "home maple-street").startswith("home maple-street + 2 guest suites")


def parse_error(parse: object, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        parse(argv)  # type: ignore[operator]
    assert exited.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(("value", "says"), [("many", NOT_A_NUMBER), ("1001", TOO_BIG)])
def test_household_refuses_a_bad_scale(
    value: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert f"argument --house-scale: {says}" in parse_error(
        household.parse_args, ["--house-scale", value], capsys
    )


@pytest.mark.parametrize(("value", "says"), [("-1", "not '-1'"), ("2.5", "not '2.5'")])
def test_accuracy_refuses_a_bad_scale(
    value: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = parse_error(accuracy.parse_args, ["--dataset", "d", f"--house-scale={value}"], capsys)
    assert "argument --house-scale: the house scale is a whole number" in err
    assert says in err


def test_capture_refuses_a_bad_scale(capsys: pytest.CaptureFixture[str]) -> None:
    assert TOO_BIG in parse_error(capture.main, ["--house-scale", "1001"], capsys)


def test_accuracy_takes_a_scale_for_every_home() -> None:
    assert accuracy.parse_args(["--dataset", "d"]).house_scale == 0
    assert accuracy.parse_args(["--dataset", "d", "--house-scale", "150"]).house_scale == 150


def test_household_replays_a_scaled_house_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HEARTH_CACHE_DIR", str(tmp_path))
    plain = household.parse_args([])
    assert (plain.house_scale, plain.fixture) == (0, FIXTURE)
    scaled = household.parse_args(["--house-scale", "32"])
    assert scaled.house_scale == 32
    assert scaled.fixture == fixture_path(32, "default")
    assert scaled.fixture.parent == tmp_path / "household"
    assert scaled.fixture.name == f"house-scale-32-default-{fixture_key(32, 'default')}.json"
    tiny = household.parse_args(["--house-scale", "32", "--model", "tiny-tools"])
    assert tiny.fixture.name.startswith("house-scale-32-tiny-tools-")
    assert fixture_key(32, "tiny-tools") != fixture_key(32, "default")
    mine = household.parse_args(["--house-scale", "32", "--fixture", str(tmp_path / "f.json")])
    assert mine.fixture == tmp_path / "f.json"


def test_the_committed_fixture_is_never_a_scaled_one(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--house-scale", "3", "--fixture", str(FIXTURE)]
    assert "needs a --fixture other than the committed" in parse_error(
        household.parse_args, argv, capsys
    )
    assert "needs a --fixture other than the committed" in parse_error(capture.main, argv, capsys)


def test_a_fixture_of_another_house_or_model_is_refused() -> None:
    committed = json.loads(FIXTURE.read_text())
    fixture = fixture_from_dict(committed)
    household.check_scale(fixture, FIXTURE, 0, "default")  # the plain house fits either
    with pytest.raises(FixtureMissingError, match=r"demo house \+ 0 guest suites, not 3"):
        household.check_scale(fixture, FIXTURE, 3, "default")
    committed["meta"].update(house_scale=3, capture_model="default")
    household.check_scale(fixture_from_dict(committed), FIXTURE, 3, "default")
    with pytest.raises(FixtureMissingError, match="captured with default, not tiny-tools"):
        household.check_scale(fixture_from_dict(committed), FIXTURE, 3, "tiny-tools")


# ------------------------------------------------------------------ the cache key


def fake_root(tmp_path: Path) -> Path:
    """The files a capture follows from, in a tree of their own."""
    root = tmp_path / "root"
    files = {
        "config/house.yaml": "floors: []\n",
        "config/configuration.yaml": "hearth_demo: !include house.yaml\n",
        "config/custom_components/hearth_demo/scale.py": "MAX_ROOMS = 1000\n",
        "custom_components/hearth/prefix.py": "PREFIX = 1\n",
        ".venv/ha/lib/python3.14/site-packages/homeassistant-2026.10.4.dist-info/METADATA": "",
        **{f"bench/hearth_bench/harness/{name}": name for name in ("capture.py", "proxy.py")},
        **{f"bench/hearth_bench/harness/{name}": name for name in ("fixture.py", "stack.py")},
        "bench/hearth_bench/house_scale.py": "house_scale.py",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "config/custom_components/hearth").symlink_to(root / "custom_components/hearth")
    return root


def test_the_key_follows_the_scale_the_house_the_code_and_home_assistant(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    assert ha_version(root) == "2026.10.4"
    key = fixture_key(32, "default", root)
    assert fixture_key(32, "default", root) == key
    assert fixture_key(33, "default", root) != key
    assert fixture_key(32, "tiny-tools", root) != key
    changes = [
        ("config/house.yaml", "floors: [{name: Loft}]\n"),
        ("config/custom_components/hearth_demo/scale.py", "MAX_ROOMS = 999\n"),
        ("custom_components/hearth/prefix.py", "PREFIX = 2\n"),
        ("bench/hearth_bench/harness/capture.py", "another scenario"),
    ]
    for name, text in changes:
        before = fixture_key(32, "default", root)
        (root / name).write_text(text)
        assert fixture_key(32, "default", root) != before, name
    info = root / ".venv/ha/lib/python3.14/site-packages/homeassistant-2026.10.4.dist-info"
    before = fixture_key(32, "default", root)
    info.rename(info.with_name("homeassistant-2026.11.0.dist-info"))
    assert ha_version(root) == "2026.11.0"
    assert fixture_key(32, "default", root) != before


def test_what_a_run_writes_leaves_the_key_as_it_was(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    key = fixture_key(32, "default", root)
    for name in sorted(RUNTIME_FILES):
        (root / "config" / name).write_text("written by a run")
    (root / "config/home-assistant.log").write_text("log")
    (root / "config/README.md").write_text("docs")
    cache = root / "custom_components/hearth/__pycache__"
    cache.mkdir()
    (cache / "prefix.cpython-314.pyc").write_bytes(b"\0")
    assert fixture_key(32, "default", root) == key
    listed = {str(p.relative_to(root)) for p in inputs(root)}
    assert "custom_components/hearth/prefix.py" in listed  # once, not through config's link
    assert not any(p.startswith("config/custom_components/hearth/") for p in listed)


# ------------------------------------------------------------------ scripts/develop


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--house-scale", "many"], NOT_A_NUMBER),
        (["--house-scale=-2"], "whole number of guest suites from 0 to 1000, not '-2'"),
        (["--house-scale", "1001"], TOO_BIG),
        (["--house-scale", "123456789012345678901234"], "at most 1000 guest suites"),
        (["--house-scale"], "--house-scale needs a number of guest suites"),
    ],
)
def test_develop_refuses_a_bad_scale_before_its_set_up(argv: list[str], says: str) -> None:
    done = subprocess.run(
        [str(ROOT / "scripts" / "develop"), *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HEARTH_CACHE_DIR": "/nonexistent"},
        check=False,
    )
    assert done.returncode == 1
    assert says in done.stderr
    assert "setup" not in done.stderr.lower()


def test_develop_says_what_the_scale_means() -> None:
    done = subprocess.run(
        [str(ROOT / "scripts" / "develop"), "--help"], capture_output=True, text=True, check=True
    )
    assert "--house-scale N" in done.stdout
    assert "makes 298 entities" in done.stdout
    assert f"HOUSE_SCALE_MAX={MAX}" in (ROOT / "scripts" / "develop").read_text()


def test_a_capture_of_a_house_too_long_for_the_model_says_so() -> None:
    """As Home Assistant logged it for 150 suites with tiny-tools (32,768 tokens)."""
    line = (
        "Could not pin the prefix hearth.01M94M2GF8 (retried): HTTP 422"
        " (context_length_exceeded): this model's context is 32768 tokens, but the request"
        " needs 48003 (48002 in the prompt + 1 for the completion)"
    )
    log = (
        "2026-12-06 02:49:05.273 WARNING (MainThread) [custom_components.hearth] The house"
        " prompt of hearth.01M94M2GF8 does not fit the model's context with its worked"
        " examples: they are left out\n"
        f"2026-12-06 02:49:05.512 WARNING (MainThread) [custom_components.hearth] {line}\n"
    )
    assert capture.too_long_pins(log, {"hearth.01M94M2GF8", "hearth.other"}) == [line]
    assert capture.too_long_pins(log, {"hearth.other"}) == []
    busy = log.replace("context_length_exceeded", "server_busy")
    assert capture.too_long_pins(busy, {"hearth.01M94M2GF8"}) == []


def test_a_model_folder_is_keyed_by_its_full_path(tmp_path: Path) -> None:
    folder = tmp_path / "models" / "Qwen2.5 1.5B"
    assert fixture_key(2, str(folder)) != fixture_key(2, str(tmp_path / "other" / "Qwen2.5 1.5B"))
    assert fixture_path(2, str(folder)).name.startswith("house-scale-2-Qwen2.5_1.5B-")


def _record(seq: int, method: str, path: str, messages: list[str]) -> Recorded:
    body = {"messages": [{"role": "system", "content": m} for m in messages], "tools": []}
    return Recorded(seq, 0.0, method, path, body, 200)


def test_a_request_on_a_prefix_its_phase_replaced_is_kept() -> None:
    """A house too big for the model is pinned, then pinned again fitted (no rename): the
    requests served between keep their suffix, in the phase they were made in."""
    pin = "/v1/prefixes/hearth.a"
    records = [
        _record(0, "PUT", pin, ["house, all areas"]),
        _record(1, "POST", "/v1/chat/completions", ["house, all areas", "turn on"]),
        _record(2, "PUT", pin, ["house, fitted"]),
        _record(3, "POST", "/v1/chat/completions", ["house, fitted", "turn off"]),
        _record(4, "PUT", pin, ["house, fitted", "renamed"]),
        _record(5, "POST", "/v1/chat/completions", ["house, fitted", "renamed", "dim"]),
        _record(6, "PUT", pin, ["house, fitted", "renamed twice"]),
        _record(7, "POST", "/v1/chat/completions", ["other house", "hello"]),
    ]
    turns = [capture.Turn("chat", "hearth", 1, [records[n]], {}) for n in (1, 3, 5)]
    fake = SimpleNamespace(
        proxy=SimpleNamespace(records=records),
        rename_marks=[4, 6],
        pins={"hearth": "hearth.a"},
        entities={"hearth": "conversation.hearth"},
        turns=turns,
    )
    built = capture.build_fixture(fake, {})  # type: ignore[arg-type]
    prefixes = built.agents["hearth"].prefixes
    assert [p.messages[-1]["content"] for p in prefixes] == [
        "house, fitted",
        "renamed",
        "renamed twice",
    ]
    shapes = [(s.prefix, [m["content"] for m in s.suffix]) for s in built.samples]
    assert shapes == [(0, ["turn on"]), (0, ["turn off"]), (1, ["dim"])]
    fake.turns = [capture.Turn("chat", "hearth", 1, [records[7]], {})]
    with pytest.raises(RuntimeError, match="does not start with any pinned prefix"):
        capture.build_fixture(fake, {})  # type: ignore[arg-type]
