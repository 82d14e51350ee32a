"""Smoke run of ``scripts/bench accuracy``: the project's dataset, a few sentences, for real.

A real engine (``tiny-tools``), a recording proxy and a real Home Assistant that builds
the dataset home from its ``_fixtures.yaml``, in both modes. A tiny model's answers are
noise, so only the run is checked: it completes, every request got an answer (no
errors), and the report has its fields and adds up. In ``pipeline`` mode Home
Assistant's own matcher answers some plain commands, and those are checked too: the
matcher is exact, so what it answers must be right.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hearth_bench.accuracy.main import run
from hearth_bench.harness.stack import ROOT

DATASET = ROOT / "bench" / "datasets" / "hearth-house"
FIELDS = {
    "mode", "model", "dataset", "sentences", "correct", "correct_rate", "invalid_tool_calls",
    "invalid_rate", "local_answered", "local_correct", "reply_p50_ms", "reply_p95_ms",
    "by_category",
}  # fmt: skip


@pytest.mark.parametrize("mode", ["llm", "pipeline"])
async def test_a_few_sentences_run_through_home_assistant(tmp_path: Path, mode: str) -> None:
    report, outcomes = await run(
        DATASET, mode, "tiny-tools", tmp_path, limit=6, engine_args=["--dtype", "float32"]
    )
    assert set(report) >= FIELDS
    assert (report["mode"], report["model"], report["sentences"]) == (mode, "tiny-tools", 6)
    assert report["errors"] == 0, [o.error for o in outcomes if o.error]
    assert all(o.path in ("hearth", "local") for o in outcomes)
    assert sum(c["sentences"] for c in report["by_category"].values()) >= 6
    assert 0 <= report["correct"] <= report["sentences"]
    assert report["reply_p50_ms"] <= report["reply_p95_ms"]
    if mode == "llm":
        assert report["local_answered"] == 0
    else:
        assert report["local_answered"] > 0  # "Turn on the coffee machine" and the like
        assert report["local_correct"] == report["local_answered"]
