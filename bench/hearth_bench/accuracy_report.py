"""The accuracy report: one object per run, and the per-request outcomes behind it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .common import percentile, print_table


@dataclass
class Outcome:
    """One request: what was said, which path answered, and whether it was right."""

    home: str
    record: str
    categories: list[str]
    sentence: str
    correct: bool
    path: str  # "hearth" or "local" (Home Assistant's sentence matcher)
    reply: str
    reply_ms: float
    tools: list[str] = field(default_factory=list)  # the tools the model called
    invalid: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    why: list[str] = field(default_factory=list)
    error: str | None = None  # the request itself failed (HTTP error, pipeline error)


def _rate(part: int, whole: int) -> float:
    return round(part / whole, 4) if whole else 0.0


def _by_category(outcomes: Sequence[Outcome]) -> dict[str, dict[str, Any]]:
    categories = sorted({c for o in outcomes for c in o.categories})
    table = {}
    for category in categories:
        mine = [o for o in outcomes if category in o.categories]
        correct = sum(o.correct for o in mine)
        invalid = sum(bool(o.invalid) for o in mine)
        table[category] = {
            "sentences": len(mine),
            "correct": correct,
            "correct_rate": _rate(correct, len(mine)),
            "invalid_tool_calls": invalid,
            "local_answered": sum(o.path == "local" for o in mine),
        }
    return table


def summarize(outcomes: Sequence[Outcome], mode: str, model: str, dataset: str) -> dict[str, Any]:
    """The report object (the fields `--json` promises, plus errors and rejections)."""
    correct = sum(o.correct for o in outcomes)
    invalid = sum(bool(o.invalid) for o in outcomes)
    local = [o for o in outcomes if o.path == "local"]
    times = [o.reply_ms for o in outcomes if o.error is None]
    return {
        "mode": mode,
        "model": model,
        "dataset": dataset,
        "sentences": len(outcomes),
        "correct": correct,
        "correct_rate": _rate(correct, len(outcomes)),
        "invalid_tool_calls": invalid,
        "invalid_rate": _rate(invalid, len(outcomes)),
        "local_answered": len(local),
        "local_correct": sum(o.correct for o in local),
        "reply_p50_ms": round(percentile(times, 0.5), 1),
        "reply_p95_ms": round(percentile(times, 0.95), 1),
        "by_category": _by_category(outcomes),
        "rejected_tool_calls": sum(bool(o.rejected) for o in outcomes),
        "errors": sum(o.error is not None for o in outcomes),
    }


def print_report(report: dict[str, Any], outcomes: Sequence[Outcome]) -> None:
    """A table per category, the totals, then each wrong request and why."""
    rows = [
        [name, c["sentences"], c["correct"], f"{c['correct_rate']:.0%}", c["invalid_tool_calls"],
         c["local_answered"]]
        for name, c in report["by_category"].items()
    ]  # fmt: skip
    print_table(["category", "sentences", "correct", "rate", "invalid", "local"], rows)
    print(
        f"\n{report['mode']} mode, model {report['model']}: {report['correct']}/"
        f"{report['sentences']} correct ({report['correct_rate']:.0%}), invalid tool calls"
        f" {report['invalid_tool_calls']} ({report['invalid_rate']:.0%}), rejected by HA"
        f" {report['rejected_tool_calls']}, errors {report['errors']}; reply p50"
        f" {report['reply_p50_ms']:.0f} ms, p95 {report['reply_p95_ms']:.0f} ms"
    )
    if report["mode"] == "pipeline":
        print(f"answered locally: {report['local_answered']}, of which right: "
              f"{report['local_correct']}")  # fmt: skip
    for o in outcomes:
        if not o.correct:
            print(f"  WRONG [{o.path}] {o.sentence!r}: {o.reply[:120]!r}")
            for line in [*o.why, *o.invalid, *o.rejected, *([o.error] if o.error else [])]:
                print(f"      {line[:200]}")
