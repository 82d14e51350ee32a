"""Hearth's C++ kernels (native.py, kernels/): the decode attention and the fused
per-layer operations (RMSNorm, rotary embedding).

The kernel is checked against float64 attention written out in torch (softmax of the
scores over every key a row sees), over the shapes it meets: grouped heads, shared
prefix parts read by all rows or by some, padded rows, lengths that leave partial
blocks and slices, every dtype and head size it takes. Then the engine with it: greedy
cached and cold decodes agree, and a kernel that cannot be built (no C++ compiler)
leaves torch's kernels serving, logged in one line.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hearth_engine.model import attention, native
from hearth_engine.model.attention import PrefixPart
from hearth_engine.model.decoder import _rotate, rms_norm

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def kernels() -> object:
    module = native.load()
    assert module is not None, f"the native kernels did not build: {native.error()}"
    return module


def reference(
    query: torch.Tensor,  # [B, Hq, 1, D]
    own_k: torch.Tensor,  # [B, Hkv, S, D]
    own_v: torch.Tensor,
    keep: torch.Tensor | None,  # [B, S] bool
    parts: list[PrefixPart],
    layer: int,
    scale: float,
) -> torch.Tensor:
    """Float64 attention of each row over its parts' keys, then its own: ``[B, Hq, D]``."""
    b, hq, _, d = query.shape
    groups = hq // own_k.shape[1]
    out = torch.empty(b, hq, d, dtype=torch.float64)
    for row in range(b):
        keys, values = [], []
        for part in parts:
            if part.rows is None or row in part.rows.tolist():
                keys.append(part.segment[layer, 0].double())
                values.append(part.segment[layer, 1].double())
        seen = slice(None) if keep is None else keep[row]
        keys.append(own_k[row].double()[:, seen])
        values.append(own_v[row].double()[:, seen])
        k = torch.cat(keys, 1).repeat_interleave(groups, 0)  # [Hq, T, D]
        v = torch.cat(values, 1).repeat_interleave(groups, 0)
        q = query[row, :, 0].double()  # [Hq, D]
        weights = torch.softmax(torch.einsum("hd,htd->ht", q, k) * scale, -1)
        out[row] = torch.einsum("ht,htd->hd", weights, v)
    return out


@dataclass(frozen=True)
class Shape:
    """One decode step's attention: ``rows`` rows of ``kv_heads * groups`` query heads of
    ``head`` values, ``own`` tokens of working KV each (some padded out when ``padded``),
    and prefix parts of ``part_lengths`` tokens (some read by a subset of the rows when
    ``subsets``)."""

    seed: int = 0
    dtype: torch.dtype = torch.float32
    rows: int = 1
    kv_heads: int = 1
    groups: int = 2
    head: int = 64
    own: int = 8
    part_lengths: tuple[int, ...] = ()
    padded: bool = False
    subsets: bool = False


def random_case(
    shape: Shape,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, list[PrefixPart]]:
    dtype, rows, kv_heads, head, own = (
        shape.dtype,
        shape.rows,
        shape.kv_heads,
        shape.head,
        shape.own,
    )
    gen = torch.Generator().manual_seed(shape.seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype)

    layers = 2
    query = rand(rows, kv_heads * shape.groups, 1, head)
    # The working buffer as the engine has it: [L, 2, B, H, cap, D], narrowed to ``own``.
    buffer = rand(layers, 2, rows, kv_heads, own + 5, head)[..., :own, :]
    keep = None
    if shape.padded:
        keep = torch.rand(rows, own, generator=gen) < 0.7
        keep[:, -1] = True  # a row always sees its own new token
    parts = []
    for i, length in enumerate(shape.part_lengths):
        segment = rand(layers, 2, kv_heads, length, head)
        readers = None
        if shape.subsets and i % 2 == 1 and rows > 1:
            readers = torch.tensor(sorted({0, rows - 1} if i % 4 == 1 else {rows - 1}))
        parts.append(PrefixPart(segment, readers))
    return query, buffer[1, 0], buffer[1, 1], keep, parts


def native_call(
    kernels: object,
    query: torch.Tensor,
    own_k: torch.Tensor,
    own_v: torch.Tensor,
    keep: torch.Tensor | None,
    parts: list[PrefixPart],
    scale: float,
) -> torch.Tensor:
    return kernels.decode_attention(  # type: ignore[attr-defined]
        query[:, :, 0],
        own_k,
        own_v,
        keep,
        [p.segment[1, 0] for p in parts],
        [p.segment[1, 1] for p in parts],
        [p.rows for p in parts],  # None: all rows
        scale,
    )


# One rounding to the dtype (relative 2^-8 for bfloat16, 2^-11 for float16) plus
# float32 arithmetic over a few thousand keys.
TOLERANCE = {torch.float32: 2e-6, torch.bfloat16: 2**-7, torch.float16: 2**-10}


@settings(max_examples=40, deadline=None)
@given(
    shape=st.builds(
        Shape,
        seed=st.integers(0, 2**31),
        dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
        rows=st.integers(1, 4),
        kv_heads=st.integers(1, 3),
        groups=st.sampled_from([1, 3, 4]),
        head=st.sampled_from([32, 64, 128]),
        own=st.integers(1, 300),
        part_lengths=st.lists(st.integers(1, 700), max_size=3).map(tuple),
        padded=st.booleans(),
        subsets=st.booleans(),
    )
)
def test_the_kernel_equals_float64_attention(kernels: object, shape: Shape) -> None:
    query, own_k, own_v, keep, parts = random_case(shape)
    scale = shape.head**-0.5
    got = native_call(kernels, query, own_k, own_v, keep, parts, scale)
    assert got.dtype == shape.dtype
    assert got.shape == (shape.rows, shape.kv_heads * shape.groups, shape.head)
    want = reference(query, own_k, own_v, keep, parts, 1, scale)
    err = (got.double() - want).abs()
    assert float((err - TOLERANCE[shape.dtype] * (want.abs() + 1)).max()) <= 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_decode_step_through_attention_py_uses_the_kernel_and_agrees_with_torch(
    kernels: object, dtype: torch.dtype
) -> None:
    """``merged_attention`` and ``plain_attention`` (what both forwards call) take the
    kernel for one-token steps; paused, the torch path gives the same up to rounding,
    and the kernel is closer to float64 (it rounds once)."""
    shape = Shape(7, dtype, 3, 3, 3, own=40, part_lengths=(1000, 37), padded=True, subsets=True)
    query, own_k, own_v, keep, parts = random_case(shape)
    mask = keep[:, None, None, :]
    scale = 0.125
    want = reference(query, own_k, own_v, keep, parts, 1, scale)
    assert attention.native_decode(query, own_k, own_v, mask, scale, parts, 1) is not None
    for call in (
        lambda: attention.merged_attention(query, own_k, own_v, mask, scale, parts, 1),
        lambda: attention.plain_attention(query, own_k, own_v, mask, scale)[:, :, :, :],
    ):
        fast = call()
        with native.paused():
            slow = call()
        assert fast.shape == slow.shape == (3, 1, 9, 64)
        tolerance = TOLERANCE[dtype] * 4
        assert torch.allclose(fast.float(), slow.float(), atol=tolerance, rtol=tolerance)
    fast = attention.merged_attention(query, own_k, own_v, mask, scale, parts, 1)[:, 0]
    with native.paused():
        slow = attention.merged_attention(query, own_k, own_v, mask, scale, parts, 1)[:, 0]
    assert (fast.double() - want).abs().mean() <= (slow.double() - want).abs().mean()


@pytest.fixture(scope="module")
def prefix_kernel(kernels: object) -> object:
    if not kernels.prefix_attention_ready():  # type: ignore[attr-defined]
        pytest.skip("this CPU has no AVX512-BF16: torch's flash kernel reads prefix parts")
    return kernels


def prefix_case(
    seed: int, heads: int, queries: int, keys: int, head: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries ``[H, N, D]`` and a part's keys and values ``[H, T, D]`` in bf16, the KV as
    views of a ``[L, 2, H, T, D]`` segment (as the runner hands them)."""
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(heads, queries, head, generator=gen).to(torch.bfloat16)
    segment = (torch.randn(2, 2, heads, keys, head, generator=gen) * 2).to(torch.bfloat16)
    return query, segment[1, 0], segment[1, 1]


def float64_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    scale: float,
    visible: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention in float64; ``visible`` ``[N, T]`` bool: which keys each query sees."""
    scores = query.double() @ keys.double().transpose(-1, -2) * scale
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    return torch.softmax(scores, -1) @ values.double(), torch.logsumexp(scores, -1)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    heads=st.integers(1, 3),
    queries=st.integers(1, 40),
    keys=st.integers(1, 1300),
    head=st.sampled_from([32, 64, 128, 256]),
)
def test_the_prefix_kernel_equals_float64_attention(
    prefix_kernel: object, seed: int, heads: int, queries: int, keys: int, head: int
) -> None:
    """Any count of queries (blocks of 8 and a rest), any length of keys (tiles of 32,
    chunks of up to 512 merged, a tail that must weigh nothing), every head size."""
    query, k, v = prefix_case(seed, heads, queries, keys, head)
    scale = head**-0.5
    out, lse = prefix_kernel.prefix_attention(query, k, v, scale)  # type: ignore[attr-defined]
    assert out.dtype == lse.dtype == torch.float32
    assert out.shape == (heads, queries, head) and lse.shape == (heads, queries)
    want, want_lse = float64_attention(query, k, v, scale)
    # The weights are rounded to bf16 before the value sum (2**-8 each, relative).
    assert float(((out.double() - want).abs() - 2**-7 * (want.abs() + 1)).max()) <= 0
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-4, rtol=1e-5)


# A chunk's own keys: heads of groups of queries, its tokens after `past` earlier keys
# (past 512, the keys fall into several of the kernels' items).
CHUNKS = {
    "seed": st.integers(0, 2**31),
    "heads": st.integers(1, 3),
    "groups": st.integers(1, 3),
    "tokens": st.integers(1, 40),
    "past": st.integers(0, 1300),
    "head": st.sampled_from([32, 64, 128, 256]),
}


@settings(max_examples=30, deadline=None)
@given(**CHUNKS)
def test_the_causal_kernel_equals_float64_attention_under_the_chunks_mask(
    prefix_kernel: object, seed: int, heads: int, groups: int, tokens: int, past: int, head: int
) -> None:
    """A chunk's own keys (``causal_tokens``): grouped heads folded into the queries (row r
    is token r % Q), each token seeing the keys before it and itself, however the keys fall
    into the kernel's chunks (past 512, some rows see none of a chunk)."""
    query, k, v = prefix_case(seed, heads, groups * tokens, past + tokens, head)
    scale = head**-0.5
    out, lse = prefix_kernel.prefix_attention(query, k, v, scale, causal_tokens=tokens)  # type: ignore[attr-defined]
    token = torch.arange(groups * tokens) % tokens
    visible = torch.arange(past + tokens)[None, :] <= token[:, None] + past
    want, want_lse = float64_attention(query, k, v, scale, visible)
    assert float(((out.double() - want).abs() - 2**-7 * (want.abs() + 1)).max()) <= 0
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-4, rtol=1e-5)


def spy_on_native_prefix(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each later ``native_prefix`` call was served by the kernel, in order."""
    served: list[bool] = []
    real = attention.native_prefix

    def spy(*args: object) -> object:
        got = real(*args)  # type: ignore[arg-type]
        served.append(got is not None)
        return got

    monkeypatch.setattr(attention, "native_prefix", spy)
    return served


@pytest.fixture(scope="module")
def f32_prefix_kernel(kernels: object) -> object:
    if not kernels.prefix_attention_f32_ready():  # type: ignore[attr-defined]
        pytest.skip("this CPU has no AVX2 and FMA: torch's flash kernel reads float32 parts")
    return kernels


@settings(max_examples=30, deadline=None)
@given(**CHUNKS, causal=st.booleans())
def test_the_float32_kernel_equals_float64_attention(
    f32_prefix_kernel: object,
    seed: int,
    heads: int,
    groups: int,
    tokens: int,
    past: int,
    head: int,
    causal: bool,
) -> None:
    """The float32 kernel (AVX2 and FMA), over a part or causal over a chunk's own keys:
    float32 attention, to float32's rounding, for any shape and split into items."""
    query, k, v = (
        x.float() for x in prefix_case(seed, heads, groups * tokens, past + tokens, head)
    )
    scale = head**-0.5
    out, lse = f32_prefix_kernel.prefix_attention(  # type: ignore[attr-defined]
        query, k, v, scale, causal_tokens=tokens if causal else 0
    )
    assert out.dtype == lse.dtype == torch.float32
    token = torch.arange(groups * tokens) % tokens
    visible = torch.arange(past + tokens)[None, :] <= token[:, None] + past
    want, want_lse = float64_attention(query, k, v, scale, visible if causal else None)
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse.double(), want_lse, atol=2e-5, rtol=1e-6)


def test_a_float32_warm_prefill_takes_the_kernel_where_it_comes_first(
    f32_prefix_kernel: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a build without AVX-512 (``prefix_attention_f32_first``) a float32 warm prefill's
    own keys and part go to the float32 kernel; elsewhere to torch's flash kernel. Either
    way the attention is the same up to float32 rounding."""
    served = spy_on_native_prefix(monkeypatch)
    gen = torch.Generator().manual_seed(6)
    hq, hkv, q_len, d, prefix = 6, 2, 24, 64, 700
    query = torch.randn(1, hq, q_len, d, generator=gen)
    own_k, own_v = (torch.randn(1, hkv, q_len, d, generator=gen) for _ in "kv")
    parts = [PrefixPart(torch.randn(2, 2, hkv, prefix, d, generator=gen))]
    fast = attention.merged_attention(query, own_k, own_v, None, None, parts, 1)
    first = bool(f32_prefix_kernel.prefix_attention_f32_first())  # type: ignore[attr-defined]
    assert served == [first, first]
    with native.paused():
        slow = attention.merged_attention(query, own_k, own_v, None, None, parts, 1)
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)


def test_the_causal_kernel_refuses_rows_that_are_not_whole_tokens(prefix_kernel: object) -> None:
    query, k, v = prefix_case(1, 2, 10, 12, 64)
    for tokens in (3, 13):  # 10 rows are not groups of 3 tokens; 12 keys hold no 13 tokens
        with pytest.raises(RuntimeError, match="whole groups"):
            prefix_kernel.prefix_attention(query, k, v, 0.125, causal_tokens=tokens)  # type: ignore[attr-defined]


def test_a_warm_prefill_reads_its_prefix_through_the_kernel_closer_than_torch(
    prefix_kernel: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``merged_attention`` of a multi-token prefill over a long part takes the kernel,
    for its own keys (causal) and for the part; paused, torch's flash kernel gives the
    same up to bf16 rounding, and the kernel's float32 partials are at least as close to
    float64 attention."""
    served = spy_on_native_prefix(monkeypatch)
    monkeypatch.setattr(attention, "cpu_has_amx_bf16", lambda: False)  # a CPU without AMX
    gen = torch.Generator().manual_seed(5)
    hq, hkv, q_len, d, prefix = 6, 2, 24, 64, 1500
    query = torch.randn(1, hq, q_len, d, generator=gen).to(torch.bfloat16)
    own_k, own_v = (torch.randn(1, hkv, q_len, d, generator=gen).to(torch.bfloat16) for _ in "kv")
    segment = torch.randn(2, 2, hkv, prefix, d, generator=gen).to(torch.bfloat16)
    parts = [PrefixPart(segment)]
    fast = attention.merged_attention(query, own_k, own_v, None, None, parts, 1)
    assert served == [True, True]  # the own keys, then the part
    with native.paused():
        slow = attention.merged_attention(query, own_k, own_v, None, None, parts, 1)
    keys = torch.cat([segment[1, 0], own_k[0]], 1).repeat_interleave(hq // hkv, 0)
    values = torch.cat([segment[1, 1], own_v[0]], 1).repeat_interleave(hq // hkv, 0)
    causal = torch.ones(q_len, prefix + q_len, dtype=torch.bool).tril(prefix)
    scores = (query[0].double() @ keys.double().transpose(-1, -2)) * d**-0.5
    want = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1) @ values.double()
    want = want.transpose(0, 1)  # [Q, Hq, D]
    torch.testing.assert_close(fast[0].float(), slow[0].float(), atol=2**-6, rtol=2**-6)
    assert (fast[0].double() - want).abs().mean() <= (slow[0].double() - want).abs().mean()


def test_on_a_cpu_with_amx_tiles_off_the_prefix_goes_to_torchs_flash_kernel(
    prefix_kernel: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where AMX multiplies torch's flash kernel's tiles and Hearth's tiles are switched
    off (``HEARTH_AMX=0``), torch's kernel beats the vector path: the native kernel
    declines, and the warm prefill's attention is torch's, as with the kernel off. With
    the tiles on (where the CPU has them), the native kernel serves."""
    monkeypatch.setattr(attention, "cpu_has_amx_bf16", lambda: True)
    query, k, v = prefix_case(0, 2, 24, 700, 64)
    segment = torch.stack([k, v])[None].repeat(2, 1, 1, 1, 1)  # [L, 2, H, T, D]
    own = query[None, :, :3].contiguous()
    parts = [PrefixPart(segment)]
    try:
        prefix_kernel.use_attention_amx(False)  # type: ignore[attr-defined]
        assert attention.native_prefix(query[None], k[None], v[None], 0.125) is None
        got = attention.merged_attention(own, own, own, None, None, parts, 1)
        with native.paused():
            want = attention.merged_attention(own, own, own, None, None, parts, 1)
        assert torch.equal(got, want)
    finally:
        tiles = prefix_kernel.use_attention_amx(True)  # type: ignore[attr-defined]
    served = attention.native_prefix(query[None], k[None], v[None], 0.125)
    assert (served is not None) is tiles


def test_the_prefix_kernel_refuses_what_it_cannot_take(prefix_kernel: object) -> None:
    """A Python error, never a crash or a wrong read; ``native_prefix`` declines the
    dtypes and layouts a model can have before the call (torch serves them)."""
    query, k, v = prefix_case(0, 2, 4, 40, 64)
    calls = {
        "float16": lambda: (query.half(), k.half(), v.half()),
        "mixed dtypes": lambda: (query.float(), k, v),
        "head size 48": lambda: (query[..., :48], k[..., :48], v[..., :48]),
        "other heads": lambda: (query[:1], k, v),
        "values shorter": lambda: (query, k, v[:, :30]),
        "strided head dimension": lambda: (query[..., ::2], k[..., ::2], v[..., ::2]),
        "keys elsewhere": lambda: (query, k.to("meta"), v),
    }
    for name, args in calls.items():
        with pytest.raises(RuntimeError):
            prefix_kernel.prefix_attention(*args(), 0.125)  # type: ignore[attr-defined]
        q, kk, vv = args()
        if name in {"float16", "mixed dtypes", "head size 48", "strided head dimension"}:
            assert attention.native_prefix(q[None], kk[None], vv[None], 0.125) is None, name
    assert native.module() is not None  # declined, not refused: the kernels stay on


def test_a_call_the_kernel_refuses_falls_back_to_torch_and_logs_once(
    kernels: object, caplog: pytest.LogCaptureFixture
) -> None:
    """A value the kernel refuses (here keys whose head size differs from the query's)
    is never a failed request: torch serves that call and every later one."""
    query, own_k, own_v, _keep, _parts = random_case(Shape(seed=3))
    wide = torch.randn(1, 1, 8, 64)
    bad = PrefixPart(torch.randn(2, 2, 1, 5, 32))  # 32-wide prefix keys
    with pytest.raises(RuntimeError, match="head size"):
        native_call(kernels, query, own_k, own_v, None, [bad], 0.125)
    caplog.set_level(logging.WARNING, logger="hearth_engine.model.native")
    try:
        assert attention.native_decode(query, own_k, own_v, None, 0.125, [bad], 1) is None
        assert native.module() is None and native.state() == "failed"
        assert "head size" in (native.error() or "")
        assert attention.native_decode(query, wide, wide, None, 0.125, (), 1) is None
        assert len([r for r in caplog.records if "disabled" in r.getMessage()]) == 1
    finally:
        native.reset()
        assert native.load() is not None


def test_without_a_compiler_the_engine_serves_with_torchs_kernels(tmp_path: Path) -> None:
    """A host that cannot build the kernel (here: no C++ compiler, an empty cache)
    logs one line and decodes with torch's kernels: the same greedy tokens as the
    kernel gives (float32)."""
    script = textwrap.dedent(
        """
        import json, logging, sys
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")
        from hearth_engine.model import native
        from hearth_engine.model.runner import ModelRunner
        runner = ModelRunner.load("tiny", dtype="float32")
        native.wait()  # a build started in the background: its outcome
        buffer = runner.new_buffer(1, 64)
        logits = runner.prefill(buffer, list(range(5, 25)))
        tokens = []
        for i in range(8):
            token = int(logits[-1].argmax())
            tokens.append(token)
            logits = runner.decode(buffer, [token], [20 + i], None, ())
        print(json.dumps({"state": native.state(), "tokens": tokens}))
        """
    )
    results = {}
    for name, env in (
        ("broken", {"HEARTH_CACHE_DIR": str(tmp_path / "cache"), "CXX": "/nonexistent/c++"}),
        ("native", {}),
    ):
        models = Path(os.environ.get("HEARTH_CACHE_DIR", Path.home() / ".cache" / "hearth"))
        full_env = {**os.environ, "PYTHONPATH": f"{ROOT / 'engine'}", **env}
        if name == "broken":  # the tiny model from the usual cache; the kernel cache empty
            (tmp_path / "cache").mkdir()
            (tmp_path / "cache" / "models").symlink_to(models / "models")
        done = subprocess.run(
            [sys.executable, "-c", script], env=full_env, capture_output=True, text=True,
            timeout=600, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
        if name == "broken":
            lines = [x for x in done.stderr.splitlines() if "Native kernels" in x]
            assert len(lines) == 1 and "unavailable" in lines[0], done.stderr[-3000:]
            assert "Traceback" not in done.stderr
    assert results["broken"]["state"] == "failed"
    assert results["native"]["state"] == "active"
    assert results["broken"]["tokens"] == results["native"]["tokens"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_fused_norm_and_rotary_equal_torchs_operators(
    kernels: object, dtype: torch.dtype
) -> None:
    """In bfloat16 bit for bit (the same roundings); in float32 within a few ulps (the
    sum of squares is added up in another order)."""
    gen = torch.Generator().manual_seed(5)
    x = (torch.randn(3, 5, 576, generator=gen) * 3).to(dtype)
    weight = torch.randn(576, generator=gen).to(dtype)
    qkv = torch.randn(2, 4, 15, 64, generator=gen).to(dtype)  # q/k are a strided view
    cos = torch.randn(2, 4, 64, generator=gen).to(dtype)[:, :, None]
    sin = torch.randn(2, 4, 64, generator=gen).to(dtype)[:, :, None]
    for call in (lambda: rms_norm(x, weight, 1e-5), lambda: _rotate(qkv[:, :, :12], cos, sin)):
        fused = call()
        with native.paused():
            plain = call()
        assert fused.dtype == dtype and fused.shape == plain.shape
        if dtype == torch.bfloat16:
            assert torch.equal(fused, plain)
        else:
            torch.testing.assert_close(fused, plain, atol=1e-5, rtol=1e-5)
    assert native.module() is not None  # nothing was refused


def test_a_fused_call_the_kernel_refuses_is_computed_by_torch(kernels: object) -> None:
    """cos/sin of another batch size than x: the kernel refuses, the result still comes
    (torch broadcasts), and torch's operators serve from then on."""
    x = torch.randn(2, 1, 3, 64)
    cos, sin = torch.randn(1, 1, 1, 64), torch.randn(1, 1, 1, 64)
    with native.paused():
        want = _rotate(x, cos, sin)
    try:
        assert torch.equal(_rotate(x, cos, sin), want)
        assert native.state() == "failed" and "rope" in (native.error() or "")
    finally:
        native.reset()
        assert native.load() is not None


def test_a_lock_left_by_a_killed_build_neither_hangs_nor_blocks_the_kernels(
    tmp_path: Path,
) -> None:
    """cpp_extension waits for its ``lock`` file forever; a stale one is removed, and a
    built module beside it is loaded."""
    folder = native.build_dir()
    stale = tmp_path / "lock"
    stale.write_text("")
    old = time.time() - 2 * native.STALE_LOCK_S
    os.utime(stale, (old, old))
    built = next(folder.glob(f"{native.NAME}*.so"))
    copy = tmp_path / built.name
    copy.write_bytes(built.read_bytes())
    module = native._load_or_build(tmp_path)
    assert hasattr(module, "decode_attention")
    assert not stale.exists()


def test_prefix_rows_out_of_range_are_refused_not_read(kernels: object) -> None:
    query, own_k, own_v, _keep, _parts = random_case(Shape(seed=4, rows=2))
    part = PrefixPart(torch.randn(2, 2, 1, 20, 64), torch.tensor([0, 2]))
    with pytest.raises(RuntimeError, match="out of range"):
        native_call(kernels, query, own_k, own_v, None, [part], 0.125)


def test_a_part_read_by_no_row_is_read_by_no_row_in_the_kernel_and_in_torch(
    kernels: object,
) -> None:
    """Regression: an empty row list meant "all rows" to the kernel, while torch's path
    handed torch's CPU flash attention a part with no queries (a SIGFPE). Both now leave
    a part that no row reads out."""
    query, own_k, own_v, keep, parts = random_case(Shape(seed=9, rows=2, part_lengths=(30,)))
    nobody = PrefixPart(torch.randn(2, 2, 1, 40, 64), torch.empty(0, dtype=torch.long))
    scale = 0.125
    want = reference(query, own_k, own_v, keep, parts, 1, scale)  # without the part
    got = native_call(kernels, query, own_k, own_v, keep, [*parts, nobody], scale)
    assert float((got.double() - want).abs().max()) <= TOLERANCE[torch.float32] * 10
    with native.paused():
        slow = attention.merged_attention(query, own_k, own_v, None, scale, [*parts, nobody], 1)
    torch.testing.assert_close(slow[:, 0].double(), want, atol=1e-5, rtol=1e-5)
    assert native.module() is not None  # nothing was refused


def test_the_kernels_refuse_what_they_cannot_take_instead_of_crashing(kernels: object) -> None:
    """Zero heads or widths were a division by zero (SIGFPE: the process died), and a
    tensor on another device was read as CPU memory. Each is a RuntimeError now. Run in
    a child process, so that a crash fails this test rather than the whole run."""
    script = textwrap.dedent(
        """
        import json, torch
        from hearth_engine.model import native
        k = native.load()
        q, kv = torch.randn(1, 2, 64), torch.randn(1, 1, 4, 64)
        calls = {
            "no kv heads": lambda: k.decode_attention(
                q, torch.randn(1, 0, 4, 64), torch.randn(1, 0, 4, 64), None, [], [], [], 0.1),
            "no query heads": lambda: k.decode_attention(
                torch.randn(1, 0, 64), kv, kv, None, [], [], [], 0.1),
            "query elsewhere": lambda: k.decode_attention(
                q.to("meta"), kv, kv, None, [], [], [], 0.1),
            "mask elsewhere": lambda: k.decode_attention(
                q, kv, kv, torch.ones(1, 4, dtype=torch.bool, device="meta"), [], [], [], 0.1),
            "float rows": lambda: k.decode_attention(
                q, kv, kv, None, [torch.randn(1, 3, 64)], [torch.randn(1, 3, 64)],
                [torch.tensor([0.0])], 0.1),
            "zero width norm": lambda: k.rms_norm(torch.randn(2, 0), torch.randn(0), 1e-5),
            "norm weight elsewhere": lambda: k.rms_norm(
                torch.randn(2, 8), torch.randn(8, device="meta"), 1e-5),
            "zero head rope": lambda: k.rope(
                torch.randn(1, 1, 2, 0), torch.randn(1, 1, 1, 0), torch.randn(1, 1, 1, 0)),
            "rope cos elsewhere": lambda: k.rope(
                torch.randn(1, 1, 2, 8), torch.randn(1, 1, 1, 8, device="meta"),
                torch.randn(1, 1, 1, 8)),
        }
        refused = {}
        for name, call in calls.items():
            try:
                call()
                refused[name] = None
            except RuntimeError as err:
                refused[name] = str(err).splitlines()[0]
        print(json.dumps(refused))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "engine")}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"the kernel process died ({done.returncode}): {done.stderr}"
    refused = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(refused.values()), refused


def test_the_lock_of_a_killed_build_is_removed_at_once(kernels: object, tmp_path: Path) -> None:
    """Regression: a fresh ``lock`` (a build killed a moment ago: a test's background
    build ends with its process) was waited for forever by cpp_extension. Whoever holds
    the build lock (an OS lock, gone with its process) knows nobody builds: it removes
    such a ``lock`` and loads the module beside it."""
    folder = tmp_path / "build"
    folder.mkdir()
    built = next(native.build_dir().glob(f"{native.NAME}*.so"))
    (folder / built.name).write_bytes(built.read_bytes())
    lock = folder / "lock"
    lock.write_text("")
    result: list[object] = []
    loader = threading.Thread(
        target=lambda: result.append(native._load_or_build(folder)), daemon=True
    )
    loader.start()
    loader.join(120)  # a hang guard: it does not wait for the lock at all
    assert not loader.is_alive(), "waiting for the lock of a build that is gone"
    assert hasattr(result[0], "decode_attention")
    assert not lock.exists()


def test_a_build_held_elsewhere_is_waited_for_in_a_bounded_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another build that holds the build lock is waited for, looking again every
    ``LOCK_POLL_S``, up to ``STALE_LOCK_S``: then the kernels are skipped, never hung."""
    monkeypatch.setattr(native, "STALE_LOCK_S", 0.3)
    monkeypatch.setattr(native, "LOCK_POLL_S", 0.05)
    folder = tmp_path / "build"
    with native._build_lock(folder), pytest.raises(TimeoutError, match="another process"):
        native._load_or_build(folder)
    with native._build_lock(folder):  # released: the next one gets it at once
        pass


def test_the_build_is_keyed_by_every_kernel_source() -> None:
    """Every .cpp is compiled and every .h hashed into the build folder's key: a header
    left out of ``HEADERS`` could leave a stale build loaded after it changed."""
    kernels = Path(native.__file__).parent / "kernels"
    assert set(native.SOURCES) == set(kernels.glob("*.cpp"))
    assert set(native.HEADERS) == set(kernels.glob("*.h"))
