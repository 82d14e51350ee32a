"""Prompt encoding with a cached house part: exactly the tokens of the whole prompt.

The property: for any messages and tools, ``PromptEncoder.encode`` gives the same ids as
tokenizing the whole rendered prompt, whether the house part was cached or not, for every
tool-call convention's template style (Hermes/ChatML, Llama 3, Mistral).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken
from transformers import AutoTokenizer

from hearth_engine.chat.formatter import ChatFormatter
from hearth_engine.model.prepare.default import default_model_dir
from hearth_engine.model.prepare.templates import HERMES_CHATML_TEMPLATE
from hearth_engine.model.prepare.tiny import prepare_tiny_model
from hearth_engine.server.prompts import PromptEncoder

# Simplified Llama 3.1 and Mistral (v3) templates: their layout and special tokens are
# what matters here (where the system message and the tools go, which tokens end a turn).
LLAMA3_TEMPLATE = (
    "{{- '<|begin_of_text|>' }}"
    "{%- if messages and messages[0].role == 'system' %}"
    "{%- set system = messages[0].content %}{%- set rest = messages[1:] %}"
    "{%- else %}{%- set system = '' %}{%- set rest = messages %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{%- if tools %}{{- 'Environment: ipython\\n' }}"
    "{%- for t in tools %}{{- t | tojson(indent=4) }}{{- '\\n\\n' }}{%- endfor %}{%- endif %}"
    "{{- system + '<|eot_id|>' }}"
    "{%- for m in rest %}"
    "{%- if m.role == 'tool' %}{%- set role = 'ipython' %}{%- else %}{%- set role = m.role %}"
    "{%- endif %}"
    "{{- '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' }}"
    "{%- if m.tool_calls %}{%- for c in m.tool_calls %}"
    '{{- \'<|python_tag|>{"name": "\' + c.function.name + \'", "parameters": \' }}'
    "{{- c.function.arguments | tojson }}{{- '}' }}{%- endfor %}"
    "{%- else %}{{- m.content }}{%- endif %}"
    "{{- '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
MISTRAL_TEMPLATE = (
    "{%- if messages and messages[0].role == 'system' %}"
    "{%- set system = messages[0].content %}{%- set rest = messages[1:] %}"
    "{%- else %}{%- set system = '' %}{%- set rest = messages %}{%- endif %}"
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for m in rest %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}"
    "{%- endif %}{%- endfor %}"
    "{{- '<s>' }}"
    "{%- for m in rest %}"
    "{%- if m.role == 'user' %}"
    "{%- if tools and loop.index0 == ns.last_user %}"
    "{{- '[AVAILABLE_TOOLS]' + (tools | tojson) + '[/AVAILABLE_TOOLS]' }}{%- endif %}"
    "{{- '[INST]' }}{%- if system and loop.index0 == ns.last_user %}"
    "{{- system + '\\n\\n' }}{%- endif %}{{- m.content + '[/INST]' }}"
    "{%- elif m.role == 'assistant' %}"
    "{%- if m.tool_calls %}{{- '[TOOL_CALLS]' }}"
    "{{- m.tool_calls | map(attribute='function') | list | tojson }}"
    "{%- else %}{{- m.content }}{%- endif %}{{- '</s>' }}"
    "{%- elif m.role == 'tool' %}"
    "{{- '[TOOL_RESULTS]' + m.content + '[/TOOL_RESULTS]' }}"
    "{%- else %}{{- '[INST]' + m.content + '[/INST]' }}"
    "{%- endif %}"
    "{%- endfor %}"
)
LLAMA3_SPECIALS = [
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
]
MISTRAL_SPECIALS = [
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_CALLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
]


def _with_template(tokenizer: Any, template: str, specials: list[str]) -> Any:
    tok = copy.deepcopy(tokenizer)
    tok.add_special_tokens(
        {
            "additional_special_tokens": [
                AddedToken(s, special=True, normalized=False) for s in specials
            ]
        }
    )
    tok.chat_template = template
    return tok


@pytest.fixture(scope="module")
def tiny_tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(prepare_tiny_model())


@pytest.fixture(scope="module")
def default_tokenizer() -> Any:
    """SmolLM2's tokenizer with Hearth's template, if the default model is built here."""
    folder = default_model_dir()
    if not (folder / "tokenizer.json").exists():
        pytest.skip("the default model is not built on this machine")
    return AutoTokenizer.from_pretrained(folder)


@pytest.fixture(
    scope="module", params=["hermes-tiny", "hermes-now", "hermes-default", "llama3", "mistral"]
)
def formatter(request: pytest.FixtureRequest, tiny_tokenizer: Any) -> ChatFormatter:
    if request.param == "hermes-tiny":
        return ChatFormatter(tiny_tokenizer)
    if request.param == "hermes-now":  # this checkout's template, whatever a folder holds
        return ChatFormatter(_with_template(tiny_tokenizer, HERMES_CHATML_TEMPLATE, []))
    if request.param == "hermes-default":
        return ChatFormatter(request.getfixturevalue("default_tokenizer"))
    if request.param == "llama3":
        return ChatFormatter(_with_template(tiny_tokenizer, LLAMA3_TEMPLATE, LLAMA3_SPECIALS))
    return ChatFormatter(_with_template(tiny_tokenizer, MISTRAL_TEMPLATE, MISTRAL_SPECIALS))


# Text that stresses the boundaries: whitespace runs, markup and special tokens written
# into the content, partial markers, multi-byte characters.
_PIECES = st.sampled_from(
    [
        " ",
        "  ",
        "\n",
        "\n\n",
        "\t",
        "x",
        "Hello",
        " world",
        "light.kitchen",
        "é",
        "家",
        "🎉",
        "<|im_end|>",
        "<|im_start|>",
        "<|im_",
        "<tool_call>",
        "</tool_call>",
        "<|eot_id|>",
        "[INST]",
        "{",
        '"}',
        "'s",
    ]
)
TEXT = st.lists(_PIECES, max_size=8).map("".join)
TOOL = st.builds(
    lambda name, desc: {
        "type": "function",
        "function": {
            "name": name,
            "description": desc,
            "parameters": {"type": "object", "properties": {"name": {"type": "string"}}},
        },
    },
    st.sampled_from(["HassTurnOn", "HassTurnOff", "GetLiveContext"]),
    TEXT,
)


def _turn(kind: str, text: str) -> list[dict[str, Any]]:
    if kind == "call":
        call = {
            "id": "c1",
            "type": "function",
            "function": {"name": "HassTurnOn", "arguments": json.dumps({"name": text})},
        }
        return [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": text},
        ]
    return [{"role": kind, "content": text}]


SUFFIX = st.lists(
    st.tuples(st.sampled_from(["system", "user", "assistant", "call"]), TEXT), max_size=4
).map(lambda turns: [m for kind, text in turns for m in _turn(kind, text)])


def _whole(formatter: ChatFormatter, messages: list[dict[str, Any]], tools: Any, gen: bool) -> Any:
    return formatter.encode(formatter.render(messages, tools, add_generation_prompt=gen))


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    house=TEXT,
    tools=st.lists(TOOL, max_size=2),
    first=SUFFIX,
    second=SUFFIX,
    user=TEXT,
    gen=st.booleans(),
)
def test_cached_house_gives_the_tokens_of_the_whole_prompt(
    formatter: ChatFormatter,
    house: str,
    tools: list[dict[str, Any]],
    first: list[dict[str, Any]],
    second: list[dict[str, Any]],
    user: str,
    gen: bool,
) -> None:
    encoder = PromptEncoder(formatter)
    system = {"role": "system", "content": house}
    for rest in (first, second, [*first, {"role": "user", "content": user}]):
        messages = [system, *rest]
        got = encoder.encode(messages, tools or None, add_generation_prompt=gen)
        assert got == _whole(formatter, messages, tools or None, gen)


HOUSE = [{"role": "system", "content": "You control a house.\nLights: Kitchen, Hall."}]
TOOLS = [
    {
        "type": "function",
        "function": {"name": "HassTurnOn", "parameters": {"type": "object", "properties": {}}},
    }
]


def _request(*turns: str) -> list[dict[str, Any]]:
    return [*HOUSE, {"role": "system", "content": "Area: Kitchen"}] + [
        {"role": "user", "content": t} for t in turns
    ]


def test_warm_requests_reuse_the_house_tokens(formatter: ChatFormatter) -> None:
    """Not a vacuous property: where the system message leads the prompt, it is reused."""
    encoder = PromptEncoder(formatter)
    encoder.encode(_request("turn on the light"), TOOLS, add_generation_prompt=True)
    assert (encoder.hits, encoder.misses) == (0, 1)
    got = encoder.encode(_request("and the hall"), TOOLS, add_generation_prompt=True)
    assert got == _whole(formatter, _request("and the hall"), TOOLS, True)
    assert encoder.hits == 1
    if formatter.template == MISTRAL_TEMPLATE:
        # Mistral moves the system message into the last user turn: only <s> is reused.
        assert encoder.reused_tokens == 1
    else:
        assert encoder.reused_tokens > len(formatter.encode(HOUSE[0]["content"]))


def test_a_known_house_is_not_rendered_again_where_the_template_takes_it(
    formatter: ChatFormatter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hearth's template writes the house part's text it rendered before in place of
    the first message and the tools (``hearth_house``): a warm request renders neither
    again, and its tokens are the whole prompt's. Other templates render them."""
    encoder = PromptEncoder(formatter)
    encoder.encode(_request("turn on the light"), TOOLS, add_generation_prompt=True)
    houses: list[str | None] = []
    render = formatter.render

    def spy(*args: Any, **kwargs: Any) -> str:
        houses.append(kwargs.get("house"))
        return render(*args, **kwargs)

    monkeypatch.setattr(formatter, "render", spy)
    got = encoder.encode(_request("and the hall"), TOOLS, add_generation_prompt=True)
    monkeypatch.undo()
    assert got == _whole(formatter, _request("and the hall"), TOOLS, True)
    takes = formatter.template == HERMES_CHATML_TEMPLATE
    assert houses == [
        formatter.render(HOUSE, TOOLS, add_generation_prompt=False) if takes else None
    ]


def test_a_pin_warms_the_cache_for_requests(tiny_tokenizer: Any) -> None:
    formatter = ChatFormatter(tiny_tokenizer)
    encoder = PromptEncoder(formatter)
    pin = encoder.encode(HOUSE, TOOLS, add_generation_prompt=False)
    got = encoder.encode(_request("hi"), TOOLS, add_generation_prompt=True)
    assert encoder.hits == 1
    assert got[: len(pin)] == pin
    assert got == _whole(formatter, _request("hi"), TOOLS, True)


def test_a_changed_house_or_tool_is_a_miss_and_the_cache_is_bounded(tiny_tokenizer: Any) -> None:
    encoder = PromptEncoder(ChatFormatter(tiny_tokenizer), capacity=2)
    other_tools = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "name": "HassTurnOff"}}]
    other_house = [{"role": "system", "content": "Another house."}]
    for house, tools in ((HOUSE, TOOLS), (HOUSE, other_tools), (other_house, TOOLS)):
        encoder.encode(
            [*house, {"role": "user", "content": "hi"}], tools, add_generation_prompt=True
        )
    assert (encoder.hits, encoder.misses) == (0, 3)
    # The first house part was evicted (capacity 2), the last one is still there.
    encoder.encode(
        [*other_house, {"role": "user", "content": "x"}], TOOLS, add_generation_prompt=True
    )
    encoder.encode([*HOUSE, {"role": "user", "content": "x"}], TOOLS, add_generation_prompt=True)
    assert (encoder.hits, encoder.misses) == (1, 4)


def test_no_cut_after_a_token_that_eats_the_following_whitespace(tiny_tokenizer: Any) -> None:
    tok = copy.deepcopy(tiny_tokenizer)
    tok.add_special_tokens(
        {
            "additional_special_tokens": [
                AddedToken("<|sep|>", special=True, normalized=False, rstrip=True)
            ]
        }
    )
    encoder = PromptEncoder(ChatFormatter(tok))
    text = "<|im_start|>system\nhouse<|im_end|>\nmore<|sep|>  tail"
    assert encoder.safe_cut(text) == text.index("\nmore")


def test_no_cut_where_a_longer_added_token_could_start(tiny_tokenizer: Any) -> None:
    tok = copy.deepcopy(tiny_tokenizer)
    tok.add_special_tokens(
        {"additional_special_tokens": [AddedToken("<|im_end|>!!", special=True, normalized=False)]}
    )
    encoder = PromptEncoder(ChatFormatter(tok))
    assert encoder.safe_cut("<|im_start|>a<|im_end|>") == len("<|im_start|>")
