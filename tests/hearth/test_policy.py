"""The turn policy (turn/decide.py): what each request of a turn carries. Pure."""

from __future__ import annotations

from typing import Any

import pytest

from custom_components.hearth.turn.decide import (
    MAX_REQUESTS,
    Capabilities,
    Options,
    decide,
)
from custom_components.hearth.turn.refusal import Refusal
from custom_components.hearth.turn.understand import Request

LIVE = "GetLiveContext"


def tool(name: str, *arguments: str) -> dict[str, Any]:
    properties = {arg: {"type": "string"} for arg in arguments}
    return {
        "type": "function",
        "function": {"name": name, "parameters": {"properties": properties}},
    }


TOOLS = [
    tool(LIVE, "name", "area", "domain"),
    tool("HassTurnOn", "name", "area", "floor", "domain"),
    tool("HassTurnOff", "name", "area", "floor", "domain"),
    tool("HassSetPosition", "name", "area", "position"),
    tool("HassStartTimer", "minutes"),
]
DOMAINS = {"HassSetPosition": frozenset({"cover", "valve"})}
HEARTH = Capabilities.of(True)
OTHER = Capabilities.of(False)
VALUES = {
    "argument_values": {"name": ["Kitchen Light", "Thermostat"], "area": ["Kitchen"]},
    "argument_tools": ["HassTurnOn", "HassTurnOff", LIVE],
}


def policy(request: Request, caps: Capabilities = HEARTH, **options: bool) -> Any:
    return decide(
        request,
        TOOLS,
        Options(**options),
        caps,
        live_tool=LIVE,
        tool_domains=DOMAINS,
        values=VALUES,
        names_by_domain={"light": ["Kitchen Light"], "climate": ["Thermostat"]},
    )


def test_a_question_about_the_house_reads_it_first() -> None:
    asked = policy(
        Request("is the kitchen light on?", question=True, named=frozenset({"kitchen light"}))
    )
    assert asked.read_first
    assert asked.tool_choice(0, True) == {"type": "function", "function": {"name": LIVE}}
    # "Are the lights on?" names a kind of thing of the house.
    assert policy(
        Request("are the lights on?", question=True, about=frozenset({"light"}))
    ).read_first


READS = {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
    {"type": "function", "function": {"name": LIVE}}]}}  # fmt: skip


@pytest.mark.parametrize("text", ["tell me a joke", "what is the capital of France?"])
def test_a_question_about_nothing_here_reads_nothing(text: str) -> None:
    asked = policy(Request(text, question=True))
    assert not asked.read_first
    assert asked.tool_choice(0, True) == READS  # words, or a read: never an action
    assert not asked.command
    assert policy(Request(text, question=True), OTHER).tool_choice(0, True) is None


def test_read_first_can_be_turned_off() -> None:
    asked = policy(
        Request("is it on?", question=True, named=frozenset({"kitchen"})), read_first=False
    )
    assert asked.tool_choice(0, True) == READS


def test_a_question_never_acts() -> None:
    """After its read, a question's requests may call only the tools that read (or
    answer in words): asked how warm it was outside, the small model set a thermostat.
    A command's later requests are the server's default; the last speaks."""
    asked = policy(
        Request("is the kitchen light on?", question=True, named=frozenset({"kitchen light"}))
    )
    assert [asked.tool_choice(i, True) for i in range(MAX_REQUESTS)] == [
        {"type": "function", "function": {"name": LIVE}},
        READS,
        "none",
    ]
    told = policy(Request("turn on the kitchen light", question=False, about=frozenset({"light"})))
    assert told.tool_choice(1, True) is None


def test_a_command_naming_the_house_must_call_a_tool() -> None:
    """Any language: what it names decides, not its words."""
    said = policy(
        Request("Schalte das Küchenlicht ein", question=False, named=frozenset({"küche"}))
    )
    assert said.command
    assert said.tool_choice(0, True) == "required"
    # Another server does not constrain forced calls: the model may still answer.
    assert (
        policy(Request("x", question=False, named=frozenset({"küche"})), OTHER).tool_choice(0, True)
        is None
    )


def test_a_command_may_call_only_the_tools_that_act_on_what_it_names() -> None:
    said = policy(Request("turn on the kitchen light", question=False, about=frozenset({"light"})))
    choice = said.tool_choice(0, True)
    assert choice["type"] == "allowed_tools"
    names = [t["function"]["name"] for t in choice["allowed_tools"]["tools"]]
    assert "HassSetPosition" not in names and "HassTurnOn" in names
    # ... and its on/off calls name only lights; other tools keep the house's values.
    values = said.values["argument_values"]
    assert values["HassTurnOn.name"] == values["HassTurnOff.name"] == ["Kitchen Light"]
    assert values["name"] == ["Kitchen Light", "Thermostat"]


def test_a_command_a_template_reads_may_call_only_its_intent() -> None:
    """HA's template reads "lock the front door" as HassTurnOn: the small model, free
    to pick among the tools for locks, unlocked it."""
    about = frozenset({"lock"})
    said = policy(Request("lock the door", question=False, about=about, intent="HassTurnOn"))
    choice = said.tool_choice(0, True)
    assert [t["function"]["name"] for t in choice["allowed_tools"]["tools"]] == ["HassTurnOn"]
    assert said.allowed == ["HassTurnOn"]
    # No template read it: the tools for what it names, as before.
    free = policy(Request("lock the door", question=False, about=about))
    assert "HassTurnOff" in free.allowed
    # The intent is not offered: left to the domains.
    other = policy(Request("lock the door", question=False, about=about, intent="HassLock"))
    assert other.allowed == free.allowed
    # A question, or another server, is not narrowed.
    asked = Request("is the door locked", question=True, about=about, intent="HassTurnOn")
    assert policy(asked).allowed is None
    assert (
        policy(Request("x", question=False, about=about, intent="HassTurnOn"), OTHER).allowed
        is None
    )


def test_the_call_names_what_the_template_read() -> None:
    """HA's template read the office's lights by area: the call may not name one."""
    slots = {"area": "Kitchen", "domain": "light"}
    asked = Request("all the lights in the kitchen off", question=False,
                    about=frozenset({"light"}), intent="HassTurnOff", slots=slots)  # fmt: skip
    values = policy(asked).values["argument_values"]
    assert values["HassTurnOff.area"] == ["Kitchen"]
    assert values["HassTurnOff.name"] == values["HassTurnOff.floor"] == []
    assert values["HassTurnOff.domain"] == ["light"]
    assert values["HassTurnOn.name"] == ["Kitchen Light"]  # other tools as before
    # What it read is required (no name and no area: every light of the house).
    assert policy(asked).values["required_arguments"] == ["HassTurnOff.area"]
    curtains = {"area": "Kitchen", "domain": "cover", "device_class": "curtain"}
    covers = frozenset({"cover"})
    opened = policy(Request("open the kitchen curtains", question=False, about=covers,
                            intent="HassTurnOn", slots=curtains))  # fmt: skip
    assert opened.values["argument_values"]["HassTurnOn.device_class"] == ["curtain"]
    # By name: that name, no area.
    named = policy(Request("lock the door", question=False, about=frozenset({"lock"}),
                           intent="HassTurnOn", slots={"name": "Front Door"}))  # fmt: skip
    assert named.values["argument_values"]["HassTurnOn.name"] == ["Front Door"]
    assert named.values["argument_values"]["HassTurnOn.area"] == []
    # The speaking device's area (read as ""): left to the model.
    here = policy(Request("lights off", question=False, about=frozenset({"light"}),
                          intent="HassTurnOff", slots={"area": "", "domain": "light"}))  # fmt: skip
    assert "HassTurnOff.area" not in here.values["argument_values"]
    assert here.values["required_arguments"] == []
    assert here.values["argument_values"]["HassTurnOff.name"] == []
    # No template read it: nothing of the kind.
    free = policy(Request("lock the door", question=False, about=frozenset({"lock"})))
    assert "HassTurnOn.area" not in free.values["argument_values"]


def test_a_request_that_says_a_name_may_name_only_what_it_says() -> None:
    """A small model copies the name of its example (asked what the living room
    thermostat was set to, it read the bedroom's): the grammar keeps the said one."""
    asked = Request(
        "what is the thermostat set to?",
        question=True,
        named=frozenset({"thermostat"}),
        about=frozenset({"climate"}),
        things=frozenset({"thermostat"}),
    )
    said = policy(asked)
    assert said.read_first
    assert said.values["argument_values"]["name"] == ["Thermostat"]
    assert said.values["argument_values"]["area"] == ["Kitchen"]  # areas are left alone
    # A name no list holds (a sensor, where the lists hold lights) leaves them whole.
    other = policy(Request("is the porch sensor on?", question=True, things=frozenset({"porch"})))
    assert other.values["argument_values"]["name"] == ["Kitchen Light", "Thermostat"]
    # Nothing said by name: the house's values.
    assert policy(Request("hello", question=False)).values == VALUES


def test_a_first_spoken_turn_may_name_only_what_shares_a_word_with_it() -> None:
    """A call by a name that shares no word with the request is refused in a spoken
    first turn (turn.Turn.refusal): asked to turn off the TV, the small model named a
    speaker, was refused and said it did not understand. The grammar offers only the
    names the refusal lets through; reading stays free."""
    light = policy(Request("switch the light off", question=False,
                           worded=frozenset({"kitchen light"})))  # fmt: skip
    listed = light.values["argument_values"]
    assert listed["HassTurnOn.name"] == listed["HassTurnOff.name"] == ["Kitchen Light"]
    assert listed["name"] == ["Kitchen Light", "Thermostat"]  # the live-context filter
    # Nothing shares a word: the names stay (the refusal then says "Sorry, I couldn't
    # understand that"); with none to give, the model turned off a whole room.
    heating = policy(Request("turn off the heating", question=False, worded=frozenset()))
    assert heating.values == VALUES
    # A follow-up ("turn it off") or an AI Task: any name (worded is None).
    assert policy(Request("turn it off", question=False)).values == VALUES


def test_a_question_a_template_reads_reads_only_what_it_read() -> None:
    """HA's live-context tool filters by name, area and domain: a question a template
    read ("which lights are on in the kitchen") reads that area's lights, not the
    whole house (the model answered from the wrong entity) nor the one light of its
    example."""
    slots = {"area": "Kitchen", "domain": "light", "state": "on"}
    asked = Request("which lights are on in the kitchen?", question=True,
                    about=frozenset({"light"}), slots=slots)  # fmt: skip
    said = policy(asked)
    assert said.read_first and said.allowed is None
    values = said.values["argument_values"]
    assert values[f"{LIVE}.area"] == ["Kitchen"] and values[f"{LIVE}.domain"] == ["light"]
    assert values[f"{LIVE}.name"] == []
    assert said.values["required_arguments"] == [f"{LIVE}.area", f"{LIVE}.domain"]
    assert "HassTurnOn.area" not in values  # the other tools as before
    light = {"name": "Kitchen Light"}
    named = policy(Request("is the kitchen light on?", question=True,
                           named=frozenset({"kitchen light"}), slots=light))  # fmt: skip
    values = named.values["argument_values"]
    assert values[f"{LIVE}.name"] == ["Kitchen Light"] and values[f"{LIVE}.area"] == []
    assert values[f"{LIVE}.domain"] == []  # the kind is the thing's: not given
    assert named.values["required_arguments"] == [f"{LIVE}.name"]
    # An area alone (the temperature in the kitchen: a sensor among seven things there)
    # is left to the model.
    warm = policy(Request("how warm is the kitchen?", question=True, named=frozenset({"kitchen"}),
                          slots={"area": "Kitchen"}))  # fmt: skip
    assert f"{LIVE}.area" not in warm.values["argument_values"]
    # Nothing read (no template, or a name the house lacks), or read-first off: free.
    for free in (
        policy(Request("is it warm in the kitchen?", question=True, named=frozenset({"kitchen"}))),
        policy(asked, read_first=False),
    ):
        assert f"{LIVE}.area" not in free.values["argument_values"]


def test_other_servers_get_no_values_and_no_allowed_tools() -> None:
    said = policy(
        Request("turn on the kitchen light", question=False, about=frozenset({"light"})), OTHER
    )
    assert said.values is None
    assert said.allowed is None


def test_chat_is_left_alone_unless_tool_first() -> None:
    assert policy(Request("hello", question=False)).tool_choice(0, True) is None
    assert (
        policy(Request("hello", question=False), tool_first=True).tool_choice(0, True) == "required"
    )


def test_turns_are_bounded_and_the_last_request_speaks() -> None:
    said = policy(
        Request("turn on the kitchen light", question=False, named=frozenset({"kitchen light"}))
    )
    assert MAX_REQUESTS == said.max_requests == 3
    assert said.tool_choice(1, True) is None  # a retry after an error may call again
    assert said.tool_choice(2, True) == "none"
    assert said.tool_choice(0, False) is None  # no tools: no tool_choice


def test_a_refused_calls_retry_may_call_only_what_the_request_reads_as() -> None:
    """The guard refused the call for doing another thing than the request reads as
    (guard.Refusal.instead): the next request must call one of those intents' tools;
    never as the last request (it speaks), nor on a server that cannot narrow tools."""
    request = Request("close the garage", question=False, named=frozenset({"garage"}))
    said = policy(request)
    why = Refusal("not the light", ("HassTurnOff", "HassSetPosition"))
    retry = said.retry(TOOLS, [why], 0)
    assert retry is not None and retry.choice["allowed_tools"]["mode"] == "required"
    chosen = [t["function"]["name"] for t in retry.choice["allowed_tools"]["tools"]]
    assert chosen == ["HassTurnOff", "HassSetPosition"]  # in the offered tools' order
    assert retry.values == said.values  # nothing read of their arguments: the turn's values
    assert said.retry(TOOLS, [why], 1) is None  # the next one speaks
    assert said.retry(TOOLS, [Refusal("no idea")], 0) is None
    assert said.retry(TOOLS, [Refusal("a vacuum", ("HassVacuumStart",))], 0) is None  # not offered
    assert policy(request, OTHER).retry(TOOLS, [why], 0) is None


def test_a_retry_takes_only_the_argument_value_the_request_reads() -> None:
    """A call refused with the value the request reads for a word-valued argument of
    its intent (guard.Refusal.values; "ścisz telewizor": ``volume_step`` down), or
    with an argument it must give (the request names a thing, the call named none):
    the retry's grammar takes only that value there, and requires that argument,
    beside the turn's own values."""
    request = Request("close the garage", question=False, named=frozenset({"garage"}))
    said = policy(request)
    down = Refusal("not on", ("HassTurnOff",), (("HassTurnOff.domain", "cover"),))
    named = Refusal("names none", ("HassTurnOff",), required=("HassTurnOff.name",))
    retry = said.retry(TOOLS, [down, named], 0)
    assert retry is not None and retry.values is not None
    assert retry.values["argument_values"]["HassTurnOff.domain"] == ["cover"]
    assert "HassTurnOff.name" in retry.values["required_arguments"]
    for key, listed in (said.values or {}).get("argument_values", {}).items():
        assert retry.values["argument_values"][key] == listed  # the turn's, kept
    assert said.retry(TOOLS, [down], 1) is None
