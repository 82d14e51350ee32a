"""``scripts/bench decode``: its smallest configuration on the tiny model (a smoke test).

Checks the JSON rows' fields and types, not the figures (no timing asserts).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hearth_bench.decode import FIELDS, PRECISIONS, host_dtypes, main, parse_args

CONTEXTS = [24, 40]
BATCHES = [1, 2]
ATTENTIONS = ["native", "torch"]  # the default: both, side by side


def _is_ms(value: Any) -> bool:
    return isinstance(value, float) and value > 0


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("decode") / "rows.json"
    argv = ["--models", "tiny", "--dtypes", "float32", "--threads", "1", "--contexts"]
    argv += [str(c) for c in CONTEXTS] + ["--batches"] + [str(b) for b in BATCHES]
    argv += ["--reply-models", "tiny", "--reply-runs", "1", "--reply-tokens", "8"]
    argv += ["--json", str(out)]
    assert main(argv) == 0
    return list(json.loads(out.read_text()))


def test_every_row_has_every_field(rows: list[dict[str, Any]]) -> None:
    decode = len(CONTEXTS) * len(BATCHES) * len(ATTENTIONS)
    assert [r["kind"] for r in rows] == ["decode"] * decode + ["reply"]
    for row in rows:
        assert list(row) == list(FIELDS)
        assert row["model"] == "tiny"
        assert row["dtype"] == "float32"
        assert row["forward"] == "lean"  # the tiny model is a Qwen2
        assert row["threads"] == 1
        assert _is_ms(row["ms_per_token_p50"])
        assert _is_ms(row["ms_per_token_p90"])
        assert row["ms_per_token_p50"] <= row["ms_per_token_p90"]
        assert _is_ms(row["prefill_tok_s"])


def test_decode_rows_cover_each_context_and_batch(rows: list[dict[str, Any]]) -> None:
    decode = [r for r in rows if r["kind"] == "decode"]
    assert [(r["context"], r["batch"], r["attention"]) for r in decode] == [
        (c, b, a) for c in CONTEXTS for b in BATCHES for a in ATTENTIONS
    ]
    for row in decode:
        assert row["steps"] >= 16
        assert _is_ms(row["shared_ms_per_token_p50"])
        assert row["shared_ms_per_token_p50"] <= row["shared_ms_per_token_p90"]
        assert row["tok_s"] == pytest.approx(row["batch"] * 1000 / row["ms_per_token_p50"], 0.01)
        assert row["ttft_ms"] is None and row["reply_ms"] is None and row["tokens"] is None
        if row["batch"] == 1:  # the skeleton's overhead
            assert _is_ms(row["overhead_ms"])
        else:
            assert row["overhead_ms"] is None
        if row["batch"] == 1 and row["attention"] == "native":  # the engine's own request
            assert _is_ms(row["engine_ms_per_token"])
            assert isinstance(row["engine_tokens"], int) and row["engine_tokens"] >= 2
        else:
            assert row["engine_ms_per_token"] is None


def test_the_reply_row_times_a_request_on_the_pinned_house(rows: list[dict[str, Any]]) -> None:
    reply = rows[-1]
    assert reply["batch"] == 1
    assert _is_ms(reply["ttft_ms"]) and _is_ms(reply["reply_ms"])
    assert reply["ttft_ms"] <= reply["reply_ms"]
    assert isinstance(reply["tokens"], int) and 2 <= reply["tokens"] <= 8
    # The house prefix hits; the numbered question is prefilled, not a repeat's cache hit.
    assert isinstance(reply["context"], int) and reply["context"] > 1000
    assert reply["cached_tokens"] > 1000
    assert reply["context"] - reply["cached_tokens"] >= 5


def test_the_options() -> None:
    assert "float32" in host_dtypes()
    assert set(host_dtypes()) <= set(PRECISIONS)
    quick = parse_args(["--quick"])
    assert (quick.models, quick.contexts, quick.batches) == (["default"], [512, 2048], [1, 4])
    full = parse_args([])
    assert full.contexts == [512, 2048, 5400] and full.batches == [1, 4, 8]
    assert full.models == ["default", "qwen2.5-0.5b"]
    with pytest.raises(SystemExit):
        parse_args(["--steps", "8"])
    with pytest.raises(SystemExit):
        parse_args(["--dtypes", "int4"])


def test_a_missing_fixture_is_a_clear_exit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--models", "tiny", "--fixture", str(tmp_path / "none.json")]) == 2
    assert "household fixture not found" in capsys.readouterr().out
