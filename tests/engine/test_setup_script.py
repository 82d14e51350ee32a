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
    assert "Usage: scripts/setup [--for demo|test|bench] [--engine-only]" in result.stdout
    assert "demo (scripts/develop)" in result.stdout
    assert "test (scripts/test, and the default)" in result.stdout


def test_an_unknown_purpose_is_refused_before_any_work() -> None:
    result = _run("--for", "everything")
    assert result.returncode == 1
    assert result.stderr.strip().endswith(
        "error:\x1b[0m --for takes demo, test or bench, not: everything"
    )


def test_the_demo_builds_neither_test_models_nor_llama_cpp() -> None:
    """The last lines of the script: what each purpose prepares."""
    text = SETUP.read_text()
    tail = text[text.rindex("start=$SECONDS") :]
    demo, test = tail.split("else", 1)
    assert "setup_models default native" in demo
    assert "tiny" not in demo and "llama" not in demo
    assert "setup_models default native tiny tiny-tools" in test
    assert "setup_llama_server" in test
    # llama.cpp's quantize tools (a 10-30 minute build) are for scripts/bench quant only:
    # no test needs them, and a cold CI run must not wait for them.
    assert "if [[ $FOR == bench ]]; then setup_llama_tools; fi" in test


def test_develop_and_test_ask_for_their_purpose() -> None:
    assert '"$ROOT/scripts/setup" --for demo' in (ROOT / "scripts" / "develop").read_text()
    assert '"$ROOT/scripts/setup" --for test' in (ROOT / "scripts" / "test").read_text()
