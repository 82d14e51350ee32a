"""Sliding-window layers (Gemma 3) are served exactly: cache hits never change the output.

A tiny random Gemma 3 (``sliding_model.py``: window of 8 tokens, 3 sliding layers and
one full one) in float64, as test_exactness.py does for full attention: greedy output
with cache hits (pinned prefixes longer than the window, prompts whose length crosses
it, decodes of several windows) equals a run without any cache, token for token, and a
cold run equals transformers' own forward.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
import torch

from hearth_engine.config import CacheMode
from hearth_engine.model import attention
from hearth_engine.model.runner import ModelRunner
from hearth_engine.serving.sampling import SamplingParams

from .random_models import save_random_model
from .sliding_model import WINDOW, save_sliding_model
from .warm_cold import generate_both, tokens

LONG = SamplingParams(max_tokens=2 * WINDOW + 4)  # a decode that slides past two windows


@pytest.fixture(scope="module")
def sliding_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_sliding_model(tmp_path_factory.mktemp("gemma3") / "tiny-gemma3")


@pytest.fixture(scope="module")
def sliding64(sliding_folder: Path) -> ModelRunner:
    return ModelRunner.load(str(sliding_folder), dtype="float64")


@pytest.fixture(scope="module")
def sliding32(sliding_folder: Path) -> ModelRunner:
    return ModelRunner.load(str(sliding_folder), dtype="float32")


def test_the_model_loads_with_its_window(sliding64: ModelRunner) -> None:
    assert sliding64.layout.sliding == (0, 2, 3)
    assert sliding64.layout.window == WINDOW
    assert sliding64.info.forward == "transformers"  # the lean forward has no window
    assert sliding64.shares_prefix is True


def test_a_cold_run_equals_transformers_own_forward(
    sliding64: ModelRunner, sliding_folder: Path
) -> None:
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(
        sliding_folder, dtype=torch.float64, attn_implementation="eager"
    )
    prompt = tokens(random.Random(5), 3 * WINDOW + 1)
    with torch.no_grad():
        out = reference.generate(
            torch.tensor([prompt]), max_new_tokens=2 * WINDOW, do_sample=False, eos_token_id=None
        )
    expected = out[0, len(prompt) :].tolist()
    buffer = sliding64.new_buffer(1, len(prompt) + 2 * WINDOW + 1)
    got = [int(sliding64.prefill(buffer, prompt).argmax())]
    for i in range(2 * WINDOW - 1):
        logits = sliding64.decode(buffer, [got[-1]], [len(prompt) + i], None)
        got.append(int(logits[0].argmax()))
    assert got == expected


@pytest.mark.parametrize("share_prefix", [True, False], ids=["read-in-place", "copied"])
async def test_greedy_with_cache_hits_equals_cold_runs(
    make_engine, sliding64: ModelRunner, share_prefix: bool
) -> None:
    """Pinned prefixes and suffixes shorter than, equal to and longer than the window;
    prompts that leave a cached turn halfway (resumed at the last snapshot before it);
    the next turn of a chat."""
    warm = make_engine(runner=sliding64, chunk_tokens=16, share_prefix=share_prefix)
    assert warm.kv.share_prefix is share_prefix
    cold = make_engine(runner=sliding64, cache_mode=CacheMode.NONE)
    rng = random.Random(42)
    lengths = [1, WINDOW - 1, WINDOW, WINDOW + 1, 2 * WINDOW + 3, 40]
    decoded_hits = 0
    for shared_len in lengths:
        shared = tokens(rng, shared_len)
        await warm.pin("shared", shared)
        for suffix_len in (1, WINDOW, WINDOW + 2):
            first = shared + tokens(rng, rng.randint(1, 2 * WINDOW))
            first_ids, first_fin = await generate_both(warm, cold, first, LONG)
            assert first_fin.stats.cached_tokens == shared_len
            # Leaves the cached first turn halfway: resumes at the pin's end.
            second = first[: shared_len + 1] + tokens(rng, suffix_len)
            _, fin = await generate_both(warm, cold, second, LONG)
            assert fin.stats.cached_tokens == shared_len
            # The next turn hits KV made one token at a time while decoding. (A token
            # event can carry several tokens' text, then ``first_ids`` misses some.)
            follow = first + first_ids + tokens(rng, 3)
            _, fin = await generate_both(warm, cold, follow, LONG)
            if len(first_ids) == first_fin.stats.completion_tokens:
                assert fin.stats.cached_tokens == len(first) + len(first_ids) - 1
                decoded_hits += 1
    assert decoded_hits >= 3


async def test_pinned_prefixes_longer_than_the_window_in_one_batch(
    make_engine, sliding64: ModelRunner
) -> None:
    """Rows reading two different pins (and one none) in one decode batch, 2+ windows."""
    engine = make_engine(runner=sliding64, chunk_tokens=16)
    cold = make_engine(runner=sliding64, cache_mode=CacheMode.NONE)
    rng = random.Random(7)
    houses = [tokens(rng, n) for n in (5 * WINDOW + 3, 3 * WINDOW)]
    for n, house in enumerate(houses):
        await engine.pin(f"house{n}", house)
    suffixes = (1, WINDOW - 1, WINDOW + 1, 2 * WINDOW + 5, 3)
    prompts = [houses[i % 2] + tokens(rng, n) for i, n in enumerate(suffixes)]
    prompts.append(tokens(rng, 3 * WINDOW))
    together = await asyncio.gather(*(engine.generate(p, LONG) for p in prompts))
    alone = [(await cold.generate(p, LONG))[1] for p in prompts]
    assert [fin.stats.cached_tokens for _, _, fin in together][:5] == [
        len(houses[i % 2]) for i in range(5)
    ]
    assert [ids for _, ids, _ in together] == alone


def _logits(runner: ModelRunner, tokens: list[int], chunks: list[int], shared: int = 0):
    """Last logits of ``tokens`` prefilled in ``chunks`` after ``shared`` tokens whose KV
    (from a cold prefill) is read in place, as the cache keeps it."""
    buffer = runner.new_buffer(1, len(tokens) + 1)
    segments, window = [], None
    if shared:
        source = runner.new_buffer(1, len(tokens) + 1)
        runner.prefill(source, tokens)
        segments, window = runner.as_cached(source.read_segment(0, 0, shared))
    pos = shared
    for n in chunks:
        logits = runner.prefill(buffer, tokens[pos : pos + n], segments, window)
        pos += n
    assert pos == len(tokens)
    return logits


@pytest.mark.parametrize("shared", [3, WINDOW - 1, WINDOW, WINDOW + 1, 5 * WINDOW + 2])
@pytest.mark.parametrize("suffix", [1, WINDOW - 1, 2 * WINDOW + 1])
def test_float32_prefix_logits_equal_a_cold_prefill(
    sliding32: ModelRunner, shared: int, suffix: int
) -> None:
    """In float32 a cache hit moves the logits by float32 rounding only (1e-4 at most)."""
    ids = tokens(random.Random(shared * 100 + suffix), shared + suffix)
    expected = _logits(sliding32, ids, [len(ids)])
    got = _logits(sliding32, ids, [suffix], shared=shared)
    assert float((got - expected).abs().max()) <= 1e-4
    assert int(got.argmax()) == int(expected.argmax())


async def test_float32_pinned_decode_equals_cold(make_engine, sliding32: ModelRunner) -> None:
    """float32 greedy text over a pin longer than the window, decoding 2+ windows."""
    engine = make_engine(runner=sliding32, chunk_tokens=16)
    cold = make_engine(runner=sliding32, cache_mode=CacheMode.NONE)
    assert engine.kv.share_prefix is True
    rng = random.Random(3)
    house = tokens(rng, 4 * WINDOW + 1)
    await engine.pin("house", house)
    for suffix in (1, WINDOW, WINDOW + 5):
        prompt = house + tokens(rng, suffix)
        _, fin = await generate_both(engine, cold, prompt, LONG)
        assert fin.stats.cached_tokens == len(house)


def test_bfloat16_passes_the_self_test(sliding_folder: Path) -> None:
    assert ModelRunner.load(str(sliding_folder), dtype="bfloat16").shares_prefix is True


def test_a_part_read_without_its_window_fails_the_self_test(
    monkeypatch: pytest.MonkeyPatch, sliding_folder: Path
) -> None:
    """The self-test sees a window left off the prefix parts: such a model copies."""

    def unwindowed(q, k, v, scale, positions, start, window, groups):
        return attention._partials(q, k, v, None, scale)

    monkeypatch.setattr(attention, "_window_partials", unwindowed)
    runner = ModelRunner.load(str(sliding_folder), dtype="float32")
    assert runner.shares_prefix is False


@pytest.mark.parametrize("q_len", [1, 5])
def test_windowed_merge_equals_windowed_attention_over_the_concatenated_kv(q_len: int) -> None:
    """Rows reading different parts (one wholly behind the window), GQA, several queries."""
    gen = torch.Generator().manual_seed(3)
    hkv, groups, d, window = 2, 2, 8, 6

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    house, extra = rand(1, 2, hkv, 20, d), rand(1, 2, hkv, 4, d)
    own_len = [q_len + 3, q_len]  # row 0: house + extra + own; row 1: house + own
    cap = max(own_len)
    key, value = rand(2, hkv, cap, d), rand(2, hkv, cap, d)
    query = rand(2, hkv * groups, q_len, d)
    parts = [
        attention.PrefixPart(house),
        attention.PrefixPart(extra, torch.tensor([0])),
    ]
    shared = [24, 20]
    positions = torch.stack(
        [torch.arange(shared[r] + own_len[r] - q_len, shared[r] + own_len[r]) for r in range(2)]
    )
    # The own KV's mask (left padding, causal, window), as transformers would give it.
    cols = torch.arange(cap)
    own_mask = torch.zeros(2, 1, q_len, cap, dtype=torch.bool)
    for r in range(2):
        key_pos = shared[r] + cols - (cap - own_len[r])
        valid = cols >= cap - own_len[r]
        qp = positions[r][:, None]
        own_mask[r, 0] = valid & (key_pos <= qp) & (key_pos > qp - window)
    got = attention.merged_attention(
        query, key, value, own_mask, None, parts, 0, window=window, positions=positions
    )
    for r in range(2):
        prefix = [house[0]] + ([extra[0]] if r == 0 else [])
        k_all = torch.cat([p[0] for p in prefix] + [key[r, :, cap - own_len[r] :]], dim=1)
        v_all = torch.cat([p[1] for p in prefix] + [value[r, :, cap - own_len[r] :]], dim=1)
        key_pos = torch.arange(k_all.shape[1])
        qp = positions[r][:, None]
        mask = (key_pos <= qp) & (key_pos > qp - window)
        want = torch.nn.functional.scaled_dot_product_attention(
            query[r][None], k_all[None], v_all[None], attn_mask=mask, enable_gqa=True
        )
        torch.testing.assert_close(got[r], want[0].transpose(0, 1), rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------- the store


def test_the_store_keeps_only_the_window_of_sliding_layers(tmp_path: Path) -> None:
    """Full layers keep every token, sliding layers their last ``window`` (bytes too)."""
    from hearth_engine.cache.store import PrefixStore, prefix_key

    layers, heads, dim, total = 4, 2, 4, 40
    tokens = list(range(100, 100 + total))
    kv = torch.randn(layers, 2, heads, total, dim, generator=torch.Generator().manual_seed(1))
    full, tail = kv[[1]], kv[[0, 2, 3], :, :, -WINDOW:]
    store = PrefixStore(tmp_path)
    store.keep_windows(layers, (0, 2, 3), WINDOW)
    with pytest.raises(ValueError, match="window"):
        store.save("ns", tokens, full)  # no window
    with pytest.raises(ValueError, match="layers"):
        store.save("ns", tokens, kv, window=tail)  # the sliding layers twice
    with pytest.raises(ValueError, match="layers"):
        store.save("ns", tokens, full, window=tail[:, :, :, 1:])  # a short window
    assert store.save("ns", tokens, [full[:, :, :, :25], full[:, :, :, 25:]], window=tail)
    loaded = store.load_prefix("ns", tokens)
    assert loaded is not None and loaded.window is not None
    assert torch.equal(loaded.kv, full)
    assert torch.equal(loaded.window, tail)
    size = store.path_for("ns", prefix_key("ns", tokens)).stat().st_size
    per_layer_token = 2 * heads * dim * kv.element_size()
    kv_bytes = (1 * total + 3 * WINDOW) * per_layer_token
    assert kv_bytes < size < kv_bytes + 8 * total + 1024  # + token ids and the header
    full_bytes = layers * total * per_layer_token
    assert size < full_bytes / 2
    # A store without windows (another model) cannot read it: discarded, rebuilt.
    assert PrefixStore(tmp_path).load("ns", tokens) is None


def test_a_short_prefix_keeps_all_its_tokens(tmp_path: Path) -> None:
    from hearth_engine.cache.store import PrefixStore

    kv = torch.randn(4, 2, 2, 5, 4)
    store = PrefixStore(tmp_path)
    store.keep_windows(4, (0, 2, 3), WINDOW)
    assert store.save("ns", list(range(5)), kv[[1]], window=kv[[0, 2, 3]])
    loaded = store.load_prefix("ns", list(range(5)))
    assert loaded is not None and loaded.window is not None
    assert torch.equal(loaded.kv, kv[[1]]) and torch.equal(loaded.window, kv[[0, 2, 3]])


def test_pinned_prefix_bytes_per_layer_type(sliding64: ModelRunner) -> None:
    layout = sliding64.layout
    per_layer = layout.layer_bytes_per_token
    assert layout.prefix_bytes(1000) == (1 * 1000 + 3 * WINDOW) * per_layer
    assert layout.prefix_bytes(4) == 4 * layout.bytes_per_token
    assert layout.bytes_per_token == 4 * per_layer


async def test_memory_holds_only_the_window_of_sliding_layers(
    make_engine, sliding64: ModelRunner
) -> None:
    """A pin of many windows holds every token of its full layer, and its sliding layers'
    last window only: ``KVLayout.prefix_bytes``, a fraction ``window / T`` of theirs."""
    engine = make_engine(runner=sliding64, chunk_tokens=16)
    house = tokens(random.Random(4), 8 * WINDOW)
    await engine.pin("house", house)
    layout = sliding64.layout
    held = engine.kv.cache.used_bytes + engine.kv.snapshots.nbytes
    assert held == layout.prefix_bytes(len(house))
    sliding_held = engine.kv.snapshots.nbytes
    sliding_full = len(layout.sliding) * len(house) * layout.layer_bytes_per_token
    assert sliding_held * len(house) == sliding_full * WINDOW


@pytest.mark.parametrize("share_prefix", [True, False], ids=["read-in-place", "copied"])
async def test_a_prompt_sent_again_resumes_one_token_before_its_end(
    make_engine, sliding64: ModelRunner, share_prefix: bool
) -> None:
    """A retry: the snapshot is at the prompt's end, a request resumes one token before
    it; the window one token further on serves there, exactly."""
    engine = make_engine(runner=sliding64, chunk_tokens=16, share_prefix=share_prefix)
    cold = make_engine(runner=sliding64, cache_mode=CacheMode.NONE)
    rng = random.Random(8)
    for n in (WINDOW - 1, WINDOW + 1, 5 * WINDOW):
        prompt = tokens(rng, n)
        short = SamplingParams(max_tokens=1)  # no decoded tokens: the snapshot is at the end
        _, first = await generate_both(engine, cold, prompt, short)
        assert first.stats.cached_tokens == 0
        _, again = await generate_both(engine, cold, prompt, LONG)
        assert again.stats.cached_tokens == n - 1


async def test_a_window_larger_than_the_unpinned_snapshot_budget_is_kept(
    make_engine, sliding64: ModelRunner
) -> None:
    """A pin's window is taken before the pin holds it: it must survive the unpinned
    snapshots' byte limit (a quarter of the KV budget) until then."""
    layout = sliding64.layout
    window_bytes = len(layout.sliding) * WINDOW * layout.layer_bytes_per_token
    house = tokens(random.Random(9), 6 * WINDOW)
    budget = layout.prefix_bytes(len(house)) + 4 * layout.bytes_per_token
    assert window_bytes > budget // 4
    engine = make_engine(runner=sliding64, chunk_tokens=16, kv_cache_bytes=budget)
    status = await engine.pin("house", house)
    assert status.state == "ready"
    # The pinned prefix holds its window. (A request over it would need more working KV
    # than this budget has left beside the pin: admission counts that now, so the
    # window is checked where the cache keeps it.)
    window = engine.kv.snapshots.get(engine.namespace, house)
    assert window is not None and window.window is not None
    assert window.window.shape[3] == WINDOW


async def test_a_pin_that_fits_only_without_its_window_is_refused(
    make_engine, sliding64: ModelRunner
) -> None:
    from hearth_engine.cache.radix import PinTooLargeError

    layout = sliding64.layout
    house = tokens(random.Random(10), 6 * WINDOW)
    budget = layout.prefix_bytes(len(house)) - 1
    assert len(house) * layout.segment_bytes_per_token <= budget
    engine = make_engine(runner=sliding64, chunk_tokens=16, kv_cache_bytes=budget)
    with pytest.raises(PinTooLargeError):
        await engine.pin("house", house)


async def test_a_cached_prefix_copied_into_a_buffer_resumes_exactly(
    make_engine, sliding64: ModelRunner
) -> None:
    """``KVManager.copy_cached`` (the benchmarks' floor): segments and window together."""
    engine = make_engine(runner=sliding64, chunk_tokens=16)
    rng = random.Random(6)
    house, suffix = tokens(rng, 5 * WINDOW + 1), tokens(rng, WINDOW + 2)
    await engine.pin("house", house)
    expected = sliding64.prefill(sliding64.new_buffer(1, len(house) + len(suffix)), house + suffix)

    def floor() -> torch.Tensor:
        buffer = sliding64.new_buffer(1, len(house) + len(suffix))
        engine.kv.copy_cached(buffer, engine.namespace, house)
        return sliding64.prefill(buffer, suffix)

    got = await engine.on_worker(floor)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-9)


async def test_a_model_whose_every_layer_slides_keeps_whole_prefixes(
    make_engine, tmp_path: Path
) -> None:
    """Mistral's first models slide in every layer: trimming would leave the radix tree's
    segments without KV (nothing would bound their number), so nothing is trimmed, and
    pins serve exactly."""
    folder = save_random_model(
        tmp_path / "mistral",
        "mistral",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        sliding_window=WINDOW,
    )
    runner = ModelRunner.load(str(folder), dtype="float64")
    layout = runner.layout
    assert layout.sliding == (0, 1) and layout.window == WINDOW
    assert not layout.trims_windows and layout.segment_layers == (0, 1)
    engine = make_engine(runner=runner, chunk_tokens=16, prefix_store=tmp_path / "store")
    cold = make_engine(runner=runner, cache_mode=CacheMode.NONE)
    rng = random.Random(12)
    house = tokens(rng, 4 * WINDOW + 3)
    await engine.pin("house", house)
    assert engine.kv.snapshots is None
    assert engine.kv.cache.used_bytes == len(house) * layout.bytes_per_token
    for prompt in (house + tokens(rng, WINDOW + 1), house[: 2 * WINDOW] + tokens(rng, 3)):
        _, fin = await generate_both(engine, cold, prompt, LONG)
        assert fin.stats.cached_tokens >= 2 * WINDOW


@pytest.mark.parametrize("share_prefix", [True, False], ids=["read-in-place", "copied"])
async def test_a_restored_windowed_pin_serves_exactly(
    make_engine, sliding64: ModelRunner, tmp_path: Path, share_prefix: bool
) -> None:
    """After a restart the pin (its full layers and its sliding layers' last window)
    serves the requests that extend it exactly; a prompt that leaves it early misses
    (no sliding KV is kept there) and equals a cold run too; pins made from such a path
    are saved and restored like any other."""
    rng = random.Random(11)
    house = tokens(rng, 6 * WINDOW + 5)
    config = {"chunk_tokens": 16, "prefix_store": tmp_path, "share_prefix": share_prefix}
    first = make_engine(runner=sliding64, **config)
    assert not (await first.pin("house", house)).restored
    await first.shutdown()
    (file,) = tmp_path.rglob("*.safetensors")
    layout = sliding64.layout
    assert file.stat().st_size < layout.prefix_bytes(len(house)) + 8 * len(house) + 2048
    assert layout.prefix_bytes(len(house)) < len(house) * layout.bytes_per_token / 2

    second = make_engine(runner=sliding64, **config)
    assert second.pin_status("house")["restored"] is True
    cold = make_engine(runner=sliding64, cache_mode=CacheMode.NONE)
    for suffix in (1, WINDOW - 1, WINDOW + 3):
        prompt = house + tokens(rng, suffix)
        _, fin = await generate_both(second, cold, prompt, LONG)
        assert fin.stats.cached_tokens == len(house)
    for cut in (WINDOW // 2, 3 * WINDOW, len(house) - 1):
        prompt = house[:cut] + tokens(rng, WINDOW)
        _, fin = await generate_both(second, cold, prompt, LONG)
        assert fin.stats.cached_tokens == 0
    porch = house[: 3 * WINDOW] + tokens(rng, 2)
    await second.pin("porch", porch)
    await second.shutdown()

    third = make_engine(runner=sliding64, **config)
    assert third.pin_status("porch")["restored"] is True
    for pinned in (house, porch):
        _, fin = await generate_both(third, cold, pinned + tokens(rng, 3), LONG)
        assert fin.stats.cached_tokens == len(pinned)
