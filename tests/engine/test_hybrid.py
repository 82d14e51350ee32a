"""Hybrid models (linear attention, convolutions, Mamba-2) are served exactly from cache.

Tiny random Qwen3.5, LFM2 and Granite 4 models (``hybrid_models.py``: three state layers
and one attention layer) in float64, as test_exactness.py does for full attention:

* a cold run equals transformers' own ``generate``;
* greedy output with cache hits (a pinned house, follow-up turns, batches of rows from
  different pins) equals a run without any cache, token for token;
* a cached prefix is resumed only where its state was kept: a match that ends anywhere
  else is cut back to the last snapshot, and the rest is computed;
* a pin written to the store keeps its state, so a restart resumes it exactly, and a
  file without that state is never used for a hybrid model.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from hearth_engine.cache.store import PrefixStore
from hearth_engine.config import CacheMode
from hearth_engine.model.runner import SCAN_CHUNK_TOKENS, ModelRunner, tune_scan_chunks
from hearth_engine.server.metrics import engine_stats
from hearth_engine.serving.sampling import SamplingParams

from .hybrid_models import KINDS, save_hybrid_model
from .warm_cold import generate_both, tokens

GREEDY = SamplingParams(max_tokens=12)


@pytest.fixture(scope="module", params=list(KINDS))
def hybrid64(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> ModelRunner:
    folder = save_hybrid_model(request.param, tmp_path_factory.mktemp("hybrid") / request.param)
    return ModelRunner.load(str(folder), dtype="float64")


def test_the_model_loads_with_its_state_layers(hybrid64: ModelRunner) -> None:
    layout = hybrid64.layout
    assert layout.state_layers == (0, 2, 3)
    assert layout.layers == 1  # KV is kept for the attention layer only
    assert hybrid64.info.bytes_per_token == 2 * 2 * 16 * 8
    assert hybrid64.info.forward == "transformers"
    assert hybrid64.shares_prefix is False  # prefixes are copied (see runner.shares_prefix)


def test_a_cold_run_equals_transformers_own_generate(hybrid64: ModelRunner) -> None:
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(
        hybrid64.info.path, dtype=torch.float64, attn_implementation="eager"
    )
    if hasattr(reference.config, "num_local_experts"):  # grouped matmuls take no float64
        reference.set_experts_implementation("eager")
    prompt = tokens(random.Random(5), 37)
    with torch.no_grad():
        out = reference.generate(
            torch.tensor([prompt]), max_new_tokens=10, do_sample=False, eos_token_id=None
        )
    expected = out[0, len(prompt) :].tolist()
    buffer = hybrid64.new_buffer(1, len(prompt) + 11)
    hybrid64.prefill(buffer, prompt[:20])  # two chunks: the second resumes the state
    got = [int(hybrid64.prefill(buffer, prompt[20:]).argmax())]
    for i in range(9):
        logits = hybrid64.decode(buffer, [got[-1]], [len(prompt) + i], None)
        got.append(int(logits[0].argmax()))
    assert got == expected


async def test_greedy_with_cache_hits_equals_cold_runs(make_engine, hybrid64: ModelRunner) -> None:
    """A pinned house with suffixes of several lengths, and follow-up turns that resume
    from the state kept at the end of the previous turn."""
    warm = make_engine(runner=hybrid64, chunk_tokens=16)
    cold = make_engine(runner=hybrid64, cache_mode=CacheMode.NONE)
    rng = random.Random(42)
    house = tokens(rng, 45)
    assert (await warm.pin("house", house)).state == "ready"
    followed = 0
    for suffix_len in (1, 3, 16, 17, 40):
        prompt = house + tokens(rng, suffix_len)
        warm_ids, fin = await generate_both(warm, cold, prompt, GREEDY)
        assert fin.stats.cached_tokens == len(house)
        follow = prompt + warm_ids + tokens(rng, 3)
        _, fin2 = await generate_both(warm, cold, follow, GREEDY)
        # It resumes at the previous turn's end. (A token event can carry several
        # tokens' text; then ``warm_ids`` misses some and the turn is not a prefix.)
        if len(warm_ids) == fin.stats.completion_tokens:
            assert fin2.stats.cached_tokens == len(prompt) + len(warm_ids) - 1
            followed += 1
    assert followed >= 2


async def test_a_match_is_resumed_only_where_a_state_was_kept(
    make_engine, hybrid64: ModelRunner
) -> None:
    """The radix cache holds KV for ``house + turn``, but the state only at the ends of
    the pin and of the turn: a prompt that leaves the turn half-way resumes at the pin."""
    warm = make_engine(runner=hybrid64, chunk_tokens=16)
    cold = make_engine(runner=hybrid64, cache_mode=CacheMode.NONE)
    rng = random.Random(3)
    house, turn = tokens(rng, 40), tokens(rng, 20)
    await warm.pin("house", house)
    await warm.generate(house + turn, SamplingParams(max_tokens=1))
    assert warm.kv.cache.match(warm.namespace, house + turn).length == len(house) + len(turn)
    stats = engine_stats(warm)  # one snapshot at the pin's end, one at the turn's end
    assert stats["state_snapshots"] == 2
    snapshot = warm.kv.snapshot(warm.namespace, house)
    assert snapshot is not None and stats["state_snapshot_bytes"] == 2 * snapshot.nbytes
    prompt = house + turn[:10] + tokens(rng, 5)
    _, fin = await generate_both(warm, cold, prompt, GREEDY)
    assert fin.stats.cached_tokens == len(house)
    # Without any pin or turn end inside it, nothing is resumed at all.
    prompt = house[:30] + tokens(rng, 5)
    _, fin = await generate_both(warm, cold, prompt, GREEDY)
    assert fin.stats.cached_tokens == 0


async def test_rows_of_different_pins_decode_together_exactly(
    make_engine, hybrid64: ModelRunner
) -> None:
    """Rows of different lengths share one left-padded batch; each keeps its own state."""
    warm = make_engine(runner=hybrid64, chunk_tokens=16)
    cold = make_engine(runner=hybrid64, cache_mode=CacheMode.NONE)
    rng = random.Random(7)
    houses = [tokens(rng, n) for n in (50, 31)]
    for n, house in enumerate(houses):
        await warm.pin(f"house{n}", house)
    prompts = [houses[i % 2] + tokens(rng, rng.randint(1, 25)) for i in range(4)]
    prompts.append(tokens(rng, 12))  # a row with no pin at all
    params = SamplingParams(max_tokens=20)
    together = await asyncio.gather(*(warm.generate(p, params) for p in prompts))
    for prompt, (_, warm_ids, _) in zip(prompts, together, strict=True):
        _, cold_ids, _ = await cold.generate(prompt, params)
        assert warm_ids == cold_ids
    assert warm.counters.decode_steps < sum(len(ids) for _, ids, _ in together)  # batched


async def test_a_restored_pin_keeps_its_state(
    make_engine, hybrid64: ModelRunner, tmp_path: Path
) -> None:
    rng = random.Random(11)
    house = tokens(rng, 48)
    config = {"chunk_tokens": 16, "prefix_store": tmp_path}
    first = make_engine(runner=hybrid64, **config)
    assert not (await first.pin("house", house)).restored
    await first.shutdown()
    (file,) = tmp_path.rglob("*.safetensors")
    with safe_open(file, framework="pt") as reader:  # the state of all three state layers
        assert {"state.conv.0", "state.conv.1", "state.conv.2"} <= set(reader.keys())
    second = make_engine(runner=hybrid64, **config)
    assert second.pin_status("house")["restored"] is True
    cold = make_engine(runner=hybrid64, cache_mode=CacheMode.NONE)
    for suffix in (1, 9, 20):
        prompt = house + tokens(rng, suffix)
        _, fin = await generate_both(second, cold, prompt, GREEDY)
        assert fin.stats.cached_tokens == len(house)


def test_a_file_without_state_is_unusable_for_a_hybrid_model(tmp_path: Path) -> None:
    tokens = list(range(7))
    kv = torch.randn(1, 2, 2, len(tokens), 16, dtype=torch.bfloat16)
    assert PrefixStore(tmp_path).save("plain", tokens, kv)  # a full-attention model's file
    hybrid = PrefixStore(tmp_path)
    hybrid.keep_states(1)
    assert hybrid.load("plain", tokens) is None
    with pytest.raises(ValueError, match="state"):
        hybrid.save("hybrid", tokens, kv)  # a hybrid model's KV never goes without state
    state = {"conv.0": torch.randn(8, 4, dtype=torch.bfloat16), "recurrent.0": torch.randn(2, 4, 4)}
    assert hybrid.save("hybrid", tokens, kv, state)
    loaded = hybrid.load_prefix("hybrid", tokens)
    assert loaded is not None and loaded.tokens == tokens
    assert torch.equal(loaded.kv, kv)
    assert loaded.state.keys() == state.keys()
    assert all(torch.equal(loaded.state[k], v) for k, v in state.items())
    assert PrefixStore(tmp_path).load("hybrid", tokens) is None  # a plain model cannot use it


def test_the_mamba_scan_chunk_changes_no_result(tmp_path: Path) -> None:
    """The runner caps Mamba-2's scan chunk (``tune_scan_chunks``, for speed on CPU): the
    chunked scan's result does not depend on it, up to rounding. 150 tokens: 1 chunk of
    256, or 3 of 64."""
    runner = ModelRunner.load(str(save_hybrid_model("granite", tmp_path / "g")), dtype="float64")
    mixers = [m for m in runner.model.modules() if type(m).__name__.endswith("MambaLayer")]
    assert mixers and all(m.chunk_size == 16 for m in mixers)  # the model's own, below 64
    prompt = tokens(random.Random(9), 150)

    def logits() -> torch.Tensor:
        return runner.prefill(runner.new_buffer(1, len(prompt) + 1), prompt)

    for mixer in mixers:
        mixer.chunk_size = 256
    wide = logits()
    assert tune_scan_chunks(runner.model) == len(mixers)
    assert {m.chunk_size for m in mixers} == {SCAN_CHUNK_TOKENS}
    narrow = logits()
    # The scan runs in float32 inside (transformers keeps A and dt in float32): the two
    # differ by float32 rounding only.
    torch.testing.assert_close(narrow, wide, rtol=0, atol=1e-5)
    assert int(narrow.argmax()) == int(wide.argmax())


async def test_bfloat16_pins_survive_a_restart(make_engine, tmp_path: Path) -> None:
    """The host's native dtype: states of several dtypes (bfloat16 conv windows, the
    recurrent matrices transformers keeps in float32) go through the store unchanged, so
    the answer after a restart is the answer before it, from the same pinned prefix."""
    runner = ModelRunner.load(str(save_hybrid_model("qwen3_5", tmp_path / "q")), dtype="bfloat16")
    rng = random.Random(13)
    house, prompt_tail = tokens(rng, 40), tokens(rng, 6)
    config = {"chunk_tokens": 16, "prefix_store": tmp_path / "store"}
    first = make_engine(runner=runner, **config)
    await first.pin("house", house)
    snapshot = first.kv.snapshot(first.namespace, house)
    assert snapshot is not None
    assert {t.dtype for t in snapshot.conv} == {torch.bfloat16}
    assert {t.dtype for t in snapshot.recurrent if t is not None} == {torch.float32}
    _, before, fin = await first.generate(house + prompt_tail, GREEDY)
    assert fin.stats.cached_tokens == len(house)
    await first.shutdown()
    second = make_engine(runner=runner, **config)
    assert second.pin_status("house")["restored"] is True
    restored = second.kv.snapshot(second.namespace, house)
    assert restored is not None
    pairs = zip(
        (*snapshot.conv, *snapshot.recurrent), (*restored.conv, *restored.recurrent), strict=True
    )
    for a, b in pairs:
        assert (a is None and b is None) or (a.dtype == b.dtype and torch.equal(a, b))
    _, after, fin = await second.generate(house + prompt_tail, GREEDY)
    assert fin.stats.cached_tokens == len(house)
    assert after == before
