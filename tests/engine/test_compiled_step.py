"""The compiled decode step (step_compiler.py): exact in float32, never a failed request.

One real compile per session (the tiny model, float32, ~30 s); the fallbacks are forced
without compiling (a broken cache folder, a compiled step that fails mid-step).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from hearth_engine.model.attention import PrefixPart
from hearth_engine.model.runner import ModelRunner
from hearth_engine.model.step_compiler import CompileState, StepCompiler
from hearth_engine.server.metrics import engine_stats
from hearth_engine.serving.sampling import SamplingParams

GREEDY = SamplingParams(max_tokens=12)
PROMPT = [5, 17, 99, 3, 250, 42, 7, 8, 900, 31, 64, 12]


@pytest.fixture(scope="module")
def compiled_runner(tmp_path_factory: pytest.TempPathFactory) -> ModelRunner:
    """A tiny float32 runner whose decode step is compiled (batch 1; one compile)."""
    runner = ModelRunner.load("tiny", dtype="float32")
    assert runner.lean is not None
    runner.compiler = StepCompiler(
        runner.lean, runner.layout, (1,), cache_root=tmp_path_factory.mktemp("inductor")
    )
    runner.start_compile()
    assert runner.compiler.wait(600) == CompileState.ACTIVE, runner.compiler.error
    return runner


def greedy(runner: ModelRunner, prompt: list[int], steps: int, shared: bool) -> list[int]:
    """Greedy tokens of bare runner steps; ``shared``: the prompt's first half is a
    prefix part read in place (as a pinned prefix is served)."""
    half = len(prompt) // 2 if shared else 0
    parts: list[PrefixPart] = []
    if shared:
        source = runner.new_buffer(1, half)
        runner.prefill(source, prompt[:half])
        parts = [PrefixPart(source.read_segment(0, 0, half))]
    own = runner.new_buffer(1, len(prompt) + steps)
    logits = runner.prefill(own, prompt[half:], [p.segment for p in parts])
    out = [int(logits.argmax())]
    for i in range(steps - 1):
        position = len(prompt) + i
        logits = runner.decode(own, [out[-1]], [position], None, parts)[0]
        out.append(int(logits.argmax()))
    return out


@pytest.mark.parametrize("shared", [False, True])
def test_compiled_greedy_equals_eager(
    compiled_runner: ModelRunner, tiny_runner: ModelRunner, shared: bool
) -> None:
    assert compiled_runner.compiler is not None
    calls = []
    run = compiled_runner.compiler._step.run  # type: ignore[union-attr]
    compiled_runner.compiler._step.run = lambda *a: calls.append(1) or run(*a)  # type: ignore[union-attr]
    try:
        got = greedy(compiled_runner, PROMPT, 16, shared)
    finally:
        del compiled_runner.compiler._step.run  # type: ignore[union-attr]
    assert len(calls) == 15  # every decode step ran compiled
    assert got == greedy(tiny_runner, PROMPT, 16, shared)
    assert compiled_runner.compile_state == CompileState.ACTIVE


def test_a_failing_compiled_step_falls_back_to_the_exact_eager_step(
    compiled_runner: ModelRunner, tiny_runner: ModelRunner, caplog: pytest.LogCaptureFixture
) -> None:
    """A compiled step that fails after writing some KV: the eager step redoes it on the
    cache as it was, so logits and cache equal a plain eager step's."""
    step = compiled_runner.compiler._step  # type: ignore[union-attr]
    assert step is not None
    compiled_kv = compiled_runner.new_buffer(1, 32)
    eager_kv = tiny_runner.new_buffer(1, 32)
    compiled_runner.prefill(compiled_kv, PROMPT)
    tiny_runner.prefill(eager_kv, PROMPT)
    run = step.run

    def half_then_fail(ids, positions, cache, mask, parts=()):
        run(ids, positions, cache, mask, parts)  # writes this step's KV, then "fails"
        raise RuntimeError("simulated kernel failure")

    step.run = half_then_fail  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="hearth_engine.model.step_compiler"):
        got = compiled_runner.decode(compiled_kv, [77], [len(PROMPT)], None)
    expected = tiny_runner.decode(eager_kv, [77], [len(PROMPT)], None)
    assert torch.equal(got, expected)
    assert compiled_kv.length == eager_kv.length == len(PROMPT) + 1
    assert torch.equal(compiled_kv.read_segment(0, 0, 13), eager_kv.read_segment(0, 0, 13))
    assert compiled_runner.compile_state == CompileState.FAILED
    assert "simulated kernel failure" in caplog.text
    assert len([r for r in caplog.records if "serving the eager step" in r.message]) == 1


async def test_requests_after_a_compiler_failure_succeed(
    compiled_runner: ModelRunner, make_engine
) -> None:
    assert compiled_runner.compile_state == CompileState.FAILED  # the test before
    _, expected, _ = await make_engine().generate(PROMPT, GREEDY)
    engine = make_engine(runner=compiled_runner)
    _, reply, finish = await engine.generate(PROMPT, GREEDY)
    assert reply == expected
    assert finish.stats.completion_tokens == len(expected)
    assert engine_stats(engine)["compiled_step"] == "failed"  # what /v1/stats shows


async def test_broken_cache_folder_serves_eager(
    tmp_path: Path, tiny_runner: ModelRunner, make_engine, caplog
) -> None:
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    runner = ModelRunner.load("tiny", dtype="float32")
    assert runner.lean is not None
    runner.compiler = StepCompiler(runner.lean, runner.layout, (1,), cache_root=blocked)
    with caplog.at_level(logging.WARNING, logger="hearth_engine.model.step_compiler"):
        runner.start_compile()
        assert runner.compiler.wait(60) == CompileState.FAILED
    assert "compiling the decode step failed" in caplog.text
    _, expected, _ = await make_engine().generate(PROMPT, GREEDY)
    _, reply, _ = await make_engine(runner=runner).generate(PROMPT, GREEDY)
    assert reply == expected
