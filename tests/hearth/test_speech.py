"""Tool markup written as text is never spoken (``speech.MarkupFilter``).

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
from custom_components.hearth.entity import _Reply, _transform_stream
from custom_components.hearth.speech import MarkupFilter

SORRY = "Sorry, I could not do that."


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
    stream = _transform_stream(_chunks(texts), _Reply(), [], None, SORRY)
    return "".join([d.get("content") or "" async for d in stream if "content" in d])


async def test_a_reply_of_only_markup_says_sorry() -> None:
    assert await _spoken(["<tool_", 'response> {"error": 1} </tool_response>']) == SORRY


async def test_text_around_markup_is_kept_and_no_sorry() -> None:
    assert await _spoken(["Done", ". <tool_call>{}", "</tool_call>"]) == "Done. "


async def test_the_history_keeps_the_raw_text() -> None:
    reply = _Reply()
    stream = _transform_stream(_chunks(["a <tool_call>{}</tool_call>"]), reply, [], None, SORRY)
    deltas = [d async for d in stream]
    native = deltas[-1]["native"]
    assert native.message["content"] == "a <tool_call>{}</tool_call>"
