"""The accuracy benchmark's pure parts: the dataset format, the judge, the tool calls."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from hearth_bench.accuracy.calls import invalid_calls, not_run, parse_reply, rejected_calls
from hearth_bench.accuracy.data import DatasetError, EntityState, load_dataset
from hearth_bench.accuracy.home import STALL_TIMEOUT_S, HomeStartError, house_yaml, set_language
from hearth_bench.accuracy.judge import judge, same
from hearth_bench.accuracy.main import _buildable, pick
from hearth_bench.accuracy.report import Outcome, ci95, leaderboard_table, summarize
from hearth_bench.harness.stack import copy_config

DATASETS = Path(__file__).resolve().parents[2] / "bench" / "datasets"
PROJECT_DATASET = DATASETS / "hearth-house"

FIXTURES = """
areas: [{name: Kitchen, id: kitchen}]
devices: [{name: Lamp, id: lamp, area: kitchen}]
entities:
  - {name: Lamp, id: light.lamp, device: lamp, state: "off"}
  - {name: Lock, id: lock.door, area: kitchen, state: locked}
"""
TESTS = """
category: [light, basics]
tests:
  - sentences: [Turn on the lamp, Lamp on]
    setup: {lock.door: {state: unlocked}}
    expect_changes: {light.lamp: {state: "on"}}
    ignore_changes: {light.lamp: [brightness]}
  - sentences: ["Is the door locked?"]
    expect_response: [unlocked]
    context_device: lamp
"""


def write_home(folder: Path, tests: str = TESTS) -> Path:
    folder.mkdir(parents=True)
    (folder / "_fixtures.yaml").write_text(FIXTURES)
    (folder / "basics.yaml").write_text(tests)
    (folder / "dataset_card.yaml").write_text("name: x\n")  # not a test file
    return folder


def test_a_home_expands_to_one_task_per_sentence(tmp_path: Path) -> None:
    (home,) = load_dataset(write_home(tmp_path / "one"))
    assert [t.sentence for t in home.tasks] == [
        "Turn on the lamp",
        "Lamp on",
        "Is the door locked?",
    ]
    first, _, question = home.tasks
    assert first.categories == ("light", "basics")
    assert first.expect_changes == {"light.lamp": EntityState("on")}
    assert first.ignore_changes == {"light.lamp": {"brightness"}}
    assert question.expect_changes is None
    assert question.expect_response == ("unlocked",)
    assert question.context_device == "lamp"
    states = home.states_for(first)
    assert states["lock.door"]["state"] == "unlocked"  # setup over the fixture
    assert home.states_for(question)["lock.door"]["state"] == "locked"


def test_a_folder_of_homes(tmp_path: Path) -> None:
    write_home(tmp_path / "a")
    write_home(tmp_path / "b")
    assert [h.name for h in load_dataset(tmp_path)] == ["a", "b"]


def test_tests_naming_unknown_entities_are_refused(tmp_path: Path) -> None:
    bad = "category: x\ntests:\n  - sentences: [hi]\n    expect_changes: {light.nope: {}}\n"
    with pytest.raises(DatasetError, match=r"light\.nope"):
        load_dataset(write_home(tmp_path / "bad", bad))
    with pytest.raises(DatasetError, match="no home"):
        load_dataset(tmp_path / "bad" / "missing")


def test_the_project_dataset_is_valid_and_covers_the_asked_domains() -> None:
    (home,) = load_dataset(PROJECT_DATASET)
    categories = {c for t in home.tasks for c in t.categories}
    assert len(home.tasks) >= 60
    wanted = {"light", "switch", "cover", "lock", "climate", "media_player", "fan", "timer"}
    assert wanted | {"question"} <= categories


def snapshot(**states: Any) -> dict[str, dict[str, Any]]:
    return {
        eid.replace("_", ".", 1): {"state": s[0], "attributes": s[1]} for eid, s in states.items()
    }


def task_of(tmp_path: Path, n: int = 0) -> Any:
    (home,) = load_dataset(write_home(tmp_path / "h"))
    return home.tasks[n]


def test_right_when_exactly_the_expected_change_happened(tmp_path: Path) -> None:
    task = task_of(tmp_path)
    before = snapshot(light_lamp=("off", {"friendly_name": "Lamp"}), lock_door=("locked", {}))
    after = snapshot(
        light_lamp=("on", {"friendly_name": "Lamp", "brightness": 255, "color_mode": "onoff"}),
        lock_door=("locked", {}),
    )
    assert judge(task, before, after, "Turned on the light").correct


def test_wrong_when_nothing_or_something_else_changed(tmp_path: Path) -> None:
    task = task_of(tmp_path)
    before = snapshot(light_lamp=("off", {}), lock_door=("locked", {}))
    nothing = judge(task, before, before, "Done")
    assert not nothing.correct
    assert nothing.unexpected == {"light.lamp": {"state": {"expected": "on", "got": "off"}}}
    also = snapshot(light_lamp=("on", {}), lock_door=("unlocked", {}))
    assert set(judge(task, before, also, "Done").unexpected) == {"lock.door"}
    assert not judge(task, before, snapshot(light_lamp=("on", {}), lock_door=("locked", {})),
                     "Sorry, I did it").correct  # fmt: skip


def test_questions_need_the_answer_and_no_change(tmp_path: Path) -> None:
    task = task_of(tmp_path, 2)
    before = snapshot(light_lamp=("off", {}), lock_door=("unlocked", {}))
    assert judge(task, before, before, "No, the door is UNLOCKED.").correct
    assert not judge(task, before, before, "The door is locked.").correct
    changed = snapshot(light_lamp=("on", {}), lock_door=("unlocked", {}))
    assert not judge(task, before, changed, "It is unlocked").correct


def test_an_expected_tool_must_have_been_called(tmp_path: Path) -> None:
    timer = (
        "category: timer\ntests:\n  - sentences: [Start a timer]\n"
        "    expect_tool_call: {tool_name: HassStartTimer}\n    expect_response: [started]\n"
    )
    (home,) = load_dataset(write_home(tmp_path / "t", timer))
    (task,) = home.tasks
    states = snapshot(light_lamp=("off", {}), lock_door=("locked", {}))
    reply = "Timer started"
    assert judge(task, states, states, reply, ["intent__HassStartTimer"]).correct
    assert not judge(task, states, states, reply, []).correct  # said so, called nothing
    assert judge(task, states, states, reply, None).correct  # HA's matcher answered
    assert not judge(task, states, states, "Done", ["HassStartTimer"]).correct


def test_values_compare_loosely() -> None:
    assert same(22, 22.0) and same("2", 2) and same([1, 2], (1, 2))
    assert not same(None, 0) and not same([1], "1")


def sse(*chunks: dict[str, Any]) -> bytes:
    lines = [f"data: {json.dumps(c)}\n\n" for c in chunks] + ["data: [DONE]\n\n"]
    return "".join(lines).encode()


TOOLS = {"tools": [{"type": "function", "function": {"name": "intent__HassTurnOn"}}]}


def call_chunk(name: str, arguments: str, index: int = 0) -> dict[str, Any]:
    call = {"index": index, "function": {"name": name, "arguments": arguments}}
    return {"choices": [{"delta": {"tool_calls": [call]}}]}


def test_streamed_tool_calls_are_read_and_checked() -> None:
    good = parse_reply(sse(call_chunk("HassTurnOn", '{"name":'), call_chunk("", ' "Lamp"}')))
    assert good.calls == [("HassTurnOn", '{"name": "Lamp"}')]
    assert invalid_calls(TOOLS, good) == []  # the bare intent name resolves, as the plugin does
    unknown = parse_reply(sse(call_chunk("intent_HassCatchLights", "{}")))
    assert invalid_calls(TOOLS, unknown) == ["unknown tool 'intent_HassCatchLights'"]
    broken = parse_reply(sse(call_chunk("intent__HassTurnOn", '{"name": ')))
    assert invalid_calls(TOOLS, broken) == ["intent__HassTurnOn: arguments are not a JSON object"]
    markup = parse_reply(sse({"choices": [{"delta": {"content": '<tool_call> {"name": "x"}'}}]}))
    assert invalid_calls(TOOLS, markup) == ["tool-call markup written as text"]
    as_text = '{"name": "Temp-22", "arguments": {"type": "function"}}\n#'
    json_text = parse_reply(sse({"choices": [{"delta": {"content": as_text}}]}))
    assert invalid_calls(TOOLS, json_text) == ["tool call written as JSON text"]
    whole = parse_reply(json.dumps({"choices": [{"message": {"content": "Hi"}}]}).encode())
    assert (whole.content, whole.calls) == ("Hi", [])


def test_rejected_calls_come_from_tool_results() -> None:
    def tool(content: Any, call_id: str) -> dict[str, Any]:
        return {"role": "tool", "tool_call_id": call_id, "content": json.dumps(content)}

    ok = tool({"response_type": "action_done", "data": {"success": [], "failed": []}}, "a")
    bad = tool({"error": "MatchFailedError", "error_text": "no entity named Lamp"}, "b")
    failed = tool({"data": {"failed": [{"id": "sensor.t"}]}}, "c")
    bodies = [{"messages": [ok, bad]}, {"messages": [ok, bad, failed]}]
    assert rejected_calls(bodies) == [
        "MatchFailedError: no entity named Lamp",
        "failed on ['sensor.t']",
    ]


def test_a_call_the_agent_refused_is_not_read_as_run() -> None:
    """The agent's refusal (its ``NotRequested`` tool result) marks a call as not run,
    by the id the engine gave it; another error (HA failed it) does not."""
    first = call_chunk("HassCancelAllTimers", "{}")
    first["choices"][0]["delta"]["tool_calls"][0]["id"] = "call_1"
    second = call_chunk("HassTurnOff", '{"name": "Valve"}', index=1)
    second["choices"][0]["delta"]["tool_calls"][0]["id"] = "call_2"
    reply = parse_reply(sse(first, second))
    assert reply.ids == ["call_1", "call_2"]
    refusal = {"error": "NotRequested", "error_text": "the request names no timer"}
    failed = {"error": "MatchFailedError", "error_text": "no entity named Valve"}
    bodies = [
        {
            "messages": [
                {"role": "user", "content": "close the water"},
                {"role": "tool", "tool_call_id": "call_1", "content": json.dumps(refusal)},
                {"role": "tool", "tool_call_id": "call_2", "content": json.dumps(failed)},
            ]
        }
    ]
    assert not_run(bodies) == {"call_1"}
    whole = {"message": {"tool_calls": [{"id": "c", "function": {"name": "HassTurnOn"}}]}}
    assert parse_reply(json.dumps({"choices": [whole]}).encode()).ids == ["c"]


def test_the_report_has_the_promised_fields() -> None:
    def outcome(correct: bool, path: str, invalid: list[str], ms: float) -> Outcome:
        return Outcome("h", "r.yaml", ["light"], "s", correct, path, "", ms, invalid=invalid)

    outcomes = [outcome(True, "local", [], 10), outcome(False, "hearth", ["x"], 300),
                outcome(True, "hearth", [], 100)]  # fmt: skip
    report = summarize(outcomes, "pipeline", "tiny-tools", "ds")
    assert {
        "mode", "model", "dataset", "sentences", "correct", "correct_rate",
        "invalid_tool_calls", "invalid_rate", "local_answered", "local_correct",
        "reply_p50_ms", "reply_p95_ms", "by_category",
    } <= set(report)  # fmt: skip
    assert (report["sentences"], report["correct"], report["invalid_tool_calls"]) == (3, 2, 1)
    assert (report["local_answered"], report["local_correct"]) == (1, 1)
    assert report["reply_p50_ms"] == 100
    assert report["by_category"]["light"]["correct_rate"] == round(2 / 3, 4)


def test_limit_spreads_over_the_dataset() -> None:
    assert pick(list(range(10)), 5) == [0, 2, 4, 6, 8]
    assert pick(list(range(3)), None) == [0, 1, 2]


def test_a_home_is_spoken_to_in_its_fixture_language(tmp_path: Path) -> None:
    (english,) = load_dataset(write_home(tmp_path / "one"))
    assert english.language == "en"  # no `language`: English, as the format's default
    german = tmp_path / "two"
    write_home(german)
    (german / "_fixtures.yaml").write_text("language: de\n" + FIXTURES)
    assert load_dataset(german)[0].language == "de"


def test_the_language_reaches_home_assistants_configuration(tmp_path: Path) -> None:
    configuration = tmp_path / "configuration.yaml"
    configuration.write_text("homeassistant:\n  name: x\n  language: en\n  country: NL\n")
    set_language(configuration, "de")
    assert configuration.read_text() == "homeassistant:\n  name: x\n  language: de\n  country: NL\n"
    configuration.write_text("homeassistant:\n  name: x\n")
    with pytest.raises(HomeStartError, match="no `language:` line"):
        set_language(configuration, "de")


def test_a_home_waits_for_a_slow_token_instead_of_calling_it_a_stall(tmp_path: Path) -> None:
    """The bench judges answers: on a loaded host a first token over Hearth's default 25 s
    stall time was spoken as "stalled" and counted wrong (before 2026-12-06)."""
    hearth = json.loads(house_yaml(tmp_path, "http://127.0.0.1:1", {"tool_first": True}))["hearth"]
    assert hearth["entry_options"] == {"stall_timeout": STALL_TIMEOUT_S}
    assert STALL_TIMEOUT_S > 25
    assert hearth["agent_options"] == {"tool_first": True}


def test_sentences_naming_left_out_entities_are_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (home,) = load_dataset(write_home(tmp_path / "one"))
    kept = _buildable("one", home.tasks, {"light.lamp"})
    assert [t.sentence for t in kept] == ["Is the door locked?"]
    assert "2 sentences skipped (they name left-out entities)" in capsys.readouterr().err
    assert _buildable("one", home.tasks, set()) == home.tasks


def test_the_new_homes_are_valid_and_cover_what_issue_27_asks() -> None:
    (english,) = load_dataset(DATASETS / "maple-street")
    (german,) = load_dataset(DATASETS / "haus-am-hang")
    assert (len(english.tasks), english.language) >= (40, "en")
    assert (len(german.tasks), german.language) >= (20, "de")
    domains = {entity_id.split(".")[0] for entity_id in english.entities}
    assert {"valve", "todo", "cover", "media_player", "fan", "vacuum", "weather"} <= domains
    names = yaml.safe_load((DATASETS / "maple-street" / "_fixtures.yaml").read_text())
    by_name: dict[str, set[str]] = {}
    for entity in names["entities"]:
        by_name.setdefault(entity["name"], set()).add(entity["id"].split(".")[0])
    assert by_name["Garage Door"] == {"cover", "light"}  # a shared name, two domains
    assert {"lock", "binary_sensor"} <= by_name["Front Door"]


def test_reports_rate_categories_as_the_leaderboard_does() -> None:
    assert (ci95(0, 0), ci95(5, 5), ci95(196 * 98 // 100, 196)) == (0.0, 0.0, 2.0)
    outcomes = [
        Outcome("h", "r.yaml", ["light"], "s", True, "local", "", 10),
        Outcome("h", "r.yaml", ["light"], "s", False, "hearth", "", 10),
        Outcome("h", "r.yaml", ["fan"], "s", True, "hearth", "", 10),
    ]
    report = summarize(outcomes, "pipeline", "default", "ds")
    assert report["by_category"]["light"]["local_correct"] == 1
    table = leaderboard_table(report).splitlines()
    assert table[0] == "| run | fan (n=1) | light (n=2) | all (n=3) |"
    assert table[2] == (
        "| pipeline default | 100.0% (n=1, CI: 0.0) | 50.0% (n=2, CI: 69.3)"
        " | 66.7% (n=3, CI: 53.3) |"
    )
    assert table[3].startswith("| matcher alone | 0.0% (n=1, CI: 0.0) | 50.0% (n=2")


def test_a_workdir_can_be_used_again(tmp_path: Path) -> None:
    """A second run in the same ``--workdir`` starts from a clean copy of the config
    (it ended in FileExistsError and a traceback)."""
    target = tmp_path / "home" / "config"
    copy_config(target)
    (target / "leftover.yaml").write_text("x: 1\n")
    copy_config(target)
    assert not (target / "leftover.yaml").exists()
    assert (target / "custom_components" / "hearth" / "manifest.json").is_file()
