"""scripts/lib/common.sh's ``step``: a long set-up step says what it does, how far it is
while it runs, and how long it took; a failing step still stops the script (``set -e``)
and leaves no ticker behind."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

COMMON = Path(__file__).resolve().parents[2] / "scripts" / "lib" / "common.sh"


def _run(body: str) -> subprocess.CompletedProcess[str]:
    script = f"set -euo pipefail\nsource {COMMON}\nSTEP_TICK_S=1\n{body}\n"
    return subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=60, check=False
    )


def test_a_step_says_how_far_it_is() -> None:
    result = _run('step "warming up" "3 s" sleep 2.5\necho after')
    lines = result.stderr.splitlines()
    assert result.returncode == 0, result.stderr
    assert "warming up (about 3 s) ..." in lines[0]
    assert any("... warming up: " in line and "s so far (about 3 s)" in line for line in lines)
    assert "done: warming up in" in lines[-1]
    assert result.stdout == "after\n"


def test_a_failing_step_stops_the_script_and_its_ticker(tmp_path: Path) -> None:
    marker = tmp_path / "ticks"
    result = _run(
        f'fail() {{ sleep 1.5; false; echo "not reached"; }}\n'
        f'log() {{ echo "$*" >> {marker}; }}\n'
        'step "failing" "1 s" fail\necho "not reached either"'
    )
    assert result.returncode == 1
    assert "not reached" not in result.stdout
    ticks = marker.read_text()
    time.sleep(2.5)  # a ticker left running would write again
    assert marker.read_text() == ticks
    assert "done: failing" not in ticks
