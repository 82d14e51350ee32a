"""500 generated bad and good requests against a real server (``scripts/bench fuzz`` at scale).

Outcome required: no 5xx but 503, every error OpenAI-shaped, nothing hanging, the server
healthy, no traceback in its log, the KV accounting back to baseline afterwards, every
request a foreign web page could send refused, and the victim streams beside the cases
(a voice satellite's reply) finished with the same text as alone.
"""

from __future__ import annotations

from pathlib import Path

from hearth_bench.fuzz.main import fuzz
from hearth_bench.harness.server import EngineProcess


async def test_fuzz_500_cases(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    proc = EngineProcess(
        [
            *("--model", "tiny", "--dtype", "float32"),
            *("--prefix-store", str(tmp_path / "store"), "--max-queue", "16"),
        ],
        log,
    ).start()
    try:
        report = await fuzz(proc.url, n=500, seed=2026, concurrency=8, timeout=120)
    finally:
        exit_code = proc.stop()
    assert report["problems"] == [], report["problems"]
    assert report["healthy"]
    assert report["cases"] >= 500
    assert (
        set(report["by_status"])
        - {"200", "202", "400", "403", "404", "409", "413", "415", "422", "503"}
        - {"disconnected", "left"}
        == set()
    )
    assert report["victims"].get("unchanged", 0) >= 1, report["victims"]
    assert set(report["victims"]) <= {"unchanged", "overloaded"}, report["victims"]
    assert {"foreign", "control_tokens", "sampling_extremes", "leave_early"} <= set(
        report["by_kind"]
    )
    assert report["locked_nodes_after"] == 0
    assert report["working_bytes_after"] == 0
    assert report["used_bytes_after_clear"] == report["pinned_bytes_after_clear"]
    assert exit_code == 0
    assert "Traceback" not in log.read_text()
