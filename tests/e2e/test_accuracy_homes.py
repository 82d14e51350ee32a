"""``scripts/bench accuracy`` on homes the demo can only partly build, or not at all.

Real processes: a ``tiny-tools`` engine and a real Home Assistant that builds the home.
A home with a weather entity (which the public format's homes have) builds; an entity
the demo has no platform for is one warning, left out, and the sentences that name it
are skipped while the rest run; a home that cannot be built stops the run at once with
one line that says why (exit status 2), not a wait for Home Assistant and a traceback.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hearth_bench.accuracy.main import run
from hearth_bench.harness.stack import ROOT

FIXTURES = """
language: en
floors: [{name: Ground Floor, id: ground}]
areas: [{name: Den, id: den, floor: ground}]
entities:
  - {name: Den Lamp, id: light.den_lamp, area: den, state: "off",
     attributes: {supported_color_modes: [brightness], color_mode: brightness}}
  - {name: Forecast, id: weather.forecast, state: sunny, attributes: {temperature: 18}}
  - {name: Porch Camera, id: camera.porch_camera, state: idle}
"""
TESTS = """
category: light
tests:
  - sentences: ["Turn on the den lamp"]
    expect_changes: {light.den_lamp: {state: "on"}}
  - sentences: ["Show me the porch camera"]
    setup: {camera.porch_camera: {state: streaming}}
"""


def write_home(folder: Path, fixtures: str, tests: str = TESTS) -> Path:
    folder.mkdir(parents=True)
    (folder / "_fixtures.yaml").write_text(fixtures)
    (folder / "lights.yaml").write_text(tests)
    return folder


async def test_weather_builds_and_an_unbuildable_entity_is_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = write_home(tmp_path / "den", FIXTURES)
    report, outcomes = await run(
        home, "pipeline", "tiny-tools", tmp_path / "work", engine_args=["--dtype", "float32"]
    )
    err = capsys.readouterr().err
    assert (
        "[den] warning: left out camera.porch_camera: the demo cannot build camera entities"
    ) in err
    assert "[den] warning: 1 sentences skipped (they name left-out entities)" in err
    assert report["errors"] == 0, [o.error for o in outcomes]
    (outcome,) = outcomes  # the lamp; Home Assistant's matcher answers it, exactly
    assert (outcome.sentence, outcome.path, outcome.correct) == (
        "Turn on the den lamp",
        "local",
        True,
    )
    log = (tmp_path / "work" / "den" / "config" / "home-assistant.log").read_text()
    assert "weather.forecast" not in log  # built without a complaint


def test_a_home_that_cannot_be_built_stops_the_run_with_one_line(tmp_path: Path) -> None:
    broken = FIXTURES.replace("area: den, state", "area: attic, state")
    home = write_home(tmp_path / "broken", broken)
    done = subprocess.run(
        [str(ROOT / "scripts" / "bench"), "accuracy", "--dataset", str(home),
         "--model", "tiny-tools", "--dtype", "float32", "--workdir", str(tmp_path / "work")],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("scripts/bench accuracy: broken: Invalid demo house"), last
    assert "unknown area attic" in last
    print(last, file=sys.stderr)


async def test_the_german_home_is_spoken_to_in_german(tmp_path: Path) -> None:
    """Home Assistant runs in German, so its own (German) matcher answers plain commands."""
    home = ROOT / "bench" / "datasets" / "haus-am-hang"
    report, outcomes = await run(
        home, "pipeline", "tiny-tools", tmp_path, limit=4, engine_args=["--dtype", "float32"]
    )
    assert report["errors"] == 0, [o.error for o in outcomes]
    configuration = (tmp_path / "haus-am-hang" / "config" / "configuration.yaml").read_text()
    assert "  language: de\n" in configuration
    local = [o for o in outcomes if o.path == "local"]
    assert local, [(o.sentence, o.reply) for o in outcomes]  # "Mach die Stehlampe aus"
    assert all(o.correct for o in local), [(o.sentence, o.reply, o.why) for o in local]
