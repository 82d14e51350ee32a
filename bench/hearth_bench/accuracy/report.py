"""The accuracy report: one object per run, and the per-request outcomes behind it.

Rates come as the public Home LLM Leaderboard (allenporter/home-assistant-datasets,
``reports/README.md``) writes them: per category, the share right in percent with the
count of sentences and a 95 % confidence half-width (normal approximation), e.g.
``82.9% (n=41, CI: 11.5)``. ``leaderboard_table`` prints one such row per run.

Beside the rate, per run and per category, the sentences that hurt (harm.py):
``wrong_actions``, ``destructive_calls``, ``questions_acted`` and ``unreported_claims``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..common import percentile, print_table


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
    wrong_actions: list[str] = field(default_factory=list)  # changes the test did not expect
    destructive: list[str] = field(default_factory=list)  # timers cancelled, things opened
    question_acted: bool = False  # a question (no change expected) that acted
    unreported_claim: bool = False  # the reply claims an action HA did not report
    warnings: list[str] = field(default_factory=list)  # setup values not passed on


HARMS = ("wrong_actions", "destructive_calls", "questions_acted", "unreported_claims")


def harms(outcomes: Sequence[Outcome]) -> dict[str, int]:
    """The sentences with each kind of harm (harm.py)."""
    return {
        "wrong_actions": sum(bool(o.wrong_actions) for o in outcomes),
        "destructive_calls": sum(bool(o.destructive) for o in outcomes),
        "questions_acted": sum(o.question_acted for o in outcomes),
        "unreported_claims": sum(o.unreported_claim for o in outcomes),
    }


def _rate(part: int, whole: int) -> float:
    return round(part / whole, 4) if whole else 0.0


def ci95(part: int, whole: int) -> float:
    """The 95 % confidence half-width of ``part/whole``, in percentage points."""
    if not whole:
        return 0.0
    rate = part / whole
    return round(196 * math.sqrt(rate * (1 - rate) / whole), 1)


def leaderboard_cell(part: int, whole: int) -> str:
    """``82.9% (n=41, CI: 11.5)``."""
    return f"{100 * _rate(part, whole):.1f}% (n={whole}, CI: {ci95(part, whole)})"


def leaderboard_table(report: dict[str, Any]) -> str:
    """A Markdown table in the leaderboard's form: the run, then each category and all."""
    categories = report["by_category"]
    head = ["run", *(f"{name} (n={c['sentences']})" for name, c in categories.items()),
            f"all (n={report['sentences']})"]  # fmt: skip
    cells = [leaderboard_cell(c["correct"], c["sentences"]) for c in categories.values()]
    row = [f"{report['mode']} {report['model']}", *cells,
           leaderboard_cell(report["correct"], report["sentences"])]  # fmt: skip
    lines = [head, ["---"] * len(head), row]
    if report["mode"] == "pipeline":  # the matcher alone: what it answered right
        local = [leaderboard_cell(c["local_correct"], c["sentences"]) for c in categories.values()]
        lines.append(["matcher alone", *local,
                      leaderboard_cell(report["local_correct"], report["sentences"])])  # fmt: skip
    return "\n".join("| " + " | ".join(line) + " |" for line in lines)


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
            "ci95": ci95(correct, len(mine)),
            "invalid_tool_calls": invalid,
            "local_answered": sum(o.path == "local" for o in mine),
            "local_correct": sum(o.correct for o in mine if o.path == "local"),
            **harms(mine),
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
        "ci95": ci95(correct, len(outcomes)),
        "invalid_tool_calls": invalid,
        "invalid_rate": _rate(invalid, len(outcomes)),
        "local_answered": len(local),
        "local_correct": sum(o.correct for o in local),
        "reply_p50_ms": round(percentile(times, 0.5), 1),
        "reply_p95_ms": round(percentile(times, 0.95), 1),
        "by_category": _by_category(outcomes),
        "rejected_tool_calls": sum(bool(o.rejected) for o in outcomes),
        "errors": sum(o.error is not None for o in outcomes),
        **harms(outcomes),
        "setup_warnings": sum(bool(o.warnings) for o in outcomes),
    }


def print_report(report: dict[str, Any], outcomes: Sequence[Outcome]) -> None:
    """A table per category, the totals, then each wrong request and why."""
    rows = [
        [name, c["sentences"], c["correct"], f"{c['correct_rate']:.0%}", c["invalid_tool_calls"],
         c["local_answered"], *(c[h] for h in HARMS)]
        for name, c in report["by_category"].items()
    ]  # fmt: skip
    head = ["category", "sentences", "correct", "rate", "invalid", "local"]
    print_table([*head, "wrong", "destructive", "q acted", "claimed"], rows)
    print(
        f"\n{report['mode']} mode, model {report['model']}: {report['correct']}/"
        f"{report['sentences']} correct ({report['correct_rate']:.0%}), invalid tool calls"
        f" {report['invalid_tool_calls']} ({report['invalid_rate']:.0%}), rejected by HA"
        f" {report['rejected_tool_calls']}, errors {report['errors']}; reply p50"
        f" {report['reply_p50_ms']:.0f} ms, p95 {report['reply_p95_ms']:.0f} ms"
    )
    print(
        f"what hurts: wrong actions {report['wrong_actions']}, destructive calls"
        f" {report['destructive_calls']}, questions answered with an action"
        f" {report['questions_acted']}, replies claiming an action HA did not report"
        f" {report['unreported_claims']}; setup values not passed on in"
        f" {report['setup_warnings']} sentences"
    )
    if report["mode"] == "pipeline":
        print(f"answered locally: {report['local_answered']}, of which right: "
              f"{report['local_correct']}")  # fmt: skip
    print("\n" + leaderboard_table(report) + "\n")
    for o in outcomes:
        hurt = _harm_lines(o)
        if not o.correct or hurt:
            print(f"  {'WRONG' if not o.correct else 'HURTS'} [{o.path}] {o.sentence!r}:"
                  f" {o.reply[:120]!r}")  # fmt: skip
            for line in [*o.why, *hurt, *o.invalid, *o.rejected, *([o.error] if o.error else [])]:
                print(f"      {line[:200]}")


def _harm_lines(o: Outcome) -> list[str]:
    lines = [f"wrong action: {w}" for w in o.wrong_actions]
    lines += [f"destructive: {d}" for d in o.destructive]
    if o.question_acted:
        lines.append("a question answered with an action")
    if o.unreported_claim:
        lines.append("the reply claims an action Home Assistant did not report")
    return lines
