"""The household benchmark's pure parts: the trace, the fixture, the report (no engine)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from pathlib import Path
from typing import Any

import pytest

from hearth_bench.client import Reply, Server, add_tool_call_deltas
from hearth_bench.harness.fixture import CAPTURE_COMMAND, FIXTURE, FixtureMissingError, load_fixture
from hearth_bench.household.main import parse_args
from hearth_bench.household.replay import Household, Record, Replay, Settings, chat_turns
from hearth_bench.household.report import fallback_window, goal_lines, summarize
from hearth_bench.household.trace import ROLES, Call, Step, make_trace, trace_summary

POOLS = {"satellite_a": 5, "satellite_b": 4, "automation": 3}


def test_the_trace_is_fixed_by_the_seed() -> None:
    assert make_trace(2026, 40, POOLS, 4, 2) == make_trace(2026, 40, POOLS, 4, 2)
    assert make_trace(2026, 40, POOLS, 4, 2) != make_trace(7, 40, POOLS, 4, 2)


def test_the_trace_is_a_household() -> None:
    trace = make_trace(2026, 40, POOLS, 4, 2)
    summary = trace_summary(trace)
    assert summary["requests"] == 40
    assert summary["renames"] == 2
    assert summary["bursts"] >= 1
    assert summary["state_changes"] > 0
    assert all(summary["by_role"][role] > 0 for role in ROLES)
    for step in trace:
        if step.kind == "burst":
            assert 2 <= len(step.calls) <= 4
            assert len({c.role for c in step.calls}) == len(step.calls)
    turns = [c.sample for s in trace for c in s.calls if c.role == "chat"]
    assert turns[0] == 1
    assert all(b == a % 4 + 1 for a, b in itertools.pairwise(turns))
    renames = [s.rename for s in trace if s.kind == "rename"]
    assert renames == [1, 2]


def test_the_committed_fixture_is_consistent() -> None:
    assert FIXTURE.stat().st_size < 1 << 20
    fixture = load_fixture()
    # A satellite's requests start from its class pin (no timers here), not the agent's.
    assert sorted(fixture.agents) == ["automation", "hearth", "hearth.no_timers"]
    assert {s.agent for s in fixture.samples if s.role.startswith("satellite")} == {
        "hearth.no_timers"
    }
    for agent in fixture.agents.values():
        assert len(agent.prefixes) == 3
        # Each rename is re-pinned as the pinned house's messages plus one closing
        # message that tells the changes so far (house_delta.py).
        first, *renamed = agent.prefixes
        assert len({str(p.messages) for p in agent.prefixes}) == 3
        for count, prefix in enumerate(renamed, start=1):
            assert prefix.messages[:-1] == first.messages
            assert prefix.messages[-1]["role"] == "system"
            assert prefix.messages[-1]["content"].count(" was renamed to ") == count
    roles = {s.role for s in fixture.samples}
    assert roles == set(ROLES)
    contexts = {  # the turn's context message (after the request's nearest example)
        s.role: next(m["content"] for m in s.suffix if m["role"] == "system")
        for s in fixture.samples
        if s.role.startswith("satellite")
    }
    # HA's prompt names tools as the model sees them (HassTurnOn, not intent__HassTurnOn),
    # in the pin and in what each request says: no line of it comes back as context.
    for agent in fixture.agents.values():
        assert not [p for p in agent.prefixes if "intent__" in p.messages[0]["content"]]
    said = [m["content"] for s in fixture.samples for m in s.suffix if m["role"] == "system"]
    assert not [c for c in said if "intent__" in c or "to lock" in c]
    assert "Kitchen" in contexts["satellite_a"]
    assert "Bedroom" in contexts["satellite_b"]
    assert len(chat_turns(fixture)) >= 3
    household = Household(fixture)
    assert all(size > 0 for size in household.pool_sizes().values())


def test_a_missing_fixture_says_how_to_capture_it(tmp_path: Path) -> None:
    with pytest.raises(FixtureMissingError, match=CAPTURE_COMMAND.replace(" ", ".")):
        load_fixture(tmp_path / "household.json")


def _record(step: int, ttft: float, in_repin: bool = False) -> Record:
    return Record(
        step, 0, "satellite_a", "hearth", 0, 0.0, in_repin, False, ttft, ttft + 10,
        1000, 990, ttft, ttft, 0.0, None,
    )  # fmt: skip


def test_the_stall_ratio_compares_repin_windows_with_the_rest() -> None:
    records = [_record(n, 100.0) for n in range(10)] + [_record(10, 300.0, True)]
    run = {
        "stats": {"prefill_tokens_per_s": 50.0, "kv_cache_evictions_total": 0},
        "peaks": {"kv_total_bytes": 1, "kv_cache_used_bytes": 1, "kv_working_bytes": 0},
        "pin_ms": [],
        "repin_windows_s": [],
        "state_changes": 3,
        "wall_s": 1.0,
    }
    result = summarize("hearth", run, records, {(10, 0)})
    assert result["hit_rate"] == 0.99
    assert result["repin_stall_ratio"] == 3.0
    lines = goal_lines({"hearth": result})
    assert [ok for ok, _ in lines] == [True, False]


def test_without_a_hearth_run_the_window_follows_the_renames() -> None:
    trace = make_trace(1, 12, POOLS, 4, 2)
    window = fallback_window(trace)
    assert window
    assert all(trace[step].kind in ("request", "burst") for step, _ in window)


def test_cached_tokens_come_from_usage_else_llama_timings() -> None:
    assert Reply(usage={"prompt_tokens_details": {"cached_tokens": 5}}).cached_tokens == 5
    # llama.cpp sends both; OpenAI's field wins, and a 0 there is a real 0.
    both = Reply(usage={"prompt_tokens_details": {"cached_tokens": 0}}, timings={"cache_n": 7})
    assert both.cached_tokens == 0
    assert Reply(usage={"prompt_tokens": 9}, timings={"cache_n": 7}).cached_tokens == 7
    assert Reply(usage={"prompt_tokens": 9}).cached_tokens is None


def test_a_server_that_reports_no_cached_tokens_reads_na() -> None:
    records = [_record(n, 100.0) for n in range(3)]
    records = [
        dataclasses.replace(r, cached_tokens=None, engine_ttft_ms=None, prefill_ms=None)
        for r in records
    ]
    run = {
        "label": "external (openai)",
        "stats": {},
        "peaks": None,
        "pin_ms": [],
        "repin_windows_s": [],
        "state_changes": 0,
        "wall_s": 1.0,
    }
    result = summarize("external", run, records, set())
    assert result["config"] == "external (openai)"
    assert result["hit_rate"] is None
    assert result["reused_tokens"] is None
    assert result["kv_peak_bytes"] is None
    assert result["prefill_tok_s"] is None
    assert result["engine_ttft_p95_ms"] is None


def test_engine_url_alone_runs_only_the_external_server() -> None:
    assert parse_args([]).configs == ["hearth", "no_cache", "last_prompt"]
    assert parse_args(["--engine-url", "http://h:1"]).configs == ["external"]
    both = parse_args(["--configs", "hearth", "--engine-url", "http://h:1"])
    assert both.configs == ["hearth", "external"]
    with pytest.raises(SystemExit):
        parse_args(["--configs", "external"])


def test_an_external_server_gets_no_hearth_fields() -> None:
    settings = Settings("default", 8, 0.0, None, Path(), "http://h:1")
    replay = Replay(Household(load_fixture()), "external", settings)
    sample = replay.household.pools["satellite_a"][0]
    body = replay.household.fixture.body(sample)
    assert "hearth" in body  # the captured request carried Hearth's extension
    replay.server = Server("vllm", "qwen")
    sent = replay._external_body(body)
    assert "hearth" not in sent
    assert sent["model"] == "qwen"
    assert sent["messages"] == body["messages"]
    assert sent["tools"] == body["tools"]
    assert replay.label == "external (vllm)"


def test_llama_cpp_is_driven_as_the_plugin_drives_it() -> None:
    """``external``: priming as the pin step, ``cache_prompt``, no fixed slot;
    ``external_unprimed``: neither."""
    settings = Settings("default", 8, 0.0, None, Path(), "http://h:1")
    household = Household(load_fixture())
    primed = Replay(household, "external", settings)
    primed.server = Server("llama.cpp", None, slots=4)
    assert primed.pins and primed.switch_after_pin
    assert primed._external_body({}) == {"cache_prompt": True}
    plain = Replay(household, "external_unprimed", settings)
    plain.server = Server("llama.cpp", None, slots=4)
    assert not plain.pins
    assert plain._external_body({}) == {}
    assert parse_args(["--configs", "external_unprimed", "--engine-url", "u"]).configs == [
        "external_unprimed"
    ]


def test_the_baseline_runs_another_checkouts_engine(tmp_path: Path) -> None:
    """``hearth_baseline`` puts the other checkout's package first on the engine's path;
    the other configurations keep theirs (and their own environment)."""
    (tmp_path / "hearth_engine").mkdir()
    args = parse_args(["--configs", "hearth", "hearth_baseline", "--baseline", str(tmp_path)])
    settings = Settings("default", 8, 0.0, None, Path(), baseline=args.baseline)
    household = Household(load_fixture())
    assert Replay(household, "hearth_baseline", settings).engine_env() == {
        "PYTHONPATH": str(tmp_path)
    }
    assert Replay(household, "hearth", settings).engine_env() == {}
    dense = Replay(household, "hearth_dense_prefill", settings).engine_env()
    assert dense == {"HEARTH_QUANT_PREFILL": "dense"}
    for wrong in (
        ["--configs", "hearth_baseline"],  # no checkout named
        ["--baseline", str(tmp_path)],  # a checkout, but no row runs it
        ["--configs", "hearth_baseline", "--baseline", str(tmp_path / "nowhere")],
    ):
        with pytest.raises(SystemExit):
            parse_args(wrong)


@pytest.mark.parametrize("one_at_a_time", [False, True])
def test_one_at_a_time_sends_a_bursts_requests_one_after_another(one_at_a_time: bool) -> None:
    """The same trace either way; only the overlap of a burst's requests differs."""
    settings = Settings("default", 8, 0.0, None, Path(), None, one_at_a_time)
    replay = Replay(Household(load_fixture()), "hearth", settings)
    trace = make_trace(2026, 20, replay.household.pool_sizes(), 4, 2)
    burst = max((s for s in trace if s.kind == "burst"), key=lambda s: len(s.calls))
    in_flight, most, sent = 0, 0, []

    async def call(_session: object, _url: str, step: int, index: int, _call: object) -> None:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.01)
        sent.append((step, index))
        in_flight -= 1

    replay._call = call  # type: ignore[method-assign]  # no engine: only the pacing is tested
    asyncio.run(replay._run_steps(None, "", [Step("states", state_changes=1), burst]))  # type: ignore[arg-type]
    assert sorted(sent) == [(1, i) for i in range(len(burst.calls))]
    assert most == (1 if one_at_a_time else len(burst.calls))
    assert parse_args(["--one-at-a-time"]).one_at_a_time


def test_tool_call_deltas_fold_into_whole_calls() -> None:
    calls: list[dict[str, object]] = []
    add_tool_call_deltas(calls, [{"index": 0, "id": "c1", "function": {"name": "HassTurnOn"}}])
    add_tool_call_deltas(calls, [{"index": 0, "function": {"arguments": '{"name": '}}])
    add_tool_call_deltas(calls, [{"index": 0, "function": {"arguments": '"Lamp"}'}}])
    assert calls == [
        {"id": "c1", "type": "function",
         "function": {"name": "HassTurnOn", "arguments": '{"name": "Lamp"}'}}
    ]  # fmt: skip


@pytest.mark.parametrize("answers_with_a_call", [True, False])
def test_a_tool_round_follows_its_turn_with_the_servers_own_calls(
    answers_with_a_call: bool,
) -> None:
    """A sampled follow-up (iteration 1) is sent after its turn's first request, with
    the server's tool call (its id too) in place of the captured one, as the plugin
    sends it; where the server answers without a call it goes as captured."""
    settings = Settings("default", 8, 0.0, None, Path(), None)
    replay = Replay(Household(load_fixture()), "hearth", settings)
    household = replay.household
    role, number, follow = next(
        (role, n, s)
        for role, pool in household.pools.items()
        for n, s in enumerate(pool)
        if s.iteration == 1
    )
    (first,) = household.earlier_rounds(follow)
    assert first.iteration == 0 and follow.suffix[: len(first.suffix)] == first.suffix
    assert household.earlier_rounds(first) == []
    own = [{"id": "own_1", "type": "function",
            "function": {"name": "HassTurnOff", "arguments": '{"name": "X"}'}}]  # fmt: skip
    sent: list[tuple[dict[str, Any], int | None]] = []

    async def send(*args: Any, max_tokens: int | None = None) -> Reply:
        sent.append((args[-1], max_tokens))
        return Reply(tool_calls=own if answers_with_a_call else [])

    replay._send = send  # type: ignore[method-assign]  # no engine: the bodies are tested
    asyncio.run(replay._call(None, "", 3, 0, Call(role, number)))  # type: ignore[arg-type]
    (lead, whole), (last, limit) = sent
    assert lead["messages"][-1] == first.suffix[-1] and whole and whole >= 32 and limit is None
    captured = household.fixture.body(follow)["messages"]
    assert len(last["messages"]) == len(captured)
    if answers_with_a_call:
        assistant = last["messages"][len(captured) - len(follow.suffix) + len(first.suffix)]
        assert assistant["tool_calls"] == own
        assert last["messages"][-1]["tool_call_id"] == "own_1"
    else:
        assert last["messages"] == captured


def test_rounds_run_abba_and_pool_each_configurations_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--rounds``: the configurations run in turn, back and forth, and each one's
    requests and times are pooled (a stand-in replay: the order and the pooling are what
    is checked here; the replay itself runs against real engines in the benchmarks)."""
    from hearth_bench.household import main as household_main

    order: list[str] = []

    class CountingReplay:
        def __init__(self, household: object, name: str, settings: Settings) -> None:
            self.name, self.pins = name, name == "hearth"
            self.records: list[Record] = []

        async def run(self, trace: list[Step]) -> dict[str, Any]:
            order.append(self.name)
            ms = 100.0 * len(order)
            self.records = [
                Record(step=len(order), index=0, role="chat", agent="a", prefix=0,
                       issued_s=0.0, in_repin=False, in_debounce=False, ttft_ms=ms,
                       total_ms=ms, prompt_tokens=10, cached_tokens=9, engine_ttft_ms=ms,
                       prefill_ms=ms, queue_ms=0.0, error=None)
            ]  # fmt: skip
            peaks = {"kv_total_bytes": len(order)}
            return {"wall_s": 1.0, "stats": {}, "peaks": peaks, "pin_ms": [ms],
                    "repin_tokens": [], "repin_windows_s": [], "state_changes": 1}  # fmt: skip

    monkeypatch.setattr(household_main, "Replay", CountingReplay)
    settings = Settings("default", 8, 0.0, None, Path(), None)
    results, runs = asyncio.run(
        household_main.run_all(None, [], ["no_cache", "hearth"], settings, rounds=3)  # type: ignore[arg-type]
    )
    assert order == ["hearth", "no_cache", "no_cache", "hearth", "hearth", "no_cache"]
    assert [r.ttft_ms for r in runs["hearth"]] == [100.0, 400.0, 500.0]
    assert results["hearth"]["requests"] == 3 and results["hearth"]["ttft_p50_ms"] == 400.0
    assert results["no_cache"]["pin_ms"] == [200.0, 300.0, 600.0]
    assert results["no_cache"]["kv_peak_bytes"] == 6
    assert parse_args(["--rounds", "2"]).rounds == 2
    with pytest.raises(SystemExit):
        parse_args(["--rounds", "0"])
