"""The grammar layer (``hearth_engine.constraints``) with the tiny tokenizer: which replies
a request's grammar lets through, token by token, through the engine's ``Masker``."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoTokenizer

from hearth_engine.chat.formatter import ChatFormatter, ToolFormat
from hearth_engine.constraints.compiler import MAX_RUNAWAYS, ConstraintCompiler
from hearth_engine.constraints.grammar import (
    ConstraintRequest,
    GrammarError,
    bound_enum_arrays,
    build_grammar,
    narrow_schema,
    tool_aliases,
)
from hearth_engine.constraints.limits import GrammarLimits
from hearth_engine.constraints.mask import Constraint, Masker, apply_numpy
from hearth_engine.model.prepare.tiny import prepare_tiny_model

pytest.importorskip("llguidance")

LIGHT_ARGS = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "domain": {"type": "array", "items": {"type": "string"}},
        "brightness": {"type": "integer", "minimum": 0, "maximum": 100},
    },
    "required": ["name"],
    "additionalProperties": False,
}
TOOLS = (
    {"type": "function", "function": {"name": "HassTurnOn", "parameters": LIGHT_ARGS}},
    {
        "type": "function",
        "function": {
            "name": "HassSetMode",
            "parameters": {
                "type": "object",
                "properties": {"mode": {"type": "string", "enum": ["eco", "comfort"]}},
                "required": ["mode"],
                "additionalProperties": False,
            },
        },
    },
)


def call(name: str, args: dict[str, Any]) -> str:
    body = json.dumps({"name": name, "arguments": args})
    return f"<tool_call>\n{body}\n</tool_call>"


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(prepare_tiny_model())


@pytest.fixture(scope="module")
def compiler(tokenizer: Any) -> ConstraintCompiler:
    return ConstraintCompiler(
        tokenizer, len(tokenizer), [tokenizer.eos_token_id], ToolFormat.HERMES
    )


def walk(tokenizer: Any, constraint: Constraint, text: str) -> tuple[bool, bool]:
    """Feed ``text``'s tokens through the masks: (all allowed, end of reply allowed after)."""
    masker = Masker(len(tokenizer))
    for token in tokenizer(text, add_special_tokens=False)["input_ids"]:
        logits = torch.zeros(len(tokenizer))
        masker.apply(logits, [constraint])
        if logits[token] == float("-inf"):
            return False, False
        constraint.advance(token)
    logits = torch.zeros(len(tokenizer))
    masker.apply(logits, [constraint])
    return True, bool(logits[tokenizer.eos_token_id] == 0)


def allows(tokenizer: Any, compiler: ConstraintCompiler, req: ConstraintRequest, text: str) -> bool:
    """Whether ``text`` is a whole reply the grammar accepts (after the forced prefix)."""
    forced = ChatFormatter(tokenizer).forced_prefix(req.tool_choice) if req.tools else ""
    constraint = compiler.start(req, forced)
    assert constraint is not None
    if not text.startswith(forced):
        return False
    ok, can_end = walk(tokenizer, constraint, text[len(forced) :])
    return ok and can_end


ON = call("HassTurnOn", {"name": "Kitchen Light", "brightness": 40})
# OpenAI's allowed_tools: only HassSetMode may be called, though both are shown.
ALLOW_MODE_AUTO = {
    "type": "allowed_tools",
    "allowed_tools": {"mode": "auto", "tools": [{"type": "function",
                                                  "function": {"name": "HassSetMode"}}]},
}  # fmt: skip
MODE = call("HassSetMode", {"mode": "eco"})


@pytest.mark.parametrize(
    ("choice", "text", "expected"),
    [
        ("auto", "The light is on.", True),
        ("auto", ON, True),
        ("auto", f"{ON}\n{MODE}", True),
        ("auto", "Sure: <tool_call>", False),  # markup is never plain text
        ("auto", "<tool_response>ok</tool_response>", False),
        ("auto", "<tool_response2>ok", False),  # what the default model tried instead
        ("auto", "Use the tool_call API: x < y", True),
        ("auto", '{"name": "HassTurnOn", "arguments": {}}', False),  # a call without markup
        ("auto", ' [{"name": "HassTurnOn"}]', False),
        ("none", '{"name": "HassTurnOn"}', False),
        ("auto", "Done: {braces} inside text are fine.", True),
        ("auto", 'Sure! {"name": "HassTurnOn", "arguments": {}}', False),  # after prose
        ("auto", 'The switch called "name" is on.', True),
        ("auto", call("HassCatchLights", {}), False),  # not an offered tool
        ("auto", call("HassTurnOn", {"brightness": 40}), False),  # required key missing
        ("auto", call("HassTurnOn", {"name": "x", "brightness": 400}), False),  # range
        ("auto", call("HassTurnOn", {"name": 3}), False),  # type
        ("auto", call("HassTurnOn", {"name": "x", "color": "red"}), False),  # extra key
        ("auto", call("HassSetMode", {"mode": "turbo"}), False),  # enum
        ("required", ON, True),
        ("required", "The light is on.", False),
        ("none", "The light is on.", True),
        ("none", ON, False),
        ({"type": "function", "function": {"name": "HassSetMode"}}, MODE, True),
        ({"type": "function", "function": {"name": "HassSetMode"}}, ON, False),
        ({"type": "function", "function": {"name": "HassSetMode"}}, f"{MODE}\n{MODE}", False),
        (ALLOW_MODE_AUTO, MODE, True),
        (ALLOW_MODE_AUTO, f"{MODE}\n{MODE}", True),
        (ALLOW_MODE_AUTO, "The mode is eco.", True),
        (ALLOW_MODE_AUTO, ON, False),  # shown, but not allowed
        ({**ALLOW_MODE_AUTO, "allowed_tools": {**ALLOW_MODE_AUTO["allowed_tools"],
                                               "mode": "required"}}, MODE, True),
        ({**ALLOW_MODE_AUTO, "allowed_tools": {**ALLOW_MODE_AUTO["allowed_tools"],
                                               "mode": "required"}}, "The mode is eco.", False),
    ],
)  # fmt: skip
def test_tool_grammar(
    tokenizer: Any, compiler: ConstraintCompiler, choice: Any, text: str, expected: bool
) -> None:
    req = ConstraintRequest(tools=TOOLS, tool_choice=choice)
    assert allows(tokenizer, compiler, req, text) is expected


def test_one_call_when_parallel_calls_are_off(tokenizer: Any, compiler: ConstraintCompiler) -> None:
    req = ConstraintRequest(tools=TOOLS, tool_choice="auto", parallel_tool_calls=False)
    assert allows(tokenizer, compiler, req, ON)
    assert not allows(tokenizer, compiler, req, f"{ON}\n{MODE}")
    # After the call closes only the end can follow: the engine stops right there.
    constraint = compiler.start(req, "")
    assert constraint is not None
    assert walk(tokenizer, constraint, ON) == (True, True)
    assert constraint.done


def test_house_values_narrow_string_arguments(tokenizer: Any, compiler: ConstraintCompiler) -> None:
    values = {"name": ["Kitchen Light", "Porch"], "domain": ["light"]}
    req = ConstraintRequest(tools=TOOLS, tool_choice="required", argument_values=values)
    ok = call("HassTurnOn", {"name": "Porch", "domain": ["light"]})
    assert allows(tokenizer, compiler, req, ok)
    assert not allows(tokenizer, compiler, req, call("HassTurnOn", {"name": "Garage"}))
    bad_domain = call("HassTurnOn", {"name": "Porch", "domain": ["switch"]})
    assert not allows(tokenizer, compiler, req, bad_domain)
    # Arguments of other names (the enum of HassSetMode) are left alone.
    assert allows(tokenizer, compiler, req, MODE)


def test_house_values_can_be_scoped_to_one_tool(
    tokenizer: Any, compiler: ConstraintCompiler
) -> None:
    """``Tool.arg`` narrows one tool only: ``name`` is an entity in HassTurnOn but a free
    timer name in a timer tool."""
    timer = {
        "type": "function",
        "function": {
            "name": "HassStartTimer",
            "parameters": {
                "type": "object",
                "properties": {"name": {"type": "string"}},
                "required": ["name"],
                "additionalProperties": False,
            },
        },
    }
    values = {"HassTurnOn.name": ["Porch"], "domain": ["light"]}
    req = ConstraintRequest(tools=(*TOOLS, timer), tool_choice="required", argument_values=values)
    assert allows(tokenizer, compiler, req, call("HassTurnOn", {"name": "Porch"}))
    assert not allows(tokenizer, compiler, req, call("HassTurnOn", {"name": "Garage"}))
    assert allows(tokenizer, compiler, req, call("HassStartTimer", {"name": "pasta"}))


def test_bare_house_values_can_be_limited_to_some_tools(
    tokenizer: Any, compiler: ConstraintCompiler
) -> None:
    """``argument_tools`` says which tools bare keys narrow (the entity tools)."""
    renamed = {"type": "function", "function": {**TOOLS[0]["function"], "name": "HassTurnOff"}}
    req = ConstraintRequest(
        tools=(*TOOLS, renamed),
        tool_choice="required",
        argument_values={"name": ["Porch"]},
        argument_tools=("HassTurnOn",),
    )
    assert not allows(tokenizer, compiler, req, call("HassTurnOn", {"name": "Garage"}))
    assert allows(tokenizer, compiler, req, call("HassTurnOff", {"name": "Garage"}))


def test_narrowing_keeps_an_own_enum() -> None:
    schema = {
        "type": "object",
        "properties": {
            "domain": {"type": "array", "items": {"type": "string", "enum": ["light"]}},
            "area": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
            "name": {"type": "string", "enum": ["A", "B"]},
        },
    }
    out = narrow_schema(schema, {"domain": ["light", "switch"], "area": ["Kitchen"], "name": ["C"]})
    props = out["properties"]
    assert props["domain"]["items"]["enum"] == ["light"]
    # Listed strings: the alternative that takes no string is left out.
    assert props["area"]["anyOf"] == [{"type": "string", "enum": ["Kitchen"]}]
    assert props["name"]["enum"] == ["A", "B"]  # nothing in common: never widened
    assert schema["properties"]["area"] == {"anyOf": [{"type": "string"}, {"type": "integer"}]}


def test_a_word_value_narrows_an_argument_that_also_takes_a_number() -> None:
    """HA's relative volume takes "up", "down" or a step from -100 to 100: narrowed to
    "up" (what the request says), a call may give only "up", not a made-up step."""
    step = {"anyOf": [{"type": "string", "enum": ["up", "down"]}, {"type": "integer"}]}
    schema = {"type": "object", "properties": {"volume_step": step}}
    out = narrow_schema(schema, {"volume_step": ["up"]})
    assert out["properties"]["volume_step"] == {"anyOf": [{"type": "string", "enum": ["up"]}]}
    numbers = {"anyOf": [{"type": "integer"}, {"type": "number"}]}
    kept = narrow_schema({"type": "object", "properties": {"x": numbers}}, {"x": ["up"]})
    assert kept["properties"]["x"] == numbers  # nothing takes the value: never emptied


def test_an_empty_list_leaves_the_argument_out(
    tokenizer: Any, compiler: ConstraintCompiler
) -> None:
    """The lights of an area: a call that names one light acts on it alone."""
    open_args = {"type": "object", "properties": {"name": {"type": "string"},
                                                  "area": {"type": "string"}}}  # fmt: skip
    tools = tuple(
        {"type": "function", "function": {"name": name, "parameters": open_args}}
        for name in ("HassTurnOn", "HassTurnOff")
    )
    values = {"HassTurnOn.name": [], "HassTurnOn.area": ["Kitchen"]}
    req = ConstraintRequest(tools=tools, tool_choice="required", argument_values=values)
    assert allows(tokenizer, compiler, req, call("HassTurnOn", {"area": "Kitchen"}))
    assert not allows(tokenizer, compiler, req, call("HassTurnOn", {"name": "Garage"}))
    assert not allows(tokenizer, compiler, req, call("HassTurnOn", {"area": "Kitchen", "x": "y"}))
    assert allows(tokenizer, compiler, req, call("HassTurnOff", {"name": "Garage", "x": "y"}))
    # Left out with nothing required, the call would act on every light of the house:
    # the area it names is required.
    assert allows(tokenizer, compiler, req, call("HassTurnOn", {}))
    needs = ConstraintRequest(tools=tools, tool_choice="required", argument_values=values,
                              required_arguments=("HassTurnOn.area",))  # fmt: skip
    assert not allows(tokenizer, compiler, needs, call("HassTurnOn", {}))
    assert allows(tokenizer, compiler, needs, call("HassTurnOn", {"area": "Kitchen"}))
    assert allows(tokenizer, compiler, needs, call("HassTurnOff", {}))  # another tool
    # Without it, the same call may name a thing.
    free = ConstraintRequest(tools=tools, tool_choice="required")
    assert allows(tokenizer, compiler, free, call("HassTurnOn", {"name": "Garage"}))
    # A required argument is never left out: the tool could not be called.
    assert narrow_schema(LIGHT_ARGS, {"name": []}) == LIGHT_ARGS


def test_json_schema_response_format(tokenizer: Any, compiler: ConstraintCompiler) -> None:
    schema = {
        "type": "object",
        "properties": {"on": {"type": "boolean"}, "room": {"enum": ["kitchen", "hall"]}},
        "required": ["on", "room"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "state", "schema": schema}}
    req = ConstraintRequest(response_format=fmt)
    assert allows(tokenizer, compiler, req, '{"on": true, "room": "hall"}')
    assert not allows(tokenizer, compiler, req, '{"on": true}')
    assert not allows(tokenizer, compiler, req, "The light is on.")
    obj = ConstraintRequest(response_format={"type": "json_object"})
    assert allows(tokenizer, compiler, obj, '{"a": [1, 2]}')
    assert not allows(tokenizer, compiler, obj, "[1, 2]")


def test_grammar_is_compiled_once_per_tool_set(compiler: ConstraintCompiler) -> None:
    req = ConstraintRequest(tools=TOOLS, tool_choice="auto", argument_values={"name": ["Z"]})
    compiler.start(req)
    compiles = compiler.compiles
    for _ in range(3):
        compiler.start(req)
    assert compiler.compiles == compiles
    compiler.start(
        ConstraintRequest(tools=TOOLS, tool_choice="auto", argument_values={"name": ["Y"]})
    )
    assert compiler.compiles == compiles + 1


@pytest.mark.parametrize(
    ("parameters", "param"),
    [
        ({"type": "object", "properties": {"a": {"type": "strin"}}}, "tools.1.function.parameters"),
        (
            {"type": "object", "properties": {"a": {"$ref": "#/nope"}}},
            "tools.1.function.parameters",
        ),
    ],
)
def test_bad_schema_names_its_tool(
    compiler: ConstraintCompiler, parameters: dict[str, Any], param: str
) -> None:
    bad = {"type": "function", "function": {"name": "Broken", "parameters": parameters}}
    with pytest.raises(GrammarError) as err:
        compiler.start(ConstraintRequest(tools=(TOOLS[0], bad)))
    assert err.value.param == param
    assert str(err.value).startswith(param)


def test_unconstrained_requests_get_no_grammar(compiler: ConstraintCompiler) -> None:
    assert compiler.start(ConstraintRequest()) is None
    assert compiler.start(ConstraintRequest(response_format={"type": "text"})) is None


def test_other_tool_formats_leave_tools_unconstrained() -> None:
    req = ConstraintRequest(tools=TOOLS, tool_choice="auto")
    assert not req.needs_grammar(ToolFormat.LLAMA3)
    assert ConstraintRequest(tools=TOOLS, tool_choice="none").needs_grammar(ToolFormat.LLAMA3)
    assert "start: content" in build_grammar(req, ToolFormat.MISTRAL)


def test_masker_masks_only_constrained_rows(tokenizer: Any, compiler: ConstraintCompiler) -> None:
    req = ConstraintRequest(response_format={"type": "json_object"})
    constraint = compiler.start(req)
    logits = torch.zeros(3, len(tokenizer))
    Masker(len(tokenizer)).apply(logits, [None, constraint, None])
    assert bool((logits[0] == 0).all()) and bool((logits[2] == 0).all())
    allowed = torch.nonzero(logits[1] == 0).flatten().tolist()
    assert allowed and all(tokenizer.decode([t]).lstrip().startswith("{") for t in allowed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_numpy_and_torch_paths_mask_the_same(tokenizer: Any, dtype: torch.dtype) -> None:
    """The CPU (numpy) path and the accelerator (torch) path agree, bf16 logits too."""
    vocab = len(tokenizer) + 40  # a model's logits are often wider than its tokenizer
    wide = ConstraintCompiler(tokenizer, vocab, [tokenizer.eos_token_id], ToolFormat.HERMES)
    constraint = wide.start(ConstraintRequest(tools=TOOLS, tool_choice="required"))
    assert constraint is not None
    row = torch.zeros((1, (vocab + 31) // 32), dtype=torch.int32)
    constraint.fill(row[0])
    by_numpy = torch.zeros(2, vocab)
    apply_numpy(by_numpy, torch.cat([row, torch.full_like(row, -1)]))
    by_torch = torch.zeros(2, vocab, dtype=dtype)
    Masker(vocab)._apply_torch(by_torch, torch.cat([row, torch.full_like(row, -1)]))
    assert torch.equal(by_numpy.isinf(), by_torch.isinf())
    assert 0 < int((~by_numpy[0].isinf()).sum()) < len(tokenizer)
    assert not bool(by_numpy[1].isinf().any())
    assert bool(by_numpy[0, len(tokenizer) :].isinf().all())


def test_prefixed_tools_may_be_called_by_their_short_name(
    tokenizer: Any, compiler: ConstraintCompiler
) -> None:
    def tool(name: str) -> dict[str, Any]:
        return {"type": "function", "function": {"name": name, "parameters": LIGHT_ARGS}}

    tools = (tool("intent__HassTurnOn"), tool("a__Get"), tool("b__Get"), tool("Other"))
    assert tool_aliases(tools) == {"HassTurnOn": "intent__HassTurnOn"}  # "Get": ambiguous
    req = ConstraintRequest(tools=tools, tool_choice="required")
    for name, expected in (
        ("intent__HassTurnOn", True),
        ("HassTurnOn", True),
        ("a__Get", True),
        ("Get", False),
        ("HassTurnOff", False),
    ):
        assert allows(tokenizer, compiler, req, call(name, {"name": "x"})) is expected, name
    # Allowed tools keep the short names of every offered tool: "Get" names two tools,
    # so it stays out even where only one of them is allowed.
    only_a = {"type": "function", "function": {"name": "a__Get"}}
    allowed = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [only_a]}}
    req = ConstraintRequest(tools=tools, tool_choice=allowed)
    assert allows(tokenizer, compiler, req, call("a__Get", {"name": "x"}))
    assert not allows(tokenizer, compiler, req, call("Get", {"name": "x"}))
    assert not allows(tokenizer, compiler, req, call("HassTurnOn", {"name": "x"}))


def test_arrays_of_enum_values_do_not_repeat_forever(
    tokenizer: Any, compiler: ConstraintCompiler
) -> None:
    """The default model wrote ``"device_class": ["tv", "tv", "tv", ...`` to max_tokens."""
    args = {
        "type": "object",
        "properties": {
            "device_class": {
                "type": "array",
                "items": {"type": "string", "enum": ["tv", "speaker"]},
            }
        },
    }
    tools = ({"type": "function", "function": {"name": "Pause", "parameters": args}},)
    req = ConstraintRequest(tools=tools, tool_choice="required")
    assert allows(tokenizer, compiler, req, call("Pause", {"device_class": ["tv", "speaker"]}))
    assert not allows(tokenizer, compiler, req, call("Pause", {"device_class": ["tv"] * 3}))
    assert bound_enum_arrays(args)["properties"]["device_class"]["maxItems"] == 2
    assert "maxItems" not in args["properties"]["device_class"]  # the tool's own is untouched


# Grammar limits (issue 26): every bound is observed through its error, never a clock.
HOUSEHOLD = Path(__file__).parents[2] / "bench" / "fixtures" / "household.json"


def _broken(tag: str) -> dict[str, Any]:
    """A tool whose schema llguidance refuses (a unique description: a new grammar)."""
    params = {"type": "object", "properties": {"a": {"type": "strin"}}}
    return {"type": "function", "function": {"name": "Broken", "description": tag,
                                             "parameters": params}}  # fmt: skip


def _limited(tokenizer: Any, **limits: Any) -> ConstraintCompiler:
    return ConstraintCompiler(
        tokenizer,
        len(tokenizer),
        [tokenizer.eos_token_id],
        ToolFormat.HERMES,
        limits=GrammarLimits(**limits),
    )


def _json_reply(schema: dict[str, Any]) -> ConstraintRequest:
    return ConstraintRequest(
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    )


def test_a_failed_grammar_is_refused_from_the_cache(compiler: ConstraintCompiler) -> None:
    req = ConstraintRequest(tools=(TOOLS[0], _broken(uuid.uuid4().hex)))
    with pytest.raises(GrammarError) as first:
        compiler.start(req)
    failures, refusals, checks = compiler.failures, compiler.refusals, compiler.part_checks
    with pytest.raises(GrammarError) as again:
        compiler.start(req)
    assert (str(again.value), again.value.param) == (str(first.value), first.value.param)
    assert again.value.param == "tools.1.function.parameters"
    assert compiler.refusals == refusals + 1
    assert (compiler.failures, compiler.part_checks) == (failures, checks)  # nothing rebuilt


def test_blame_checks_each_tool_once(compiler: ConstraintCompiler) -> None:
    """Another grammar over the same broken tools (another tool_choice) blames the same
    tool without compiling each tool again."""
    tools = (TOOLS[0], TOOLS[1], _broken(uuid.uuid4().hex))
    with pytest.raises(GrammarError):
        compiler.start(ConstraintRequest(tools=tools, tool_choice="auto"))
    checks = compiler.part_checks
    with pytest.raises(GrammarError) as err:
        compiler.start(ConstraintRequest(tools=tools, tool_choice="required"))
    assert err.value.param == "tools.2.function.parameters"
    assert compiler.part_checks == checks


def test_a_slow_compile_is_refused_by_its_time_bound(tokenizer: Any) -> None:
    """2,000 optional properties take ~1 s to compile (quadratic in llguidance), far past
    a 10 ms bound: refused, naming the bound. The compile is not thrown away nor taken
    for a failure (on a busy machine a sound house grammar can be slow): the next request
    with that grammar waits for the same compile, and once it is done, gets it."""
    slow = _limited(tokenizer, compile_seconds=0.01)
    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(2000)}}
    with pytest.raises(GrammarError) as err:
        slow.start(_json_reply(schema))
    assert "compile_seconds" in str(err.value), err.value
    assert err.value.param == "response_format"
    assert (slow.timeouts, slow.compiles, slow.failures) == (1, 0, 0)
    deadline = time.monotonic() + 120
    while True:  # the same compile, awaited again and again, until it is done
        try:
            constraint = slow.start(_json_reply(schema))
            break
        except GrammarError as again:
            message = str(again)
        assert "compile_seconds" in message
        assert time.monotonic() < deadline, "the compile never finished"
        time.sleep(0.05)
    assert constraint is not None
    assert (slow.compiles, slow.failures, slow.refusals) == (1, 0, 0)
    assert slow.start(_json_reply(schema)) is not None
    assert slow.hits == 1


def test_slow_compiles_never_make_a_request_wait_for_others(tokenizer: Any) -> None:
    """While MAX_RUNAWAYS slow compiles run past their bound, a new grammar is refused at
    once (retry later) instead of waiting for them: no request waits on another's
    compile beyond its own bound. The refusal is not remembered as a failure."""
    slow = _limited(tokenizer, compile_seconds=0.01)

    def schema(n: int) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {f"q{n}_{i}": {"type": "integer"} for i in range(3000)},
        }

    for n in range(MAX_RUNAWAYS):
        with pytest.raises(GrammarError, match="compile_seconds"):
            slow.start(_json_reply(schema(n)))
    with pytest.raises(GrammarError, match="still compiling"):
        slow.start(_json_reply(schema(99)))
    assert slow.failures == 0
    assert slow.stats()["grammar_timeouts_total"] == MAX_RUNAWAYS + 1


@pytest.mark.parametrize(
    ("limit", "value"),
    [("max_grammar_size", 50), ("initial_lexer_fuel", 100), ("max_lexer_states", 10),
     ("max_grammar_chars", 100)],
)  # fmt: skip
def test_llguidance_limits_apply_and_are_named(tokenizer: Any, limit: str, value: int) -> None:
    limited = _limited(tokenizer, **{limit: value})
    with pytest.raises(GrammarError) as err:
        limited.start(ConstraintRequest(tools=TOOLS, tool_choice="auto"))
    assert f"limit {limit} = {value}" in str(err.value), err.value


def test_a_ref_to_itself_is_blamed_on_its_schema(compiler: ConstraintCompiler) -> None:
    schema = {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
    with pytest.raises(GrammarError) as err:
        compiler.start(_json_reply(schema))
    assert err.value.param == "response_format.json_schema.schema"
    assert "no finite value" in str(err.value), err.value


def test_the_household_grammar_fits_the_limits(
    tokenizer: Any, compiler: ConstraintCompiler
) -> None:
    """HA's 18 tools and 500 entity names compile under the default limits, and a call
    walks through the masks."""
    agent = json.loads(HOUSEHOLD.read_text())["agents"]["hearth"]
    tools = tuple(agent["prefixes"][0]["tools"])
    names = [f"Living room lamp {i}" for i in range(500)]
    req = ConstraintRequest(tools=tools, tool_choice="required", argument_values={"name": names})
    text = call("HassTurnOn", {"name": "Living room lamp 417"})
    assert allows(tokenizer, compiler, req, text)
    assert not allows(tokenizer, compiler, req, call("HassTurnOn", {"name": "Garage"}))
