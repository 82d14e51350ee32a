"""The committed household fixture is what the plugin sends today.

Re-captures it through a live stack (tiny-tools engine, recording proxy, the demo house in
a real Home Assistant) and compares it with ``bench/fixtures/household.json``: the pinned
prefixes must be identical byte for byte (nothing in them is volatile by design), and
the requests the same: for the first request of each captured turn, its role, agent,
prefix version and the context and user messages it carries (times and dates
normalized). Assistant and tool messages come from the model and HA's tool results, and
whether a turn takes a tool round depends on the model, so those are left out. So is
the thing a question's worked example asks about: it is the one whose live state shows
the most (hints.py), and the states are what the model's earlier calls made them (a
tiny-tools trained on another host acts otherwise); the example's tool stays.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from hearth_bench.harness.capture import capture_fixture
from hearth_bench.harness.fixture import CAPTURE_COMMAND, FIXTURE, Fixture, Sample, load_fixture
from hearth_bench.harness.stack import ROOT

pytestmark = pytest.mark.asyncio(loop_scope="module")

HINT_CALL_ID = "example_hint"  # custom_components/hearth/turn/hints.py (another venv: not imported)
STALE = f"the household fixture is stale: run `{CAPTURE_COMMAND}` and commit {FIXTURE.name}"
_TIME = re.compile(r"\b\d{1,2}:\d{2}(:\d{2})?\b")
_DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")


@pytest.fixture(scope="module")
def committed() -> Fixture:
    return load_fixture(FIXTURE)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fresh(tmp_path_factory: pytest.TempPathFactory) -> Fixture:
    workdir: Path = tmp_path_factory.mktemp("capture")
    return await capture_fixture(workdir)


def normalize(text: str) -> str:
    return _DATE.sub("<date>", _TIME.sub("<time>", text))


def example_tool(messages: list[dict[str, Any]], at: int) -> str | None:
    """The tool of the worked example whose request is ``messages[at]``, if it is one."""
    following = messages[at + 1] if at + 1 < len(messages) else {}
    calls = following.get("tool_calls") or []
    if calls and calls[0].get("id") == HINT_CALL_ID:
        return str(calls[0]["function"]["name"])
    return None


def sample_shape(sample: Sample) -> tuple[Any, ...]:
    said = []
    for at, m in enumerate(sample.suffix):
        if m["role"] not in ("system", "user"):
            continue
        tool = example_tool(sample.suffix, at)
        if tool is not None and tool.endswith("GetLiveContext"):
            said.append(("example", tool))
        else:
            said.append((m["role"], normalize(str(m.get("content") or ""))))
    return (sample.role, sample.agent, sample.prefix, sample.turn, tuple(said))


def shapes(fixture: Fixture) -> list[tuple[Any, ...]]:
    return [sample_shape(s) for s in fixture.samples if s.iteration == 0]


async def test_metadata_matches_the_house(committed: Fixture) -> None:
    house = hashlib.sha256((ROOT / "config" / "house.yaml").read_bytes()).hexdigest()
    assert committed.meta["house_yaml_sha256"] == house, STALE


async def test_prefixes_are_identical(fresh: Fixture, committed: Fixture) -> None:
    assert fresh.meta["ha_version"] == committed.meta["ha_version"], STALE
    assert sorted(fresh.agents) == sorted(committed.agents), STALE
    for key, agent in committed.agents.items():
        now = fresh.agents[key]
        assert [p.label for p in now.prefixes] == [p.label for p in agent.prefixes], STALE
        for old, new in zip(agent.prefixes, now.prefixes, strict=True):
            assert new.messages == old.messages, f"{key} {old.label}: {STALE}"
            assert new.tools == old.tools, f"{key} {old.label} (tools): {STALE}"


async def test_requests_have_the_same_shape(fresh: Fixture, committed: Fixture) -> None:
    assert shapes(fresh) == shapes(committed), STALE
