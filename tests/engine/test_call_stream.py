"""Tool calls streamed name first (``chat/call_stream.py``): which names are complete,
and the deltas that complete the calls at the end."""

from __future__ import annotations

import json

from hearth_engine.chat.call_stream import CallAnnouncer
from hearth_engine.chat.formatter import ToolCall, ToolFormat, parse_tool_calls

TWO_CALLS = (
    '<tool_call>\n{"name": "HassTurnOn", "arguments": {"name": "Kitchen"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "HassTurnOff", "arguments": {"area": "Hall"}}\n</tool_call>'
)


def _feed(announcer: CallAnnouncer, text: str) -> list[tuple[int, str]]:
    """Feed ``text`` one character at a time; (index, name) of each announcement and
    how much text it took."""
    seen = []
    for end in range(1, len(text) + 1):
        seen += [(c.index, c.name, end) for c in announcer.new_calls(text[:end])]
    return [(i, n) for i, n, _ in seen]


def test_each_name_is_announced_once_as_soon_as_it_is_complete() -> None:
    announcer = CallAnnouncer(ToolFormat.HERMES)
    assert announcer.new_calls('<tool_call>\n{"name": "HassTurn') == []
    first = announcer.new_calls('<tool_call>\n{"name": "HassTurnOn"')
    assert [(c.index, c.name) for c in first] == [(0, "HassTurnOn")]
    assert announcer.new_calls('<tool_call>\n{"name": "HassTurnOn", "arg') == []
    # A "name" inside the arguments is not another call; the second call's is.
    assert _feed(CallAnnouncer(ToolFormat.HERMES), TWO_CALLS) == [
        (0, "HassTurnOn"),
        (1, "HassTurnOff"),
    ]


def test_the_final_deltas_complete_the_announced_calls() -> None:
    announcer = CallAnnouncer(ToolFormat.HERMES)
    announced = announcer.new_calls(TWO_CALLS)
    _content, calls = parse_tool_calls(TWO_CALLS, ToolFormat.HERMES)
    deltas = announcer.deltas(calls, TWO_CALLS)
    assert deltas == [
        {"index": 0, "function": {"arguments": calls[0].arguments}},
        {"index": 1, "function": {"arguments": calls[1].arguments}},
    ]
    assert len({c.id for c in announced}) == 2
    # A call that was not announced comes whole, after the announced ones.
    extra = ToolCall("HassNevermind", "{}")
    assert announcer.deltas([*calls, extra], TWO_CALLS)[-1] == extra.as_openai(2)


def test_a_call_cut_short_gets_the_arguments_it_wrote_which_are_not_json() -> None:
    text = '<tool_call>\n{"name": "HassTurnOn", "arguments": {"name": "Kit'
    announcer = CallAnnouncer(ToolFormat.HERMES)
    announcer.new_calls(text)
    (delta,) = announcer.deltas([], text)
    arguments = delta["function"]["arguments"]  # type: ignore[index]
    assert arguments == '{"name": "Kit'
    cut_early = CallAnnouncer(ToolFormat.HERMES)
    cut_early.new_calls('<tool_call>{"name": "HassTurnOn"')
    (delta,) = cut_early.deltas([], '<tool_call>{"name": "HassTurnOn"')
    for partial in (arguments, delta["function"]["arguments"]):  # type: ignore[index]
        try:
            value = json.loads(partial)
        except ValueError:
            continue
        raise AssertionError(f"a cut call's arguments parse: {value!r}")


def test_short_names_are_announced_as_the_tool_and_other_formats() -> None:
    announcer = CallAnnouncer(ToolFormat.HERMES, {"TurnOn": "assist__HassTurnOn"})
    assert [c.name for c in announcer.new_calls('<tool_call>{"name": "TurnOn"')] == [
        "assist__HassTurnOn"
    ]
    llama = CallAnnouncer(ToolFormat.LLAMA3)
    assert [c.name for c in llama.new_calls('<|python_tag|>{"name": "GetTime", "par')] == [
        "GetTime"
    ]
    mistral = CallAnnouncer(ToolFormat.MISTRAL)
    assert [c.name for c in mistral.new_calls('[TOOL_CALLS][{"name": "a\\"b"')] == ['a"b']
    mistral_args = CallAnnouncer(ToolFormat.MISTRAL)
    assert [c.name for c in mistral_args.new_calls("[TOOL_CALLS]GetTime[ARGS]")] == ["GetTime"]
    assert CallAnnouncer(ToolFormat.LLAMA3).new_calls('Sure! {"name": "x"') == []
