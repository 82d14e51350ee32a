"""Scheduling policy (pure Python: no model)."""

from __future__ import annotations

from hearth_engine.scheduler import PIN_SHARE, Scheduler
from hearth_engine.sequence import Kind, Sequence, State


def _seq(kind: Kind, tokens: int) -> Sequence:
    return Sequence(kind, list(range(tokens)), "ns")


def test_a_pin_alone_gets_whole_chunks_and_yields_while_requests_run() -> None:
    scheduler = Scheduler(chunk_tokens=256)
    pin = _seq(Kind.PIN, 5000)
    scheduler.started(pin)
    assert scheduler.plan().chunk == 256
    request = _seq(Kind.GENERATE, 40)
    scheduler.started(request)
    request.kv_len = 40
    scheduler.prefilled(request)  # now decoding
    assert request.state is State.DECODING
    plan = scheduler.plan()
    assert plan.prefill is pin
    assert plan.chunk == 256 // PIN_SHARE
    scheduler.remove(request)
    assert scheduler.plan().chunk == 256


def test_a_request_prefill_goes_before_a_pin() -> None:
    scheduler = Scheduler(chunk_tokens=256)
    pin = _seq(Kind.PIN, 5000)
    request = _seq(Kind.GENERATE, 300)
    scheduler.started(pin)
    scheduler.started(request)
    plan = scheduler.plan()
    assert plan.prefill is request
    assert plan.chunk == 256
