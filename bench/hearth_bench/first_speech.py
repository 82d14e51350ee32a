"""``scripts/bench first-speech``: when the first word of an answer reaches Assist.

A question ("What is the living room temperature?") is asked through real Home
Assistant on the demo house (``stack.Stack``: an engine and HA with ``config/``), by
the Assist pipeline's WebSocket run (``assist_pipeline/run``, intent stage only), as a
voice satellite's pipeline sees it. Per turn:

* ``first_ms``: from the run's start to the first ``intent-progress`` event that carries
  text (``chat_log_delta.content``): when streaming TTS could start;
* ``end_ms``: to ``intent-end``, the reply's end;
* ``decode_ms``: the engine's decode time of the turn's last request (its answer), from
  ``/v1/stats`` ``last_request``;
* ``early``: the first text came before the end by at least half of that decode time.

``--baseline PATH`` runs a second stack whose Home Assistant loads the integration from
PATH (another checkout's ``custom_components/hearth``, e.g. a ``git worktree`` of the
commit before streaming) and asks the same questions, turn for turn interleaved with
this checkout's, so the VM's drift hits both sides alike.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

from .common import percentile
from .harness.stack import ROOT, Stack

QUESTIONS = (
    "What is the living room temperature?",
    "Is the basement door locked?",
    "What is the living room humidity?",
    "How much solar power are we producing?",
)


@dataclass(frozen=True, slots=True)
class Turn:
    side: str
    question: str
    first_ms: float | None  # None: no text arrived before the end
    end_ms: float
    decode_ms: float
    completion_tokens: int
    speech: str

    @property
    def early(self) -> bool:
        return self.first_ms is not None and self.end_ms - self.first_ms >= self.decode_ms / 2


def _with_integration(stack: Stack, integration: Path) -> Stack:
    """Point the stack's Home Assistant at another copy of the integration."""
    link = stack.ha.config / "custom_components" / "hearth"
    link.unlink()
    link.symlink_to(integration.resolve())
    return stack


async def _settled(stack: Stack, quiet: float = 5.0, timeout: float = 600) -> None:
    """Every pin ready and unchanged for ``quiet`` s (the house is pinned)."""
    deadline = time.monotonic() + timeout
    seen: Any = None
    since = time.monotonic()
    while time.monotonic() < deadline:
        pins = (await stack.engine_get("/v1/prefixes"))["data"]
        now = sorted((p["name"], p["state"], p.get("tokens")) for p in pins)
        if now != seen:
            seen, since = now, time.monotonic()
        elif pins and all(p["state"] == "ready" for p in pins) and time.monotonic() - since > quiet:
            return
        await asyncio.sleep(0.5)
    raise TimeoutError(f"pins not settled: {seen}")


async def ask(session: aiohttp.ClientSession, stack: Stack, side: str, question: str) -> Turn:
    """One pipeline run of ``question``; the engine's figures of its last request."""
    first: float | None = None
    speech = ""
    async with session.ws_connect(f"{stack.ha.url}/api/websocket") as socket:
        await socket.receive_json()
        await socket.send_json({"type": "auth", "access_token": stack.ha.token})
        if (await socket.receive_json()).get("type") != "auth_ok":
            raise RuntimeError("WebSocket auth failed")
        started = time.monotonic()
        await socket.send_json(
            {
                "id": 1,
                "type": "assist_pipeline/run",
                "start_stage": "intent",
                "end_stage": "intent",
                "input": {"text": question},
            }
        )
        while True:
            message = await socket.receive_json(timeout=300)
            if message.get("type") == "result" and not message.get("success"):
                raise RuntimeError(f"pipeline refused: {message.get('error')}")
            event = message.get("event") or {}
            kind, data = event.get("type"), event.get("data") or {}
            delta = data.get("chat_log_delta") or {}
            if kind == "intent-progress" and delta.get("content") and first is None:
                first = (time.monotonic() - started) * 1000
            if kind == "intent-end":
                end = (time.monotonic() - started) * 1000
                response = data["intent_output"]["response"]
                speech = response.get("speech", {}).get("plain", {}).get("speech", "")
            if kind == "error":
                raise RuntimeError(f"pipeline error: {data}")
            if kind == "run-end":
                break
    last = (await stack.engine_get("/v1/stats")).get("last_request") or {}
    return Turn(
        side,
        question,
        None if first is None else round(first, 1),
        round(end, 1),
        float(last.get("decode_ms", 0.0)),
        int(last.get("completion_tokens", 0)),
        speech,
    )


def summarize(turns: list[Turn]) -> dict[str, Any]:
    """p50 and p95 of the first text and of the end, and the share of early turns."""
    firsts = sorted(t.first_ms if t.first_ms is not None else t.end_ms for t in turns)
    ends = sorted(t.end_ms for t in turns)
    return {
        "turns": len(turns),
        "first_ms_p50": percentile(firsts, 0.5),
        "first_ms_p95": percentile(firsts, 0.95),
        "end_ms_p50": percentile(ends, 0.5),
        "end_ms_p95": percentile(ends, 0.95),
        "decode_ms_p50": percentile(sorted(t.decode_ms for t in turns), 0.5),
        "early_share": round(sum(t.early for t in turns) / len(turns), 3) if turns else 0.0,
    }


async def run(sides: dict[str, Stack], questions: list[str], repeats: int) -> list[Turn]:
    try:
        return await _run(sides, questions, repeats)
    finally:
        for stack in sides.values():
            await stack.close()  # its own session (engine_get)


async def _run(sides: dict[str, Stack], questions: list[str], repeats: int) -> list[Turn]:
    turns: list[Turn] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:
        for stack in sides.values():
            await _settled(stack)
        for side, stack in sides.items():  # a warm-up turn each (not counted)
            await ask(session, stack, side, questions[0])
        for repeat in range(repeats):
            for question in questions:
                for side, stack in sides.items():
                    turn = await ask(session, stack, side, question)
                    turns.append(turn)
                    print(
                        f"[{repeat}] {side:8} first {turn.first_ms} end {turn.end_ms} "
                        f"decode {turn.decode_ms:.0f} ms early {turn.early}: {question}",
                        flush=True,
                    )
    return turns


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/bench first-speech", description=__doc__)
    parser.add_argument("--model", default="default", help="default, tiny-tools, a folder")
    parser.add_argument("--repeats", type=int, default=5, help="rounds of all questions")
    parser.add_argument("--questions", type=int, default=len(QUESTIONS))
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="another checkout's custom_components/hearth, run side by side",
    )
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.baseline is not None and not (args.baseline / "manifest.json").is_file():
        print(f"--baseline {args.baseline}: no integration there (manifest.json)")
        return 2
    with contextlib.ExitStack() as exits:
        workdir = args.workdir or Path(exits.enter_context(tempfile.TemporaryDirectory()))
        integrations = {"current": ROOT / "custom_components" / "hearth"}
        if args.baseline is not None:
            integrations["baseline"] = args.baseline
        sides = {}
        for side, integration in integrations.items():
            stack = _with_integration(Stack(workdir / side, ["--model", args.model]), integration)
            exits.callback(stack.stop)
            sides[side] = stack.start()
        turns = asyncio.run(run(sides, list(QUESTIONS[: args.questions]), args.repeats))
    report = {
        "model": args.model,
        "sides": {s: summarize([t for t in turns if t.side == s]) for s in integrations},
        "turns": [asdict(t) | {"early": t.early} for t in turns],
    }
    print(json.dumps(report["sides"], indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0
