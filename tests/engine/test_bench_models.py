"""``scripts/bench models --quick`` on a full-attention family and a hybrid one.

Checks the JSON rows' fields and types, not the figures (no timing asserts), and that
every family's real shape builds as a transformers config the engine judges as expected.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hearth_bench.families import FAMILIES, Family, scale_kinds
from hearth_bench.models import FIELDS, main, parse_args, refusal


def _is_ms(value: Any) -> bool:
    return isinstance(value, float) and value > 0


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("models") / "rows.json"
    argv = ["--quick", "--families", "qwen3-0.6b", "lfm2-350m", "--dtype", "float32"]
    assert main([*argv, "--json", str(out)]) == 0
    return list(json.loads(out.read_text()))


def test_every_row_has_every_field(rows: list[dict[str, Any]]) -> None:
    assert [r["family"] for r in rows] == ["qwen3-0.6b", "lfm2-350m"]
    for row in rows:
        assert list(row) == list(FIELDS)


def test_a_full_attention_family_is_measured(rows: list[dict[str, Any]]) -> None:
    row = rows[0]
    assert row["shape"] == "h1024 L2/28 heads 16/8 V151936"
    assert row["loads"] is True and row["exact"] is True and row["reason"] is None
    for key in ("cold_ttft_ms", "warm_ttft_ms", "floor_ms", "decode_ms_per_token"):
        assert _is_ms(row[key]), key
    assert isinstance(row["restore_ms"], float) and row["restore_ms"] >= 0
    assert row["cold_over_warm"] == pytest.approx(row["cold_ttft_ms"] / row["warm_ttft_ms"], 0.01)
    # float32 K and V of 2 layers, 8 KV heads of 128: 2 * 2 * 8 * 128 * 4 bytes.
    assert row["kv_bytes_per_token"] == 16384


def test_a_hybrid_family_is_measured_with_its_state(rows: list[dict[str, Any]]) -> None:
    row = rows[1]
    assert row["shape"] == "h1024 L2/16 1conv+1full_attention heads 16/8 V65536"
    assert row["loads"] is True and row["exact"] is True and row["reason"] is None
    for key in ("cold_ttft_ms", "warm_ttft_ms", "floor_ms", "decode_ms_per_token"):
        assert _is_ms(row[key]), key
    # KV for the one attention layer: 2 * 8 * 64 * 4 bytes; the conv layer keeps a state
    # of 3 * 1024 float32 values per pin instead.
    assert row["kv_bytes_per_token"] == 4096
    assert row["state_bytes"] == 3 * 1024 * 4
    assert rows[0]["state_bytes"] is None


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_each_real_shape_loads(family: Any) -> None:
    assert refusal(family, family.memory_layers or family.layers) is None


def test_a_refused_family_says_why() -> None:
    falcon = Family(
        "falcon-h1", "falcon_h1",
        {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
         "mamba_d_ssm": 64, "mamba_n_heads": 4, "mamba_d_head": 16, "mamba_d_state": 16},
    )  # fmt: skip
    assert "falcon_h1 has layer types Hearth cannot cache yet: hybrid (2 of 2)" in str(
        refusal(falcon, 2)
    )


def test_scaled_layers_keep_every_kind() -> None:
    kinds = ["s"] * 5 + ["f"]
    assert scale_kinds(kinds * 3, 2) == ["s", "f"]
    assert scale_kinds(kinds * 3, 6) == kinds
    assert scale_kinds(kinds, 10) == kinds


def test_the_options(tmp_path: Path) -> None:
    quick = parse_args(["--quick"])
    assert (quick.prefix, quick.runs, quick.kv_cache_mb) == (256, 1, 512)
    full = parse_args([])
    assert (full.prefix, full.runs) == (2048, 3)
    assert full.families == [f.name for f in FAMILIES]
    with pytest.raises(SystemExit):
        parse_args(["--families", "gpt-5"])
