"""``scripts/bench household``: a simulated household replayed against three engines.

The prompts come from ``bench/fixtures/household.json``: what the Hearth plugin really
sent for the demo house (``--capture`` records it again through a live Home Assistant).
``--house-scale N`` replays the demo house with N guest suites added instead: its fixture
is captured the same way on first use and kept in the cache (scaled_fixture.py).
A trace fixed by ``--seed`` mixes two voice satellites in different areas, a chat user
whose history grows turn by turn (the engine's own replies are re-sent, as the plugin
does), automations calling the second agent, bursts of 2-4 simultaneous requests, two
entity renames (each re-pins both agents, ``--repin-delay`` after the change, like the
plugin's debounce; as the plugin does, requests keep the pinned prefix until the renamed
one is pinned) and state changes, which send nothing. (The plugin also moves the changed
lines into the context message meanwhile; the replay leaves them out: a few tokens.)
A sampled tool round (a turn's request after a tool ran) follows its turn's earlier
requests, each sent and counted, with the server's own tool calls in its history as the
plugin sends them: a server that keeps what it computed reuses it, as it would in a
home. (Before 2026-12-03 such a round was sent alone, with the capture model's calls:
about 80 more tokens to prefill, which a home never sees.)

The same trace runs against a fresh engine process per configuration:

* ``hearth``: ``--cache-mode radix``, each agent's prefix pinned at start and on renames;
* ``no_cache``: ``--cache-mode none``, no pins;
* ``last_prompt``: ``--cache-mode last_prompt`` (one slot, like llama.cpp), no pins;
* ``hearth_container`` (only with ``--configs``): as ``hearth``, against the add-on's
  image (``scripts/image``) run with podman through its own launcher, with the API key
  it made: ``--configs hearth hearth_container`` shows what packaging costs.
* ``hearth_store`` (only with ``--configs``): as ``hearth``, with a prefix store, as the
  add-on runs: against ``hearth``, what persistence costs; against ``hearth_container``,
  what the container alone costs.
* ``hearth_dense_prefill`` (only with ``--configs``): as ``hearth``, with a packed
  model's prefill rows dequantized into one GEMM (``HEARTH_QUANT_PREFILL=dense``), as
  before the integer prefill: ``--configs hearth hearth_dense_prefill`` shows its gain.
* ``hearth_baseline`` (only with ``--configs``, and ``--baseline DIR``): as ``hearth``,
  with the engine of another checkout (``git worktree add /tmp/base HEAD~1``, then
  ``--baseline /tmp/base/engine``): a change against the code before it, in one run.
* ``hearth_fresh_prefix`` (only with ``--configs``): as ``hearth``, but requests switch to
  the renamed prefix at once (the plugin before it kept the pinned prefix during re-pins:
  every request then cold-prefilled most of the house).
* ``external`` (``--engine-url URL``): any OpenAI-compatible server already running
  (llama.cpp's ``llama-server``, vLLM, SGLang...), not started or stopped here, driven as
  the plugin drives it: the same messages and tools (it renders them with its own chat
  template), no ``hearth`` body fields, and instead of pins a priming request per agent
  (``max_tokens`` 1) at start and after each rename's debounce, requests keeping the
  primed prefix until then; on llama.cpp ``cache_prompt``. Its row is named after the
  server kind ``/props``, ``/metrics`` or ``/v1/models`` reveal. Cached tokens come from
  ``usage.prompt_tokens_details.cached_tokens``, else llama.cpp's ``timings.cache_n``;
  a server that sends neither gets ``n/a``, never 0. ``--engine-url`` alone runs only
  this row; with ``--configs`` it is added to the built-in ones.
* ``external_unprimed`` (``--configs``, with ``--engine-url``): the same server as Home
  Assistant's own clients drive it: no priming, each request sends the house as it is.

On this 2-core CPU the default model's house prompt is ~5,400 tokens: a cold request
costs ~30 s, so the default 12 requests take about 20 minutes for the three configs.

TTFT is measured by the client (streaming: request sent -> first content or tool-call
chunk). Beside it: the client's first chunk of any kind (Hearth sends it with the
engine's first token), and Hearth's own split of that time (``usage.hearth``): waiting
for the prepare thread, preparing (render, tokenize, grammar), the engine's queue,
prefill, and the part of queue and prefill spent behind pin work. So a gap has a name:
``client gap`` is the first chunk minus the server's time to its first token (network
and HTTP), and ``call decode`` is the first words minus the first chunk (a constrained
tool call is sent name first, its arguments once complete). ``re-pin prefilled`` is the
share of the re-pins' tokens the engine computed (each re-pin PUT's
``prefilled_tokens``): the plugin re-pins a renamed house as the pinned bytes plus a
message that tells the change. The re-pin stall ratio is the p95 TTFT of requests
issued while a re-pin is in flight over that of the other requests; configurations
without pins use the requests the ``hearth`` run found in those windows (same trace
positions).
"""

import argparse
import asyncio
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..client import PinRefusedError
from ..common import write_json
from ..harness.fixture import FIXTURE, Fixture, FixtureMissingError, house_of, load_fixture
from ..house_scale import add_argument as add_house_scale
from ..scaled_fixture import fixture_path
from .replay import (
    BASELINE,
    CONFIGS,
    DEFAULT_CONFIGS,
    EXTERNAL,
    EXTERNALS,
    Household,
    Record,
    Replay,
    Settings,
)
from .report import fallback_window, goal_lines, plot, print_report, summarize
from .trace import Step, make_trace, trace_summary


async def run_all(
    household: Household,
    trace: list[Step],
    names: list[str],
    settings: Settings,
    rounds: int = 1,
) -> tuple[dict[str, dict[str, Any]], dict[str, list[Record]]]:
    """Each configuration ``rounds`` times, a fresh engine each time, in the order ABBA
    (hearth first, then the others, then back), so that the drift of a shared machine
    falls on every configuration alike; each one's requests are pooled."""
    merged: dict[str, dict[str, Any]] = {}
    runs: dict[str, list[Record]] = {}
    own_windows: dict[str, set[tuple[int, int]]] = {}
    ordered = sorted(names, key=list(CONFIGS).index)  # hearth first: it finds the windows
    for round_ in range(rounds):
        for name in ordered if round_ % 2 == 0 else ordered[::-1]:
            target = settings.engine_url if name in EXTERNALS else settings.model
            turn = f", round {round_ + 1} of {rounds}" if rounds > 1 else ""
            print(f"# {name}: {target}, {len(trace)} steps{turn}", flush=True)
            replay = Replay(household, name, settings)
            run = await replay.run(trace)
            own_windows.setdefault(name, set()).update(r.key for r in replay.records if r.in_repin)
            runs.setdefault(name, []).extend(replay.records)
            merged[name] = merge_runs(merged.get(name), run)
            merged[name]["pins"] = replay.pins
            this = summarize(name, run, replay.records, set())
            hit = this["hit_rate"]
            print(
                f"  {this['requests']} requests in {run['wall_s']} s, hit rate"
                f" {'n/a' if hit is None else f'{hit:.2%}'},"
                f" p95 TTFT {this['ttft_p95_ms']:.0f} ms",
                flush=True,
            )
    window = own_windows.get("hearth") or fallback_window(trace)
    results = {
        name: summarize(name, run, runs[name], own_windows[name] if run["pins"] else window)
        for name, run in merged.items()
    }
    return results, runs


def merge_runs(before: dict[str, Any] | None, run: dict[str, Any]) -> dict[str, Any]:
    """One configuration's rounds as one run: times and pins added up, peaks the highest,
    the engine's counters of its last round."""
    if before is None:
        return dict(run)
    peaks = None
    if run["peaks"] is not None:
        peaks = {k: max(v, (before["peaks"] or {}).get(k, 0)) for k, v in run["peaks"].items()}
    return {
        **run,
        "wall_s": round(before["wall_s"] + run["wall_s"], 1),
        "peaks": peaks,
        "pin_ms": before["pin_ms"] + run["pin_ms"],
        "repin_tokens": before["repin_tokens"] + run["repin_tokens"],
        "repin_windows_s": before["repin_windows_s"] + run["repin_windows_s"],
        "state_changes": before["state_changes"] + run["state_changes"],
    }


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/bench household", description=__doc__)
    parser.add_argument("--capture", action="store_true", help="re-capture the fixture and exit")
    parser.add_argument(
        "--fixture",
        type=Path,
        default=None,
        help=f"default: bench/fixtures/{FIXTURE.name}; with --house-scale, the cached capture"
        " of that house (captured first when missing)",
    )
    add_house_scale(parser, "the demo house (its household is captured once, then cached)")
    parser.add_argument("--model", default="default", help="default, tiny-tools, a folder")
    parser.add_argument("--requests", type=int, default=20, help="requests per configuration")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run each configuration this many times, in turn (ABBA), and pool their"
        " requests: configurations compared on a machine that drifts",
    )
    parser.add_argument(
        "--max-tokens", type=int, default=8, help="per reply (32: a spoken sentence, for reply ms)"
    )
    parser.add_argument("--repin-delay", type=float, default=2.0, help="the plugin's debounce")
    parser.add_argument("--kv-cache-mb", type=int, default=None)
    parser.add_argument(
        "--one-at-a-time",
        action="store_true",
        help="send a burst's requests one after another (the same trace, no overlap"
        " between requests; re-pins still run beside them): client against engine TTFT",
    )
    parser.add_argument(
        "--configs",
        nargs="+",
        choices=list(CONFIGS),
        default=None,
        metavar="CONFIG",
        help=f"of {', '.join(CONFIGS)} (default: {' '.join(DEFAULT_CONFIGS)};"
        f" {' and '.join(EXTERNALS)} need --engine-url)",
    )
    parser.add_argument(
        "--engine-url",
        default=None,
        metavar="URL",
        help=f"an OpenAI-compatible server already running (e.g. http://127.0.0.1:8080):"
        f" the {EXTERNAL} row; alone, the only one",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        metavar="DIR",
        help="the engine folder of another checkout, for the hearth_baseline config",
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--records", type=Path, default=None, help="every request, as JSON")
    parser.add_argument("--workdir", type=Path, default=None, help="keep engine logs here")
    parser.add_argument("--check", action="store_true", help="exit 1 if a goal is missed")
    args = parser.parse_args(argv)
    args.configs = chosen_configs(args.configs, args.engine_url)
    if args.rounds < 1:
        parser.error("--rounds must be 1 or more")
    if set(EXTERNALS) & set(args.configs) and args.engine_url is None:
        parser.error(f"--configs {' / '.join(EXTERNALS)} needs --engine-url URL")
    if (BASELINE in args.configs) != (args.baseline is not None):
        parser.error(f"--configs {BASELINE} and --baseline DIR go together")
    if args.baseline is not None and not (args.baseline / "hearth_engine").is_dir():
        parser.error(f"--baseline {args.baseline}: no hearth_engine package there")
    if args.fixture is None:
        args.fixture = FIXTURE
        if args.house_scale:
            args.fixture = fixture_path(args.house_scale, args.model)
    elif args.house_scale and args.fixture.resolve() == FIXTURE.resolve():
        parser.error(f"--house-scale needs a --fixture other than the committed {FIXTURE.name}")
    return args


def check_scale(fixture: Fixture, path: Path, rooms: int, model: str) -> None:
    """FixtureMissingError when the fixture is of another house than ``--house-scale``,
    or a scaled house captured with another model than the replay's."""
    captured = int(fixture.meta.get("house_scale") or 0)
    again = f"leave out --fixture, or capture it with --capture --house-scale {rooms}"
    if captured != rooms:
        raise FixtureMissingError(
            f"{path} was captured from the demo house + {captured} guest suites,"
            f" not {rooms}: {again} --fixture {path}"
        )
    if rooms and fixture.meta.get("capture_model") != model:
        raise FixtureMissingError(
            f"{path} was captured with {fixture.meta.get('capture_model')}, not {model}:"
            f" a big house is fitted to its model's context; {again} --model {model}"
        )


def chosen_configs(configs: list[str] | None, engine_url: str | None) -> list[str]:
    """``--engine-url`` alone: only the external server; with ``--configs``: added to them."""
    if configs is None:
        return [EXTERNAL] if engine_url else list(DEFAULT_CONFIGS)
    if engine_url and not set(EXTERNALS) & set(configs):
        return [*configs, EXTERNAL]
    return configs


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.capture or (args.house_scale and not args.fixture.exists()):
        from ..harness.capture import main as capture_main

        extra = []
        if args.house_scale:  # a big house is fitted to the model: the replay's captures it
            extra = ["--house-scale", str(args.house_scale), "--model", args.model]
        if args.workdir is not None:
            extra += ["--workdir", str(args.workdir / "capture")]
        status = capture_main(["--fixture", str(args.fixture), *extra])
        if args.capture or status:
            return status
    try:
        household = Household(load_fixture(args.fixture))
        check_scale(household.fixture, args.fixture, args.house_scale, args.model)
    except FixtureMissingError as err:
        print(err)
        return 2
    print(f"house: {house_of(household.fixture)} (fixture {args.fixture})", flush=True)
    trace = make_trace(
        args.seed, args.requests, household.pool_sizes(), len(household.chat_turns),
        household.versions() - 1,
    )  # fmt: skip
    summary = trace_summary(trace)
    mode = ", one request at a time" if args.one_at_a_time else ""
    print(f"trace (seed {args.seed}{mode}): {summary}", flush=True)
    with tempfile.TemporaryDirectory(prefix="hearth-household-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        settings = Settings(
            args.model, args.max_tokens, args.repin_delay, args.kv_cache_mb, workdir,
            args.engine_url, args.one_at_a_time, args.baseline,
        )  # fmt: skip
        started = time.monotonic()
        try:
            configs, runs = asyncio.run(
                run_all(household, trace, args.configs, settings, args.rounds)
            )
        except PinRefusedError as err:
            print(f"scripts/bench household: {err} ({house_of(household.fixture)})")
            return 2
    print()
    print_report(configs)
    print()
    goals = goal_lines(configs)
    for ok, text in goals:
        print(f"{'PASS' if ok else 'MISS'}  {text}")
    errors = sum(c["errors"] for c in configs.values())
    output = {
        "configs": configs,
        "goals": [{"pass": ok, "check": text} for ok, text in goals],
        "trace": {"seed": args.seed, **summary},
        "rounds": args.rounds,
        "model": args.model,
        "engine_url": args.engine_url,
        "max_tokens": args.max_tokens,
        "one_at_a_time": args.one_at_a_time,
        "repin_delay_s": args.repin_delay,
        "fixture": household.fixture.meta,
        "house_scale": args.house_scale,
        "wall_s": round(time.monotonic() - started, 1),
    }
    write_json(args.json, output)
    write_json(args.records, {n: [asdict(r) for r in rs] for n, rs in runs.items()})
    if args.plot is not None:
        plot(args.plot, runs, f"Household TTFT ({args.model}, {summary['requests']} requests)")
    if errors:
        print(f"{errors} requests failed")
        return 1
    return 1 if args.check and not all(ok for ok, _ in goals) else 0
