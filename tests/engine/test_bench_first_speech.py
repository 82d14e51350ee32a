"""``scripts/bench first-speech``: what counts as an early first word, and the summary.

The bench itself needs Home Assistant and an engine (minutes); this checks its
arithmetic on made-up turns, and that a missing baseline is a clear error.
"""

from __future__ import annotations

from pathlib import Path

from hearth_bench.first_speech import Turn, main, summarize


def _turn(first: float | None, end: float, decode: float) -> Turn:
    return Turn("current", "q?", first, end, decode, 10, "It is 20.5 °C.")


def test_early_means_before_the_end_by_half_the_decode_time() -> None:
    assert _turn(100.0, 1100.0, 2000.0).early  # 1000 ms ahead, half of 2000
    assert not _turn(101.0, 1100.0, 2000.0).early
    assert not _turn(None, 1100.0, 10.0).early  # no text before the end


def test_summary_counts_a_turn_without_text_at_its_end() -> None:
    turns = [_turn(100.0, 1000.0, 800.0), _turn(None, 3000.0, 800.0)]
    summary = summarize(turns)
    assert summary["turns"] == 2
    assert summary["first_ms_p95"] == 3000.0  # the silent turn's first word is its end
    assert summary["end_ms_p50"] in (1000.0, 3000.0)
    assert summary["early_share"] == 0.5


def test_a_baseline_without_an_integration_is_refused(tmp_path: Path) -> None:
    assert main(["--baseline", str(tmp_path)]) == 2
