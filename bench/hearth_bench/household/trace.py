"""The household's trace: which requests go out when, fixed by the seed."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

ROLES = ("satellite_a", "satellite_b", "chat", "automation")
ROLE_WEIGHTS = (0.3, 0.3, 0.25, 0.15)


@dataclass(frozen=True)
class Call:
    """One request of the trace: a role and a sample of it (for chat: the turn, 1-based)."""

    role: str
    sample: int


@dataclass(frozen=True)
class Step:
    kind: str  # request | burst | rename | states
    calls: tuple[Call, ...] = ()
    rename: int = 0  # 1-based rename number (the prefix version to switch to)
    state_changes: int = 0


def make_trace(
    seed: int, requests: int, pools: dict[str, int], chat_turns: int, renames: int
) -> list[Step]:
    """Steps run one after another; a burst's requests go out together."""
    rng = random.Random(seed)
    rename_at = [round(requests * (k + 1) / (renames + 1)) for k in range(renames)]
    steps: list[Step] = []
    sent = 0
    chat_turn = 0
    while sent < requests:
        if len(rename_at) > 0 and sent >= rename_at[0]:
            rename_at.pop(0)
            steps.append(Step("rename", rename=renames - len(rename_at)))
            continue
        if rng.random() < 0.5:
            steps.append(Step("states", state_changes=rng.randint(1, 8)))
        size = min(rng.randint(2, 4) if rng.random() < 0.3 else 1, requests - sent)
        roles = rng.sample(ROLES, size) if size > 1 else rng.choices(ROLES, ROLE_WEIGHTS)
        calls = []
        for role in roles:
            if role == "chat":
                chat_turn = chat_turn % chat_turns + 1
                calls.append(Call(role, chat_turn))
            else:
                calls.append(Call(role, rng.randrange(pools[role])))
        steps.append(Step("burst" if size > 1 else "request", tuple(calls)))
        sent += size
    return steps


def trace_summary(trace: Sequence[Step]) -> dict[str, Any]:
    calls = [c for s in trace for c in s.calls]
    return {
        "requests": len(calls),
        "by_role": {r: sum(c.role == r for c in calls) for r in ROLES},
        "bursts": sum(s.kind == "burst" for s in trace),
        "renames": sum(s.kind == "rename" for s in trace),
        "state_changes": sum(s.state_changes for s in trace),
    }
