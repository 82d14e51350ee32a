"""Chat templates, tool-call parsing and incremental detokenization."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from transformers import AutoTokenizer

from hearth_engine.chat.formatter import (
    ChatFormatter,
    ChatTemplateError,
    StreamSplitter,
    ToolFormat,
    detect_tool_format,
    parse_tool_calls,
)
from hearth_engine.model.prepare.default import default_model_dir
from hearth_engine.model.prepare.tiny import prepare_tiny_model
from hearth_engine.serving.detok import TextStream

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "HassTurnOn",
            "description": "Turns on a device",
            "parameters": {"type": "object", "properties": {"name": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def formatter(tiny_runner) -> ChatFormatter:
    return ChatFormatter(tiny_runner.tokenizer)


def test_template_lists_tools_in_the_system_turn(formatter: ChatFormatter) -> None:
    text = formatter.render(
        [{"role": "system", "content": "You control a house."}, {"role": "user", "content": "hi"}],
        TOOLS,
    )
    system, _, rest = text.partition("<|im_end|>")
    assert system.startswith("<|im_start|>system\nYou control a house.")
    assert "<tools>\nHassTurnOn(name?: string) - Turns on a device\n</tools>" in system
    assert "<tool_call>" in system
    assert rest.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_prefix_render_is_a_token_prefix_of_the_conversation(formatter: ChatFormatter) -> None:
    """What makes pins hit: the pinned [system + tools] is a prefix of every request."""
    system = [{"role": "system", "content": "Static house context."}]
    prefix = formatter.encode(formatter.render(system, TOOLS, add_generation_prompt=False))
    messages = [
        *system,
        {"role": "system", "content": "Time: 10:42"},
        {"role": "user", "content": "turn on the kitchen light"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "HassTurnOn", "arguments": '{"name": "Kitchen Light"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"success": true}'},
    ]
    full = formatter.encode(formatter.render(messages, TOOLS))
    assert full[: len(prefix)] == prefix
    text = formatter.render(messages, TOOLS)
    assert (
        '<tool_call>\n{"name": "HassTurnOn", "arguments": {"name": "Kitchen Light"}}\n</tool_call>'
        in text
    )
    assert '<tool_response>\n{"success": true}\n</tool_response>' in text


def test_template_errors_are_reported_not_raised_raw(tiny_runner) -> None:
    class Broken:
        chat_template = "{{ raise_exception('no system role') }}"

        def apply_chat_template(self, *args, **kwargs):
            from jinja2 import TemplateError

            raise TemplateError("no system role")

    with pytest.raises(ChatTemplateError, match="no system role"):
        ChatFormatter(Broken()).render([{"role": "system", "content": "x"}])


@pytest.mark.parametrize(
    ("template", "fmt"),
    [
        ("... <tool_call> ...", ToolFormat.HERMES),
        ("... [TOOL_CALLS] ...", ToolFormat.MISTRAL),
        ("... <|python_tag|> ipython ...", ToolFormat.LLAMA3),
        ("plain chatml", ToolFormat.HERMES),
    ],
)
def test_tool_format_detection(template: str, fmt: ToolFormat) -> None:
    assert detect_tool_format(template) is fmt


@pytest.mark.parametrize(
    ("text", "fmt", "content", "calls"),
    [
        (
            'Sure.\n<tool_call>\n{"name": "HassTurnOn", "arguments": {"name": "Lamp"}}\n'
            "</tool_call>",
            ToolFormat.HERMES,
            "Sure.",
            [("HassTurnOn", {"name": "Lamp"})],
        ),
        (
            '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n'
            '<tool_call>{"name": "b", "arguments": {"x": 1}}</tool_call>',
            ToolFormat.HERMES,
            "",
            [("a", {}), ("b", {"x": 1})],
        ),
        (  # unterminated at the end of generation: still a call
            '<tool_call>\n{"name": "a", "arguments": {"k": "v"}}',
            ToolFormat.HERMES,
            "",
            [("a", {"k": "v"})],
        ),
        ('<tool_call>{"name": broken', ToolFormat.HERMES, '<tool_call>{"name": broken', []),
        ("no calls here", ToolFormat.HERMES, "no calls here", []),
        (
            '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}',
            ToolFormat.LLAMA3,
            "",
            [("get_weather", {"city": "Oslo"})],
        ),
        ('{"not": "a call"}', ToolFormat.LLAMA3, '{"not": "a call"}', []),
        (
            '[TOOL_CALLS][{"name": "a", "arguments": {"x": 2}}]',
            ToolFormat.MISTRAL,
            "",
            [("a", {"x": 2})],
        ),
        ('[TOOL_CALLS]a[ARGS]{"x": 3}', ToolFormat.MISTRAL, "", [("a", {"x": 3})]),
    ],
)
def test_parse_tool_calls(text: str, fmt: ToolFormat, content: str, calls: list) -> None:
    got_content, got_calls = parse_tool_calls(text, fmt)
    assert got_content == content
    assert [(c.name, json.loads(c.arguments)) for c in got_calls] == calls


def test_stream_splitter_never_leaks_a_partial_marker() -> None:
    text = 'Okay <tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>'
    splitter = StreamSplitter(ToolFormat.HERMES)
    sent = "".join(splitter.feed(ch) for ch in text)
    assert sent == "Okay "
    tail, calls = splitter.finish()
    assert tail == ""
    assert [c.name for c in calls] == ["a"]


def test_stream_splitter_releases_text_that_was_not_a_call() -> None:
    splitter = StreamSplitter(ToolFormat.HERMES)
    sent = "".join(splitter.feed(ch) for ch in "a <tool and more")
    tail, calls = splitter.finish()
    assert sent + tail == "a <tool and more"
    assert calls == []


def test_detokenizer_handles_multibyte_and_stop_strings(tiny_runner) -> None:
    tok = tiny_runner.tokenizer
    text = "Grüße, Zoë! ☃ done. STOP here"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    stream = TextStream(tok)
    out = "".join(stream.push(i) for i in ids) + stream.finish()
    assert out == text
    stream = TextStream(tok, stop=("STOP",))
    pieces = [stream.push(i) for i in ids]
    out = "".join(pieces) + stream.finish()
    assert out == "Grüße, Zoë! ☃ done. "
    assert stream.stopped
    assert all("\ufffd" not in p for p in pieces)


def _split_characters(tok: Any, text: str) -> bool:
    """Whether some token of ``text`` is only part of a character (so the test bites)."""
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return any("\ufffd" in tok.decode([i]) for i in ids)


@pytest.mark.parametrize("model", ["tiny", "default"])
@pytest.mark.parametrize(
    "text",
    ["家族 東京タワー の天気", "emoji 🎉🧑🏽‍🚀 end", "👩‍👩‍👧", "naïve Grüße ☃"],
)
def test_detokenizer_joins_characters_split_over_tokens(model: str, text: str) -> None:
    folder = prepare_tiny_model() if model == "tiny" else default_model_dir()
    if not (folder / "tokenizer.json").exists():
        pytest.skip("the default model is not built on this machine")
    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    stream = TextStream(tok)
    pieces = [stream.push(i) for i in ids]
    assert "".join(pieces) + stream.finish() == text
    assert all("\ufffd" not in p for p in pieces)
    if model == "tiny":
        assert _split_characters(tok, text)  # the tiny tokenizer splits these into bytes


def test_detokenizer_skips_special_tokens(tiny_runner) -> None:
    tok = tiny_runner.tokenizer
    hi = tok("Hi there", add_special_tokens=False)["input_ids"]
    end = tok.convert_tokens_to_ids("<|im_end|>")
    stream = TextStream(tok)
    out = "".join(stream.push(i) for i in [*hi, end, *hi]) + stream.finish()
    assert out == "Hi thereHi there"


def test_detokenizer_drops_an_unfinished_character_at_the_end(tiny_runner) -> None:
    tok = tiny_runner.tokenizer
    ids = tok("ok 🎉", add_special_tokens=False)["input_ids"]
    stream = TextStream(tok)
    out = "".join(stream.push(i) for i in ids[:-1]) + stream.finish()
    assert out == "ok "  # the emoji's last byte never came


def test_formatter_has_its_own_tokenizer(tiny_runner) -> None:
    """Bug 7: the server encodes on its thread while the worker decodes with the model's
    tokenizer; a Rust tokenizer shared by two threads can fail with "Already borrowed"."""
    formatter = ChatFormatter(tiny_runner.tokenizer)
    assert formatter.tokenizer is not tiny_runner.tokenizer
    assert formatter.tokenizer.backend_tokenizer is not tiny_runner.tokenizer.backend_tokenizer
    text = formatter.render([{"role": "user", "content": "Grüße 🎉"}])
    assert (
        formatter.encode(text) == tiny_runner.tokenizer(text, add_special_tokens=False)["input_ids"]
    )


def test_encoding_and_decoding_on_two_threads_at_once(tiny_runner) -> None:
    """The server's formatter encodes while the worker's streams decode; both stay right."""
    formatter = ChatFormatter(tiny_runner.tokenizer)
    text = formatter.render([{"role": "user", "content": "Grüße, Zoë! ☃ 家族 " * 200}])
    want_ids = formatter.encode(text)
    answer = "The kitchen light is on. 🎉 家族"
    answer_ids = tiny_runner.tokenizer(answer, add_special_tokens=False)["input_ids"]
    failures: list[str] = []

    def encode() -> None:
        for _ in range(30):
            if formatter.encode(text) != want_ids:
                failures.append("encode")

    def decode() -> None:
        for _ in range(300):
            stream = TextStream(tiny_runner.tokenizer)
            if "".join(stream.push(i) for i in answer_ids) + stream.finish() != answer:
                failures.append("decode")

    threads = [threading.Thread(target=encode), threading.Thread(target=decode)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
