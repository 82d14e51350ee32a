"""Attention's bfloat16 products on AMX tiles (``kernels/attention_amx.h`` for decode
steps, ``kernels/prefix_amx.h`` for a warm prefill over a cached part).

Where the CPU has AMX-BF16 and Linux lets the process use the tiles, the kernels compute
the scores and weighted values on them (on by default); ``use_attention_amx`` switches
between that and the vector path. Both are checked against float64 attention over the
same random cases as ``test_native.py``'s, with more queries per KV head than a tile
holds (16), so that a slice's readers are split over several tile items (decode) or
blocks and pairs of blocks (prefill). On a CPU without AMX the comparisons are skipped
(there is nothing to compare), and the switch must report the tiles off.
``HEARTH_AMX=0`` keeps the vector path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hearth_engine.model import hardware, native

from .conftest import linux_at_least
from .test_native import (
    TOLERANCE,
    Shape,
    float64_attention,
    native_call,
    prefix_case,
    random_case,
    reference,
)


@pytest.fixture(scope="module")
def kernels() -> Iterator[object]:
    module = native.load()
    assert module is not None, f"the native kernels did not build: {native.error()}"
    yield module
    module.use_attention_amx(True)  # type: ignore[attr-defined] - the default again


def test_the_tiles_are_used_where_the_cpu_and_the_os_have_them(kernels: object) -> None:
    on = kernels.use_attention_amx(True)  # type: ignore[attr-defined]
    if not hardware.cpu_has_amx_bf16():
        assert on is False
    elif linux_at_least(5, 16):  # where Linux grants a process the tile data
        assert on is True
    assert kernels.use_attention_amx(False) is False  # type: ignore[attr-defined]
    kernels.use_attention_amx(True)  # type: ignore[attr-defined]


@settings(max_examples=30, deadline=None)
@given(
    shape=st.builds(
        Shape,
        seed=st.integers(0, 2**31),
        dtype=st.just(torch.bfloat16),
        rows=st.integers(1, 4),
        kv_heads=st.integers(1, 3),
        groups=st.sampled_from([1, 3, 6, 8]),  # up to 32 queries a KV head
        head=st.sampled_from([32, 64, 96, 128]),
        own=st.integers(1, 300),
        part_lengths=st.lists(st.integers(1, 700), max_size=3).map(tuple),
        padded=st.booleans(),
        subsets=st.booleans(),
    )
)
def test_tiles_and_vectors_each_equal_float64_attention(kernels: object, shape: Shape) -> None:
    if not kernels.use_attention_amx(True):  # type: ignore[attr-defined]
        pytest.skip("this CPU or OS has no AMX tiles: the vector path is the only one")
    query, own_k, own_v, keep, parts = random_case(shape)
    scale = shape.head**-0.5
    want = reference(query, own_k, own_v, keep, parts, 1, scale)
    bound = TOLERANCE[torch.bfloat16] * (want.abs() + 1)
    for on in (True, False):
        kernels.use_attention_amx(on)  # type: ignore[attr-defined]
        got = native_call(kernels, query, own_k, own_v, keep, parts, scale)
        assert float(((got.double() - want).abs() - bound).max()) <= 0, f"tiles {on}"
    kernels.use_attention_amx(True)  # type: ignore[attr-defined]


def test_a_rows_attention_is_the_same_bits_alone_and_in_a_batch(kernels: object) -> None:
    """Three rows of 6 query heads a KV head are 18 queries: on tiles, two items per slice
    of the house. A row's result must not depend on which items its queries fell in."""
    shape = Shape(
        seed=7,
        dtype=torch.bfloat16,
        rows=3,
        kv_heads=2,
        groups=6,
        head=128,
        own=40,
        part_lengths=(900,),
    )
    query, own_k, own_v, keep, parts = random_case(shape)
    scale = shape.head**-0.5
    batch = native_call(kernels, query, own_k, own_v, keep, parts, scale)
    for row in range(shape.rows):
        alone = native_call(
            kernels,
            query[row : row + 1],
            own_k[row : row + 1],
            own_v[row : row + 1],
            keep,
            parts,
            scale,
        )
        assert torch.equal(alone[0], batch[row])


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    heads=st.integers(1, 3),
    queries=st.integers(1, 70),  # up to five blocks of 16: pairs and a lone block
    keys=st.integers(1, 1300),  # chunks of up to 512 merged, a tail that weighs nothing
    head=st.sampled_from([32, 64, 128, 256]),
)
def test_prefix_tiles_and_vectors_each_equal_float64_attention(
    kernels: object, seed: int, heads: int, queries: int, keys: int, head: int
) -> None:
    if not kernels.prefix_attention_ready() or not kernels.use_attention_amx(True):  # type: ignore[attr-defined]
        pytest.skip("this CPU or OS has no AMX tiles: the vector path is the only one")
    query, k, v = prefix_case(seed, heads, queries, keys, head)
    scale = head**-0.5
    want, want_lse = float64_attention(query, k, v, scale)
    for on in (True, False):
        kernels.use_attention_amx(on)  # type: ignore[attr-defined]
        out, lse = kernels.prefix_attention(query, k, v, scale)  # type: ignore[attr-defined]
        # The weights are rounded to bf16 before the value sum (2**-8 each, relative).
        excess = float(((out.double() - want).abs() - 2**-7 * (want.abs() + 1)).max())
        assert excess <= 0, f"tiles {on}"
        torch.testing.assert_close(lse.double(), want_lse, atol=1e-4, rtol=1e-5)
    kernels.use_attention_amx(True)  # type: ignore[attr-defined]


def test_a_querys_prefix_attention_is_the_same_bits_alone_and_among_others(
    kernels: object,
) -> None:
    """45 queries are two blocks of 16 and a rest: a query's result must not depend on
    which block, or which pair of blocks, it fell in (nor on the path's other rows)."""
    if not kernels.prefix_attention_ready():  # type: ignore[attr-defined]
        pytest.skip("this CPU has no AVX512-BF16: torch's flash kernel reads prefix parts")
    query, k, v = prefix_case(3, 2, 45, 1100, 128)
    for on in (True, False):
        kernels.use_attention_amx(on)  # type: ignore[attr-defined]
        out, lse = kernels.prefix_attention(query, k, v, 128**-0.5)  # type: ignore[attr-defined]
        for lo, hi in ((0, 1), (15, 18), (31, 45)):
            few, few_lse = kernels.prefix_attention(query[:, lo:hi], k, v, 128**-0.5)  # type: ignore[attr-defined]
            assert torch.equal(few, out[:, lo:hi]), f"tiles {on}, queries {lo}-{hi}"
            assert torch.equal(few_lse, lse[:, lo:hi]), f"tiles {on}, queries {lo}-{hi}"
    kernels.use_attention_amx(True)  # type: ignore[attr-defined]


def _loaded_with(env: dict[str, str]) -> str:
    """The engine's log of loading the kernels in a fresh process with ``env`` added."""
    code = (
        "import logging; logging.basicConfig(level=logging.INFO)\n"
        "from hearth_engine.model import native; assert native.load() is not None\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return done.stderr


def test_hearth_amx_0_keeps_the_vector_path(kernels: object) -> None:
    tiles = kernels.use_attention_amx(True)  # type: ignore[attr-defined]
    assert ("on AMX tiles" in _loaded_with({})) is tiles
    assert "on AMX tiles" not in _loaded_with({"HEARTH_AMX": "0"})
