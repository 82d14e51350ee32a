"""The household's report: a configuration's records summarized, the goals checked, the
table and the plot.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..common import percentile, print_table
from .replay import CONFIGS, SPLIT, Record
from .trace import Step

GOAL_HIT_RATE = 0.97
GOAL_VS_NO_CACHE = 0.2
GOAL_VS_LAST_PROMPT = 0.5
GOAL_STALL = 2.0


def summarize(
    name: str, run: dict[str, Any], records: list[Record], window: set[tuple[int, int]]
) -> dict[str, Any]:
    ok = [r for r in records if r.error is None]
    reported = [r for r in ok if r.cached_tokens is not None]
    prompt = sum(r.prompt_tokens for r in reported)
    cached = sum(r.cached_tokens or 0 for r in reported)
    unknown = bool(ok) and not reported  # the server reports no cached tokens at all
    peaks = run["peaks"] or {}  # None: an external server reports no KV counters
    ttft = [r.ttft_ms for r in ok]
    engine_ttft = [r.engine_ttft_ms for r in ok if r.engine_ttft_ms is not None]
    in_window = [r.ttft_ms for r in ok if r.key in window]
    idle = [r.ttft_ms for r in ok if r.key not in window]
    debounce = [r.ttft_ms for r in ok if r.in_debounce and r.key not in window]
    stats = run["stats"]
    stall = (
        round(percentile(in_window, 0.95) / percentile(idle, 0.95), 3)
        if in_window and idle
        else None
    )
    repinned = run.get("repin_tokens") or []
    repin_total = sum(tokens for _, tokens in repinned)
    return {
        "config": run.get("label", name),
        "cache_mode": CONFIGS[name][0],
        "pins": CONFIGS[name][1],
        "switch_after_pin": CONFIGS[name][2],
        "requests": len(records),
        "errors": len(records) - len(ok),
        "hit_rate": None if unknown else round(cached / prompt, 4) if prompt else 0.0,
        "prompt_tokens": prompt,
        "reused_tokens": None if unknown else cached,
        "ttft_p50_ms": round(percentile(ttft, 0.5), 1),
        "ttft_p95_ms": round(percentile(ttft, 0.95), 1),
        "ttft_max_ms": round(max(ttft, default=0.0), 1),
        # None: the server reports no engine-side TTFT (only Hearth does).
        "engine_ttft_p50_ms": round(percentile(engine_ttft, 0.5), 1) if engine_ttft else None,
        "engine_ttft_p95_ms": round(percentile(engine_ttft, 0.95), 1) if engine_ttft else None,
        "total_p50_ms": round(percentile([r.total_ms for r in ok], 0.5), 1),
        # Reply: the time to the last token (``--max-tokens 32`` for a voice-like reply).
        "reply_p50_ms": round(percentile([r.total_ms for r in ok], 0.5), 1),
        "reply_p95_ms": round(percentile([r.total_ms for r in ok], 0.95), 1),
        "prefill_tok_s": stats.get("prefill_tokens_per_s"),
        "prefill_tokens": stats.get("prefill_tokens_total"),
        "kv_peak_bytes": peaks.get("kv_total_bytes"),
        "kv_cache_peak_bytes": peaks.get("kv_cache_used_bytes"),
        "kv_working_peak_bytes": peaks.get("kv_working_bytes"),
        "evictions": stats.get("kv_cache_evictions_total"),
        **ttft_split(ok),
        "repin_stall_ratio": stall,
        "repin_window_requests": len(in_window),
        "repin_window_ttft_p95_ms": round(percentile(in_window, 0.95), 1),
        "idle_ttft_p95_ms": round(percentile(idle, 0.95), 1),
        "debounce_requests": len(debounce),
        "debounce_ttft_p95_ms": round(percentile(debounce, 0.95), 1),
        "pin_ms": run["pin_ms"],
        # The share of the re-pins' tokens the engine computed (None: no re-pin reported).
        "repin_prefilled_share": (
            round(sum(p for p, _ in repinned) / repin_total, 4) if repin_total else None
        ),
        "repin_windows_s": run["repin_windows_s"],
        "state_changes": run["state_changes"],
        "wall_s": run["wall_s"],
    }


def ttft_split(ok: list[Record]) -> dict[str, Any]:
    """p50/p95 of the server's parts, the client's first chunk, and the unnamed gap."""
    split = [r for r in ok if "prefill_ms" in r.split]
    out: dict[str, Any] = {
        "first_chunk_p50_ms": round(percentile([r.first_chunk_ms for r in ok], 0.5), 1),
        "first_chunk_p95_ms": round(percentile([r.first_chunk_ms for r in ok], 0.95), 1),
        "call_decode_p95_ms": round(
            percentile([r.ttft_ms - r.first_chunk_ms for r in ok], 0.95), 1
        ),
    }
    if not split:
        return {**out, "split": None, "client_gap_p95_ms": None}
    server = [sum(r.split.get(k, 0.0) for k in SPLIT[:4]) for r in split]
    gaps = [r.first_chunk_ms - t for r, t in zip(split, server, strict=True)]
    out["split"] = {
        part: {
            "p50": round(percentile([r.split.get(part, 0.0) for r in split], 0.5), 1),
            "p95": round(percentile([r.split.get(part, 0.0) for r in split], 0.95), 1),
        }
        for part in SPLIT
    }
    out["server_ttft_p95_ms"] = round(percentile(server, 0.95), 1)
    out["client_gap_p95_ms"] = round(percentile(gaps, 0.95), 1)
    return out


def fallback_window(trace: Sequence[Step]) -> set[tuple[int, int]]:
    """Without a hearth run: the requests of the two request steps after each rename."""
    window: set[tuple[int, int]] = set()
    for number, step in enumerate(trace):
        if step.kind != "rename":
            continue
        following = [
            (n, s) for n, s in enumerate(trace) if n > number and s.kind in ("request", "burst")
        ]
        for n, s in following[:2]:
            window |= {(n, i) for i in range(len(s.calls))}
    return window


def goal_lines(configs: dict[str, dict[str, Any]]) -> list[tuple[bool, str]]:
    hearth = configs.get("hearth")
    if hearth is None:
        return []
    lines = [
        (
            hearth["hit_rate"] >= GOAL_HIT_RATE,
            f"hearth hit rate {hearth['hit_rate']:.2%} >= {GOAL_HIT_RATE:.0%}",
        )
    ]
    for other, factor in (("no_cache", GOAL_VS_NO_CACHE), ("last_prompt", GOAL_VS_LAST_PROMPT)):
        if other in configs:
            bound = factor * configs[other]["ttft_p95_ms"]
            lines.append(
                (
                    hearth["ttft_p95_ms"] <= bound,
                    f"hearth p95 TTFT {hearth['ttft_p95_ms']:.0f} ms <= {factor} x {other}"
                    f" p95 ({configs[other]['ttft_p95_ms']:.0f} ms) = {bound:.0f} ms",
                )
            )
    stall = hearth["repin_stall_ratio"]
    lines.append(
        (
            stall is not None and stall <= GOAL_STALL,
            f"hearth re-pin stall ratio {stall if stall is not None else 'n/a'} <= {GOAL_STALL}"
            f" ({hearth['repin_window_requests']} requests during re-pins)",
        )
    )
    return lines


TABLE = [
    ("config", "config"), ("hit rate", "hit_rate"), ("reused tok", "reused_tokens"),
    ("TTFT p50 ms", "ttft_p50_ms"), ("TTFT p95 ms", "ttft_p95_ms"),
    ("reply p50 ms", "reply_p50_ms"), ("reply p95 ms", "reply_p95_ms"),
    ("engine p95 ms", "engine_ttft_p95_ms"), ("1st chunk p95", "first_chunk_p95_ms"),
    ("gap p95 ms", "client_gap_p95_ms"), ("prefill tok/s", "prefill_tok_s"),
    ("KV peak MiB", "kv_peak_mib"), ("evictions", "evictions"),
    ("stall ratio", "repin_stall_ratio"), ("re-pin prefilled", "repin_prefilled_share"),
    ("errors", "errors"), ("wall s", "wall_s"),
]  # fmt: skip


def print_report(configs: dict[str, dict[str, Any]]) -> None:
    rows = []
    for result in configs.values():
        peak = result["kv_peak_bytes"]
        view = {**result, "kv_peak_mib": None if peak is None else peak / 2**20}
        rows.append(["n/a" if view[key] is None else view[key] for _, key in TABLE])
    print_table([h for h, _ in TABLE], rows)
    for result in configs.values():
        if result.get("split"):
            parts = ", ".join(
                f"{k.removesuffix('_ms')} {v['p50']:.0f}/{v['p95']:.0f}"
                for k, v in result["split"].items()
            )
            print(
                f"{result['config']}: first token p50/p95 ms: {parts};"
                f" call decode p95 {result['call_decode_p95_ms']:.0f}"
            )


def plot(path: Path, runs: dict[str, list[Record]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, records in runs.items():
        values = sorted(r.ttft_ms for r in records if r.error is None)
        if values:
            ys = [(i + 1) / len(values) for i in range(len(values))]
            ax.step(values, ys, where="post", label=f"{name} (n={len(values)})")
    ax.set_xscale("log")
    ax.set_xlabel("client TTFT (ms, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")
