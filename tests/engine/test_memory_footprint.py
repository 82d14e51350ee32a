"""What the engine keeps resident (kv_budget.py, mapped.py, linear.py, hardware.py).

* A tied model's embedding is read from its output layer's decode tiles, and a head
  without a packed copy rebuilds its weights from the tiles for a wide call: both exact.
* A real server (tiny model, whose float32 file is served as float32, so transformers
  maps it) keeps no mapping of its weight files once it serves: the pages read while
  loading would otherwise stay in its RSS. ``/v1/stats`` reports its RSS and how the
  default KV budget was chosen, within the rule's bounds.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
import torch

from hearth_engine.kv_budget import CPU_CEILING, CPU_FLOOR
from hearth_engine.model import native
from hearth_engine.model.linear import TILED_MAX_ROWS, FrozenLinear
from hearth_engine.model.loader import resolve_model
from hearth_engine.model.mapped import mapped_ranges
from hearth_engine.serving import worker
from hearth_engine.serving.engine import Engine
from hearth_engine.serving.sampling import SamplingParams

from .conftest import Client, ServerProcess
from .test_engine import settle


@pytest.fixture(scope="module")
def kernels() -> object:
    module = native.load()
    assert module is not None, f"the native kernels did not build: {native.error()}"
    return module


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("features", "width"), [(100, 64), (37, 33)])
def test_head_tiles_give_the_embedding_rows_and_the_weights_exactly(
    kernels: object, dtype: torch.dtype, features: int, width: int
) -> None:
    torch.manual_seed(features)
    weight = torch.randn(features, width, dtype=dtype)
    head = FrozenLinear(weight, None, tiled=True, pack=False)
    assert head.drop_weight() and head.weight is None
    ids = torch.tensor([[0, 5, features - 1], [17, 16, 15]])
    assert torch.equal(head.rows(ids), weight[ids])
    assert torch.equal(head.untiled(), weight)
    wide = torch.randn(TILED_MAX_ROWS + 3, width, dtype=dtype)  # past the tiles' rows
    expected = torch.nn.functional.linear(wide, weight)
    assert torch.equal(head(wide), expected)


def test_mapped_ranges_finds_the_weight_files_only(tmp_path: Path) -> None:
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"")
    maps = (
        f"7f0000000000-7f0000100000 r--p 00000000 08:01 42 {weights}\n"
        "7f0000200000-7f0000300000 r-xp 00000000 08:01 43 /usr/lib/libc.so.6\n"
        "7f0000400000-7f0000500000 rw-p 00000000 00:00 0 \n"
        f"7f0000600000-7f0000700000 r--p 00100000 08:01 42 {weights}\n"
    )
    assert mapped_ranges(maps, [weights]) == [
        (0x7F0000000000, 0x7F0000100000),
        (0x7F0000600000, 0x7F0000700000),
    ]


@pytest.fixture(scope="module")
def server(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    return server_factory("--model", "tiny", "--dtype", "float32")  # the default KV budget


async def test_serving_keeps_no_mapping_of_the_weight_files(client: Client) -> None:
    reply = await client.chat(messages=[{"role": "user", "content": "hello"}], max_tokens=4)
    assert reply["usage"]["completion_tokens"] >= 1  # the embedding and head still work
    pid = client.server.proc.pid
    files = list(resolve_model("tiny").glob("*.safetensors"))
    assert files
    maps = Path(f"/proc/{pid}/maps").read_text()
    assert mapped_ranges(maps, files) == [], "a weight file is still mapped"


async def test_stats_report_rss_and_the_budget_rule(client: Client) -> None:
    stats = await client.stats()
    status = Path(f"/proc/{client.server.proc.pid}/status").read_text()
    vm_rss = next(int(x.split()[1]) * 1024 for x in status.splitlines() if x.startswith("VmRSS"))
    assert 0.5 * vm_rss < stats["process_rss_bytes"] < 2 * vm_rss
    assert stats["kv_cache_budget_rule"].startswith("a quarter of")
    assert CPU_FLOOR <= stats["kv_cache_capacity_bytes"] <= CPU_CEILING


@pytest.fixture
async def client(server: ServerProcess) -> object:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        yield Client(server, session)


async def test_an_idle_engine_gives_back_its_pooled_buffers(
    make_engine: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """After ``IDLE_RELEASE_S`` without work the pool is emptied; while requests come it
    is kept (a request's buffer is reused by the next)."""
    monkeypatch.setattr(worker, "IDLE_RELEASE_S", 3.0)
    engine = make_engine()
    prompt = [random.Random(3).randrange(3, 1000) for _ in range(200)]
    await engine.generate(prompt, SamplingParams(max_tokens=4))
    await settle(engine)
    assert engine.kv.pool.free_bytes > 0  # the request's buffer, kept for the next one
    for _ in range(150):  # the worker looks twice a second
        if engine.kv.pool.free_bytes == 0:
            break
        await asyncio.sleep(0.1)
    assert engine.kv.pool.free_bytes == 0
    _, text, _ = await engine.generate(prompt, SamplingParams(max_tokens=4))
    assert text  # it serves on afterwards
