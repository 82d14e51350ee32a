"""A small deterministic text corpus for training the test tokenizer and model.

No data set or hub is available, so the text is generated from a word list that looks
like what a Home Assistant prompt contains: entity names, areas, JSON tool schemas and
chat markup. The same seed always gives the same text, hence the same tokenizer.
"""

from __future__ import annotations

import json
import random

AREAS = [
    "Kitchen", "Living Room", "Bedroom", "Bathroom", "Office", "Garage", "Hallway",
    "Garden", "Dining Room", "Kids Room", "Basement", "Attic", "Porch", "Laundry",
]  # fmt: skip
DEVICES = [
    "Light", "Lamp", "Ceiling Light", "Switch", "Plug", "Fan", "Heater", "Thermostat",
    "Blinds", "Curtain", "Shutter", "Lock", "Door", "Window", "Speaker", "TV",
    "Temperature", "Humidity", "Motion", "Power", "Energy", "Battery", "Sensor",
]  # fmt: skip
DOMAINS = [
    "light", "switch", "cover", "climate", "sensor", "binary_sensor", "media_player",
    "lock", "fan", "scene", "script", "button", "input_boolean", "todo", "timer",
]  # fmt: skip
WORDS = (  # noqa: SIM905 - a word list reads best as text
    "the a an and or of to in on at for with from by is are was be it this that you "
    "your my our can will would should please turn set open close lock unlock start "
    "stop pause play what when where which how many much is there any all every some "
    "temperature degrees percent brightness color volume level state status on off "
    "home away night morning evening today tomorrow time date weather forecast list "
    "add remove item shopping groceries timer minutes seconds hours call function tool "
    "name arguments description parameters type object string number integer boolean "
    "required properties enum area floor domain device entity alias aliases answer "
    "questions about the world truthfully smart home assistant control devices current "
    "live context static names areas exposed entities only respond short sentence "
    "user system assistant message content result success error failed done hello "
    "thanks okay yes no maybe help me need want like know think see look find get "
    "good bad big small hot cold warm cool bright dark loud quiet fast slow new old"
).split()
USER_PHRASES = [
    "turn on the {area} {device}", "turn off the {area} {device}",
    "what is the temperature in the {area}", "is the {area} {device} on",
    "set the {area} {device} to {n} percent", "open the {area} {device}",
    "close the {area} {device}", "lock the {area} door", "what time is it",
    "add {word} to my shopping list", "how many lights are on", "hello",
]  # fmt: skip


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(4, 14))]
    return " ".join(words).capitalize() + rng.choice([".", ".", "?", "!"])


def user_phrase(rng: random.Random) -> str:
    return rng.choice(USER_PHRASES).format(
        area=rng.choice(AREAS).lower(),
        device=rng.choice(DEVICES).lower(),
        n=rng.randint(0, 100),
        word=rng.choice(WORDS),
    )


def _entity_line(rng: random.Random) -> str:
    area = rng.choice(AREAS)
    device = rng.choice(DEVICES)
    domain = rng.choice(DOMAINS)
    entry = f"- names: {area} {device}\n  domain: {domain}\n  areas: {area}"
    if rng.random() < 0.3:
        entry = f"- names: {area} {device}, {rng.choice(WORDS)} {device.lower()}\n" + entry[2:]
    return entry


def tool_json(rng: random.Random) -> str:
    name = "Hass" + rng.choice(["TurnOn", "TurnOff", "LightSet", "GetState", "ListAddItem"])
    props = {
        key: {"type": rng.choice(["string", "integer", "number", "boolean"])}
        for key in rng.sample(["name", "area", "floor", "domain", "device_class", "brightness"], 3)
    }
    fn = {
        "name": name,
        "description": _sentence(rng),
        "parameters": {"type": "object", "properties": props, "required": []},
    }
    return json.dumps({"type": "function", "function": fn})


def _tool_call(rng: random.Random) -> str:
    args = {"name": f"{rng.choice(AREAS)} {rng.choice(DEVICES)}"}
    call = {"name": "Hass" + rng.choice(["TurnOn", "TurnOff"]), "arguments": args}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


def corpus_lines(seed: int = 0, n: int = 6000) -> list[str]:
    """Return ``n`` lines of synthetic prompt-like text."""
    rng = random.Random(seed)
    makers = [_sentence, user_phrase, _entity_line, tool_json, _tool_call]
    lines = [rng.choice(makers)(rng) for _ in range(n)]
    lines.extend(str(i) for i in range(1000))
    return lines


def filler_text(rng: random.Random, n_lines: int) -> str:
    """Prompt-like text of roughly ``n_lines`` lines (for training the tool model)."""
    makers = [_sentence, _entity_line, tool_json]
    return "\n".join(rng.choice(makers)(rng) for _ in range(n_lines))
