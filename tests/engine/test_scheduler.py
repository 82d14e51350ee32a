"""Scheduling policy (pure Python: no model)."""

from __future__ import annotations

from hearth_engine.serving.scheduler import MIX_MAX_TOKENS, PIN_SHARE, Scheduler, StepKind
from hearth_engine.serving.sequence import Kind, Sequence, State


def _seq(kind: Kind, tokens: int) -> Sequence:
    return Sequence(kind, list(range(tokens)), "ns")


def _start(scheduler: Scheduler, seq: Sequence) -> Sequence:
    scheduler.enqueue(seq)
    scheduler.start(seq)
    return seq


def test_a_pin_alone_gets_whole_chunks_and_yields_while_requests_run() -> None:
    scheduler = Scheduler(chunk_tokens=256)
    pin = _start(scheduler, _seq(Kind.PIN, 5000))
    assert scheduler.plan().chunk == 256
    request = _start(scheduler, _seq(Kind.GENERATE, 40))
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
    _start(scheduler, _seq(Kind.PIN, 5000))
    request = _start(scheduler, _seq(Kind.GENERATE, 300))
    plan = scheduler.plan()
    assert plan.prefill is request
    assert plan.chunk == 256


def test_a_pin_with_followers_keeps_whole_chunks() -> None:
    """Requests waiting for a warming pin are served by its prefill: do not shrink it."""
    scheduler = Scheduler(chunk_tokens=256)
    pin = _start(scheduler, _seq(Kind.PIN, 5000))
    for _ in range(9):
        scheduler.enqueue(_seq(Kind.GENERATE, 5100))  # followers stay in line
    pin.has_followers = True
    assert scheduler.plan().chunk == 256
    pin.has_followers = False
    assert scheduler.plan().chunk == 256 // PIN_SHARE


def test_admission_keeps_the_line_and_the_slots() -> None:
    scheduler = Scheduler(max_running=2)
    seqs = [_seq(Kind.GENERATE, 10) for _ in range(4)]
    for seq in seqs:
        scheduler.enqueue(seq)
    assert scheduler.admissible() == seqs
    scheduler.start(seqs[1])  # the engine may start a later one (an earlier one waits)
    scheduler.start(seqs[2])
    assert scheduler.admissible() == []  # no slot free
    assert list(scheduler.waiting) == [seqs[0], seqs[3]]
    scheduler.remove(seqs[1])
    assert scheduler.admissible() == [seqs[0], seqs[3]]


def _mixing(can_mix: bool = True) -> tuple[Scheduler, Sequence, Sequence]:
    """A scheduler with one decoding row and one prompt prefilling."""
    scheduler = Scheduler(chunk_tokens=256, can_mix=lambda: can_mix)
    row = _start(scheduler, _seq(Kind.GENERATE, 40))
    row.kv_len = 40
    scheduler.prefilled(row)
    row.generated = [7]  # one token to feed
    prompt = _start(scheduler, _seq(Kind.GENERATE, 300))
    return scheduler, row, prompt


def test_the_plan_says_mixed_where_the_runner_can_mix_a_short_chunk() -> None:
    scheduler, row, prompt = _mixing()
    plan = scheduler.plan()
    assert (plan.kind, plan.decode, plan.prefill, plan.chunk) == (
        StepKind.MIXED,
        [row],
        prompt,
        256,
    )
    assert list(plan.passes()) == [plan]


def test_the_plan_says_split_otherwise_and_runs_decode_before_the_chunk() -> None:
    assert _mixing(can_mix=False)[0].plan().kind is StepKind.SPLIT
    assert Scheduler(chunk_tokens=256).plan().kind is StepKind.SPLIT  # nothing to run
    scheduler, row, prompt = _mixing()
    row.generated = [7, 8, 9]  # forced tokens: the row extends, alone
    plan = scheduler.plan()
    assert plan.kind is StepKind.SPLIT
    first, second = plan.passes()
    assert (first.decode, first.prefill) == ([row], None)
    assert (second.decode, second.prefill, second.chunk) == ([], prompt, plan.chunk)
    big = Scheduler(chunk_tokens=MIX_MAX_TOKENS + 1, can_mix=lambda: True)
    decoding = _start(big, _seq(Kind.GENERATE, 10))
    decoding.kv_len = 10
    big.prefilled(decoding)
    decoding.generated = [1]
    _start(big, _seq(Kind.GENERATE, 2 * MIX_MAX_TOKENS))
    assert big.plan().kind is StepKind.SPLIT  # a chunk over MIX_MAX_TOKENS


def test_a_split_plan_skips_a_chunk_whose_sequence_stopped_prefilling() -> None:
    scheduler, row, prompt = _mixing(can_mix=False)
    passes = scheduler.plan().passes()
    assert next(passes).decode == [row]
    scheduler.remove(prompt)
    prompt.state = State.FINISHED  # failed or cancelled by the decode step's postprocess
    assert list(passes) == []
