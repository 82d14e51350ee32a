"""``scripts/bench agreement`` on the tiny model (a smoke test of its report).

In float32 the three runs must agree exactly (the bench's own premise), so the figures
are checked too, not only the fields.
"""

from __future__ import annotations

import json
from pathlib import Path

from hearth_bench.agreement import main


def test_float32_report_agrees_exactly(tmp_path: Path) -> None:
    out = tmp_path / "agreement.json"
    argv = ["--model", "tiny", "--dtype", "float32", "--prompts", "3", "--tokens", "6"]
    argv += ["--min-tokens", "40", "--max-tokens", "120", "--json", str(out)]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert report["read_in_place"] is True
    for key in ("cached_vs_cold", "cold_other_vs_cold"):
        assert report[key]["cases"] == 3
        assert report[key]["identical"] == 3


def test_against_compares_a_second_forward(tmp_path: Path) -> None:
    """``--against transformers:none``: float32 through transformers' forward equals the
    lean forward's greedy text (the same arithmetic, see test_decoder.py)."""
    out = tmp_path / "agreement.json"
    argv = ["--model", "tiny", "--dtype", "float32", "--prompts", "2", "--tokens", "6"]
    argv += ["--min-tokens", "40", "--max-tokens", "120", "--json", str(out)]
    argv += ["--against", "transformers:none"]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert (report["forward"], report["against"]) == ("lean", "transformers:none")
    assert report["against_vs_cold"]["cases"] == 2
    assert report["against_vs_cold"]["identical"] == 2
