"""Tool markup, code, JSON and HTML written as text are never spoken
(``speech.MarkupFilter``, ``speech.speakable``).

The engine's grammar stops Hermes-style models from writing markup as text, so a real
engine cannot be made to send it here; Llama 3 / Mistral models and other servers can.
The filter is pure text processing: tested directly, and through the stream transform
with engine-shaped chunks.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import custom_components.hearth  # noqa: F401 - resolve the real package first
from custom_components.hearth.turn.speech import MarkupFilter, speakable
from custom_components.hearth.turn.stream import Reply, transform_stream

SORRY = "Sorry, I could not do that."


class _Turn:
    """What the stream reads of a turn (turn/prepare.py's ``Turn``): a spoken answer
    whose calls all run as the model made them."""

    tool_names: tuple[str, ...] = ()
    fallback = SORRY
    early = False

    def resolve(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return arguments

    def refusal(self, tool: str, arguments: dict[str, Any]) -> str | None:
        return None

    def asks(self, text: str) -> bool:
        return False


def run(chunks: list[str]) -> tuple[str, MarkupFilter]:
    speech = MarkupFilter()
    text = "".join(speech.feed(chunk) for chunk in chunks) + speech.finish()
    return text, speech


@pytest.mark.parametrize(
    ("reply", "spoken"),
    [
        ("The light is on.", "The light is on."),
        ('<tool_call>\n{"name": "HassTurnOn"}\n</tool_call>', ""),
        ('Sure. <tool_call>{"name": "x"}</tool_call> Done.', "Sure.  Done."),
        ('<tool_response> {"error": "not found"} </tool_response>', ""),
        ('[TOOL_CALLS][{"name": "x"}]', ""),
        ('OK <|python_tag|>{"name": "x"}', "OK "),
        ("stray </tool_call> closer", "stray  closer"),
        ("a < b and <tool is not a tag", "a < b and <tool is not a tag"),
        ("<tool_call> never closed", ""),
    ],
)
def test_markup_is_removed(reply: str, spoken: str) -> None:
    assert run([reply])[0] == spoken


@given(
    st.lists(
        st.sampled_from(
            [
                "Hi ",
                "<tool_call>",
                "</tool_call>",
                '{"a": 1}',
                "<tool_response>",
                "</tool_",
                "<",
                "x",
            ]
        ),
        max_size=12,
    ),
    st.data(),
)
def test_any_chunking_speaks_the_same(parts: list[str], data: st.DataObject) -> None:
    """Tags split across stream chunks are found as if the text came whole."""
    whole = "".join(parts)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(whole)), max_size=8)))
    chunks = [whole[a:b] for a, b in zip([0, *cuts], [*cuts, len(whole)], strict=True)]
    assert run(chunks)[0] == run([whole])[0]


async def _chunks(texts: list[str]) -> AsyncGenerator[dict[str, Any]]:
    for text in texts:
        yield {"choices": [{"delta": {"content": text}}]}
    yield {"choices": [{"delta": {}, "finish_reason": "stop"}]}


async def _spoken(texts: list[str]) -> str:
    stream = transform_stream(_chunks(texts), Reply(), _Turn(), seen_calls=set())
    return "".join([d.get("content") or "" async for d in stream if "content" in d])


async def test_a_reply_of_only_markup_says_sorry() -> None:
    assert await _spoken(["<tool_", 'response> {"error": 1} </tool_response>']) == SORRY


async def test_text_around_markup_is_kept_and_no_sorry() -> None:
    assert await _spoken(["Done", ". <tool_call>{}", "</tool_call>"]) == "Done."


async def test_the_history_keeps_the_raw_text() -> None:
    reply = Reply()
    chunks = _chunks(["a <tool_call>{}</tool_call>"])
    stream = transform_stream(chunks, reply, _Turn(), seen_calls=set())
    deltas = [d async for d in stream]
    native = deltas[-1]["native"]
    assert native.message["content"] == "a <tool_call>{}</tool_call>"


# Replies a small model wrote (or could write) instead of calling a tool: none is spoken.
HOSTILE = [
    "The function to close the irrigation valve is:\n```\nfunction close_irrigation_valve() {"
    "\n  valve.close();\n}\n```",
    "```python\nhass.services.call('light', 'turn_on')\n```",
    'Here you go: {"name": "HassTurnOn", "arguments": {"name": "Kitchen Light"}}',
    '{"name": "Kitchen Light"}',
    '[{"name": "x"}]',
    "<b>Done</b>",
    "Turned on.<br/>",
    "<div class='reply'>ok</div>",
    "Use `HassTurnOn` with the name.",
    'HassTurnOn(name="Kitchen Light")',
    "turn_on(entity_id='light.kitchen')",
    "close_irrigation_valve()",
    "def close_valve(v):\n    v.close()",
    "function closeValve(v) { v.close() }",
    "valve.close();",
    "x => x.close",
    "light::turn_on",
    "<|eot_id|>",
    "[TOOL_CALLS] HassTurnOn",
    "<tool_call>",
    "</tool_response>",
]
SPOKEN = [
    "The kitchen light is on.",
    "It is 21 degrees in the living room.",
    "Sorry, I could not find a device called porch light.",
    "Which one: the Garage Door Opener or its light?",
    "Turned on the light: Garage Door Opener.",
    "Die Küchenlampe ist an.",
    "キッチンの電気をつけました。",
    "It's 5 < 7, and 9 > 3.",
    "The thermostat (upstairs) is set to 20.",
    "Done!",
]


@pytest.mark.parametrize("reply", HOSTILE)
def test_code_json_html_and_markup_are_not_speakable(reply: str) -> None:
    assert not speakable(reply)


@pytest.mark.parametrize("reply", SPOKEN)
def test_sentences_are_speakable(reply: str) -> None:
    assert speakable(reply)


@given(
    st.sampled_from(SPOKEN),
    st.sampled_from(HOSTILE),
    st.sampled_from(SPOKEN),
    st.sampled_from([" ", "\n", "\n\n", ": "]),
)
def test_a_sentence_around_code_is_not_speakable(
    before: str, code: str, after: str, glue: str
) -> None:
    assert not speakable(glue.join([before, code, after]))


@given(st.text(st.characters(categories=["L", "N", "Zs"]) | st.sampled_from(".,!?'%°-")))
def test_plain_words_are_speakable(text: str) -> None:
    """Letters, digits, spaces and sentence punctuation, in any script, are speech."""
    assert speakable(text)


@pytest.mark.parametrize("reply", HOSTILE[:6])
async def test_a_reply_of_code_says_sorry_instead(reply: str) -> None:
    assert await _spoken([reply[:7], reply[7:]]) == SORRY
