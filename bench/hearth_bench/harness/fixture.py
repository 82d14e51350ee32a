"""The household fixture: the prompts the Hearth plugin sent for the demo house, as kept.

``bench/fixtures/household.json`` (capture.py writes it; ``household``, ``load``,
``decode``, ``quant`` and ``reply`` replay it): each agent's pinned prefixes and every chat
request as the suffix after its prefix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..house_scale import describe
from .stack import ROOT

FIXTURE = ROOT / "bench" / "fixtures" / "household.json"
CAPTURE_COMMAND = "scripts/bench household --capture"
FORMAT = 1


@dataclass(frozen=True)
class Prefix:
    """One pinned prefix of an agent: what ``PUT /v1/prefixes/{pin}`` carried."""

    label: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]

    def body(self) -> dict[str, Any]:
        return {"messages": self.messages, "tools": self.tools}


@dataclass(frozen=True)
class Agent:
    key: str  # "hearth" or "automation"
    entity_id: str
    pin: str
    prefixes: list[Prefix]  # [initial, after rename 1, after rename 2]


@dataclass(frozen=True)
class Sample:
    """A captured chat request, as the suffix after its agent's prefix."""

    role: str  # satellite_a, satellite_b, chat, automation
    agent: str
    prefix: int  # index into the agent's prefixes
    turn: int  # 1-based user turn of its conversation
    iteration: int  # 0 = first request of the turn, then one per tool round
    suffix: list[dict[str, Any]]
    options: dict[str, Any]  # the other body fields (stream, max_tokens, temperature...)


@dataclass(frozen=True)
class Fixture:
    meta: dict[str, Any]
    agents: dict[str, Agent]
    samples: list[Sample]

    def of_role(self, role: str) -> list[Sample]:
        return [s for s in self.samples if s.role == role]

    def body(self, sample: Sample, version: int | None = None) -> dict[str, Any]:
        """The request body of ``sample`` with prefix ``version`` (default: as captured)."""
        prefix = self.agents[sample.agent].prefixes[sample.prefix if version is None else version]
        return {
            **sample.options,
            "messages": [*prefix.messages, *sample.suffix],
            "tools": prefix.tools,
        }


class FixtureMissingError(RuntimeError):
    pass


def load_fixture(path: Path = FIXTURE) -> Fixture:
    """Read the fixture; a clear message (with the capture command) if it is missing."""
    if not path.exists():
        raise FixtureMissingError(
            f"household fixture not found: {path}. Capture it with `{CAPTURE_COMMAND}`"
            " (starts the tiny-tools engine and Home Assistant; about a minute)."
        )
    data = json.loads(path.read_text())
    if data.get("format") != FORMAT:
        raise FixtureMissingError(
            f"{path} has format {data.get('format')}, expected {FORMAT}:"
            f" capture it again with `{CAPTURE_COMMAND}`"
        )
    return fixture_from_dict(data)


def fixture_from_dict(data: dict[str, Any]) -> Fixture:
    agents = {
        key: Agent(
            key=key,
            entity_id=a["entity_id"],
            pin=a["pin"],
            prefixes=[Prefix(p["label"], p["messages"], p["tools"]) for p in a["prefixes"]],
        )
        for key, a in data["agents"].items()
    }
    samples = [Sample(**s) for s in data["samples"]]
    return Fixture(meta=data["meta"], agents=agents, samples=samples)


def fixture_to_dict(fixture: Fixture) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "meta": fixture.meta,
        "agents": {
            key: {
                "entity_id": a.entity_id,
                "pin": a.pin,
                "prefixes": [
                    {"label": p.label, "messages": p.messages, "tools": p.tools} for p in a.prefixes
                ],
            }
            for key, a in fixture.agents.items()
        },
        "samples": [s.__dict__ for s in fixture.samples],
    }


def write_fixture(fixture: Fixture, path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(fixture_to_dict(fixture), indent=1, ensure_ascii=False) + "\n"
    path.write_text(text)
    return len(text.encode())


def summary(fixture: Fixture) -> str:
    roles: dict[str, int] = {}
    for sample in fixture.samples:
        roles[sample.role] = roles.get(sample.role, 0) + 1
    versions = {k: len(a.prefixes) for k, a in fixture.agents.items()}
    house = house_of(fixture)
    return f"{house}; agents {versions} (prefix versions), samples {roles}"


def house_of(fixture: Fixture) -> str:
    """The house a fixture was captured from, in one line (older ones do not say)."""
    meta = fixture.meta
    return describe(int(meta.get("house_scale") or 0), meta.get("exposed_entities"))
