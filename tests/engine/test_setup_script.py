"""``scripts/setup --for demo|test|bench``: what each purpose builds, and its arguments."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / "scripts" / "setup"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SETUP), *args], capture_output=True, text=True, timeout=30, check=False
    )


def test_help_names_both_purposes() -> None:
    result = _run("--help")
    assert result.returncode == 0
    usage = "Usage: scripts/setup [--for demo|test|bench] [--engine-only] [--llama-in-background]"
    assert usage in result.stdout
    assert "demo (scripts/develop)" in result.stdout
    assert "test (scripts/test, and the default)" in result.stdout


def test_an_unknown_purpose_is_refused_before_any_work() -> None:
    result = _run("--for", "everything")
    assert result.returncode == 1
    assert result.stderr.strip().endswith(
        "error:\x1b[0m --for takes demo, test or bench, not: everything"
    )


def _plan(*args: str) -> dict[str, list[str]]:
    result = _run(*args, "--plan")
    assert result.returncode == 0, result.stderr
    return {
        key: value.split()
        for key, value in (line.split(":", 1) for line in result.stdout.splitlines())
    }


def test_the_demo_builds_neither_test_models_nor_llama_cpp() -> None:
    """What each purpose sets up (``--plan`` prints it from the lists the script runs)."""
    demo = _plan("--for", "demo")
    assert demo == {
        "environments": ["engine", "ha"],
        "builds": ["native", "default"],
        "then": [],
        "beside": [],
    }
    test = _plan("--for", "test")
    assert test["builds"] == ["native", "default", "tiny", "tiny-tools"]
    # llama.cpp's quantize tools (a 10-30 minute build) are for scripts/bench quant only:
    # no test needs them, and a cold CI run must not wait for them.
    assert test["then"] == ["llama-server", "browser"]
    assert _plan("--for", "bench")["then"] == ["llama-server", "browser", "llama-tools"]
    assert _plan("--engine-only")["environments"] == ["engine"]
    # scripts/test: llama-server builds beside the rest (its tests wait for it).
    beside = _plan("--for", "test", "--llama-in-background")
    assert (beside["then"], beside["beside"]) == (["browser"], ["llama-server"])
    assert test["beside"] == [] and demo["beside"] == []


def test_develop_and_test_ask_for_their_purpose() -> None:
    assert '"$ROOT/scripts/setup" --for demo' in (ROOT / "scripts" / "develop").read_text()
    assert (
        '"$ROOT/scripts/setup" --for test --llama-in-background'
        in (ROOT / "scripts" / "test").read_text()
    )
