"""``scripts/bench accuracy``: does the house do what was asked? Through real Home Assistant.

A home-control dataset in the public format of allenporter/home-assistant-datasets
(data.py) runs through the whole product: one engine, a recording proxy in
front of it, and per home a real Home Assistant whose demo integration builds the home
from its ``_fixtures.yaml`` (home.py). Before each sentence the home is reset
to the fixture's states plus the test's ``setup``; after it, the states are judged
(judge.py) and the engine's replies checked for invalid tool calls
(calls.py).

Modes: ``llm`` sends every sentence to the Hearth agent; ``pipeline`` runs Assist's
pipeline with "prefer handling commands locally" (Home Assistant's sentence matcher
first, Hearth for the rest) and reports which path answered, and what the matcher alone
got right. A home is spoken to in its fixture's ``language``. A fixture entity the demo
cannot build is a warning and left out, with the sentences that name it; a home that
cannot be built at all ends the run with one line (exit status 2). The report ends with
a row in the public leaderboard's form (per category: % right, sentences, 95 % CI).
``--house-scale N`` adds N guest suites to every home (distractors: the sentences stay the
same, and a change to a suite counts as a wrong action); each home's start says how many
entities it exposes.

    scripts/bench accuracy --dataset bench/datasets/hearth-house --mode llm --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..common import model_spec
from ..harness.proxy import RecordingProxy
from ..harness.server import EngineProcess
from ..house_scale import add_argument as add_house_scale
from ..house_scale import describe
from .calls import (
    Reported,
    invalid_calls,
    not_run,
    parse_reply,
    rejected_calls,
    reported_results,
    runnable,
)
from .data import DatasetError, Home, Task, load_dataset
from .harm import assess
from .home import REQUEST_ERRORS, Answer, HomeStack, HomeStartError, ResetRefused
from .judge import judge
from .report import Outcome, print_report, summarize
from .setup import passable

MODES = ("llm", "pipeline")
OnOutcome = Callable[[Outcome], None]


def pick(tasks: Sequence[Task], limit: int | None) -> list[Task]:
    """All tasks, or ``limit`` of them spread evenly over the list (every category)."""
    if limit is None or limit >= len(tasks):
        return list(tasks)
    if limit <= 0:
        return []
    step = len(tasks) / limit
    return [tasks[int(i * step)] for i in range(limit)]


def _engine_turn(
    proxy: RecordingProxy, since: int
) -> tuple[list[str], list[str], list[str], list[str], Reported]:
    """Tools called, those that ran (the agent refused none of them: calls.not_run;
    their arguments are an object),
    invalid and rejected calls, and what Home Assistant reported of them, in the chat
    requests from ``since`` on."""
    chats = [r for r in proxy.records[since:] if r.path == "/v1/chat/completions"]
    bodies = [r.body for r in chats]
    refused = not_run(bodies)
    tools: list[str] = []
    ran: list[str] = []
    invalid: list[str] = []
    for record in chats:
        if (raw := proxy.responses.get(record.seq)) is not None and record.status == 200:
            reply = parse_reply(raw)
            tools += [name for name, _ in reply.calls]
            ran += [
                name
                for (name, arguments), i in zip(reply.calls, reply.ids, strict=True)
                if i not in refused and runnable(arguments)  # HA ran none of the others
            ]
            invalid += invalid_calls(record.body, reply)
    return tools, ran, invalid, rejected_calls(bodies), reported_results(bodies)


async def reset(home: HomeStack, task: Task) -> list[str]:
    """Put the home in the task's states; one warning per value or entity it could not
    pass on (the rest is set). A state the demo refuses is set entity by entity, so
    only the refused ones keep the state they had."""
    states, warnings = passable(home.home.states_for(task))
    try:
        await home.reset(states)
    except ResetRefused:
        for entity_id, state in states.items():
            try:
                await home.reset({entity_id: state})
            except ResetRefused as err:
                warnings.append(f"{entity_id}: the demo refused its state ({err}); left as it was")
    return warnings


async def run_task(home: HomeStack, proxy: RecordingProxy, task: Task, mode: str) -> Outcome:
    """Reset, ask, judge one sentence."""
    warnings = await reset(home, task)
    for line in warnings:
        print(f"[{task.home}] warning: {task.sentence!r}: {line}", file=sys.stderr)
    before = await home.snapshot()
    since = len(proxy.records)
    ask = home.ask_agent if mode == "llm" else home.ask_pipeline
    error = None
    try:
        answer = await ask(task.sentence, task.context_device)
    except REQUEST_ERRORS as err:
        answer, error = Answer("", 0.0, "hearth"), f"{type(err).__name__}: {err}"
    after = await home.snapshot()
    tools, ran, invalid, rejected, reported = _engine_turn(proxy, since)
    reported = Reported((*reported.done, *answer.done), reported.speech)
    called = ran if answer.path == "hearth" else None  # a refused call did nothing
    verdict = judge(task, before, after, answer.text, called)
    harm = assess(task, before, after, answer.text, called, reported, home.refusals)
    return Outcome(
        home=task.home,
        record=task.record,
        categories=list(task.categories),
        sentence=task.sentence,
        correct=verdict.correct and error is None,
        path=answer.path,
        reply=answer.text,
        reply_ms=round(answer.ms, 1),
        tools=tools,
        invalid=invalid,
        rejected=rejected,
        why=verdict.why,
        error=error,
        wrong_actions=harm.wrong_actions,
        destructive=harm.destructive,
        question_acted=harm.question_acted,
        unreported_claim=harm.unreported_claim,
        warnings=warnings,
    )


async def run_home(
    workdir: Path,
    home: Home,
    tasks: list[Task],
    engine: EngineProcess,
    mode: str,
    on_outcome: OnOutcome | None = None,
    agent_options: Mapping[str, Any] | None = None,
    house_scale: int = 0,
    exposed: dict[str, int] | None = None,
) -> list[Outcome]:
    """Ask a home its sentences; ``exposed`` gets the home's count of exposed entities."""
    proxy = await RecordingProxy(engine.url, keep_responses=True).start()
    stack = HomeStack(workdir, home, engine, proxy.url, agent_options, house_scale)
    outcomes = []
    try:
        await stack.start()
        if exposed is not None:
            exposed[home.name] = len(stack.exposed)
        house = describe(house_scale, len(stack.exposed), f"home {home.name}")
        print(f"[{home.name}] {house}", file=sys.stderr)
        for line in stack.left_out:
            print(f"[{home.name}] warning: left out {line}", file=sys.stderr)
        tasks = _buildable(home.name, tasks, stack.left_out_ids)
        for n, task in enumerate(tasks, 1):
            outcome = await run_task(stack, proxy, task, mode)
            mark = "ok " if outcome.correct else "BAD"
            print(f"[{home.name} {n}/{len(tasks)}] {mark} {outcome.path:6} "
                  f"{outcome.reply_ms:7.0f} ms  {task.sentence}", file=sys.stderr)  # fmt: skip
            outcomes.append(outcome)
            if on_outcome is not None:
                on_outcome(outcome)
    finally:
        await stack.stop()
        await proxy.stop()
    return outcomes


def _buildable(home: str, tasks: list[Task], left_out: set[str]) -> list[Task]:
    """The tasks that name no left-out entity (one warning for the rest)."""
    kept = [t for t in tasks if not (set(t.setup) | set(t.expect_changes or {})) & left_out]
    if skipped := len(tasks) - len(kept):
        print(f"[{home}] warning: {skipped} sentences skipped (they name left-out entities)",
              file=sys.stderr)  # fmt: skip
    return kept


async def run(
    dataset: Path,
    mode: str,
    model: str,
    workdir: Path,
    limit: int | None = None,
    engine_args: Sequence[str] = (),
    on_outcome: OnOutcome | None = None,
    agent_options: Mapping[str, Any] | None = None,
    house_scale: int = 0,
) -> tuple[dict[str, Any], list[Outcome]]:
    """Run the dataset; the report object and the per-request outcomes (each also passed
    to ``on_outcome`` as soon as it is known)."""
    homes = load_dataset(dataset)
    workdir.mkdir(parents=True, exist_ok=True)
    tasks = pick([t for h in homes for t in h.tasks], limit)
    args = ["--model", model_spec(model), *engine_args]
    engine = EngineProcess(args, workdir / "engine.log").start()
    outcomes: list[Outcome] = []
    exposed: dict[str, int] = {}
    try:
        for home in homes:
            mine = [t for t in tasks if t.home == home.name]
            if mine:
                outcomes += await run_home(
                    workdir / home.name, home, mine, engine, mode, on_outcome, agent_options,
                    house_scale, exposed,
                )  # fmt: skip
    finally:
        engine.stop()
    report = summarize(outcomes, mode, model, str(dataset))
    report["agent_options"] = dict(agent_options or {})
    report["engine_args"] = list(engine_args)
    report["house_scale"] = house_scale
    report["exposed_entities"] = exposed
    return report, outcomes


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/bench accuracy",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--dataset", type=Path, required=True, help="a home or a folder of homes")
    parser.add_argument("--mode", choices=MODES, default="llm")
    parser.add_argument("--model", default="default", help="default, tiny-tools or a folder")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument(
        "--quantize",
        default=None,
        help="the engine's --quantize (none, int8, int4; default: the engine's own choice)",
    )
    parser.add_argument("--limit", type=int, default=None, help="sentences, spread evenly")
    parser.add_argument("--json", type=Path, default=None, help="write the report object here")
    parser.add_argument(
        "--outcomes", type=Path, default=None, help="per-sentence JSON lines, written as they come"
    )
    parser.add_argument("--workdir", type=Path, default=None, help="keep logs and configs here")
    parser.add_argument(
        "--tool-first",
        action="store_true",
        help="the agent's tool_first option: each turn's first request must call a tool",
    )
    parser.add_argument(
        "--no-examples",
        action="store_true",
        help="turn off the agent's worked examples (on by default; see examples.py)",
    )
    add_house_scale(parser, "every home (distractors; the sentences stay the same)")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    agent_options: dict[str, Any] = {"tool_first": True} if args.tool_first else {}
    if args.no_examples:
        agent_options["examples"] = False
    engine_args = ["--dtype", args.dtype]
    if args.quantize:
        engine_args += ["--quantize", args.quantize]
    # SIGTERM unwinds like Ctrl-C, so the engine and Home Assistant are stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with contextlib.ExitStack() as stack:
        workdir = args.workdir or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="hearth-accuracy-"))
        )
        workdir.mkdir(parents=True, exist_ok=True)
        sink = stack.enter_context(args.outcomes.open("w")) if args.outcomes else None

        def write(outcome: Outcome) -> None:
            if sink is not None:
                sink.write(json.dumps(asdict(outcome)) + "\n")
                sink.flush()

        try:
            report, outcomes = asyncio.run(
                run(
                    args.dataset,
                    args.mode,
                    args.model,
                    workdir,
                    args.limit,
                    engine_args,
                    write,
                    agent_options,
                    args.house_scale,
                )
            )
        except (HomeStartError, DatasetError) as err:
            print(f"scripts/bench accuracy: {err}", file=sys.stderr)
            return 2
    print_report(report, outcomes)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 1 if report["errors"] else 0
