"""The figures of a server without Hearth's ``/v1/stats``, in its keys.

Sensors read Hearth's stat keys (``sensor.py``). For llama.cpp, vLLM, SGLang and other
OpenAI-compatible servers this module builds the same keys from what the server
reports, and leaves out every key it cannot report, so that sensor is unavailable
rather than a guess:

* per request (``RequestWindow``): the prompt and cached tokens the server put in
  ``usage.prompt_tokens_details.cached_tokens`` or llama.cpp's ``timings.cache_n``, the
  time to the first token (measured by the client where the server does not say), and
  llama.cpp's prefill and decode speeds;
* from ``/metrics`` (Prometheus text): vLLM's prefix-cache counters and KV usage,
  SGLang's hit rate and token usage, llama.cpp's token counters; a process start time,
  where exported, tells a restart (the pin manager then primes again).
"""

from __future__ import annotations

import contextlib
import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from .api import RequestUsage
from .server_info import ServerKind

WINDOW = 64  # recent requests behind the windowed figures (as the engine's window)

# Per kind: Hearth stat key -> metric sample names, the first one exported wins.
_METRICS: dict[ServerKind, dict[str, tuple[str, ...]]] = {
    ServerKind.VLLM: {
        "prefix_cache_hits_tokens": ("vllm:prefix_cache_hits_total",),
        "prompt_tokens_total": ("vllm:prompt_tokens_total",),
        "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    },
    ServerKind.SGLANG: {
        "window_hit_rate": ("sglang:cache_hit_rate",),
        "prompt_tokens_total": ("sglang:prompt_tokens_total",),
        "kv_cache_usage": ("sglang:token_usage",),
    },
    # Not llamacpp:prompt_tokens_total: it counts only the tokens it prefilled.
    ServerKind.LLAMA_CPP: {
        "kv_cache_usage": ("llamacpp:kv_cache_usage_ratio",),
    },
}
START_TIME = "process_start_time_seconds"


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text as sample name -> value, summed over labels (e.g. per model).

    A malformed body (a truncated answer, a proxy's error page) keeps every sample line
    that parses on its own.
    """
    try:
        return _samples(text)
    except ValueError:
        values: dict[str, float] = {}
        for line in text.splitlines():
            if not line.startswith("#"):
                with contextlib.suppress(ValueError):
                    for name, value in _samples(line).items():
                        values[name] = values.get(name, 0.0) + value
        return values


def _samples(text: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + float(sample.value)
    return values


class RequestWindow:
    """The recent requests the integration sent, as the server reported them."""

    def __init__(self) -> None:
        """Start empty."""
        self._recent: deque[RequestUsage] = deque(maxlen=WINDOW)
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.cache_reported = False  # the server said how many tokens it reused

    def record(self, requests: Iterable[RequestUsage]) -> None:
        """Add a turn's requests."""
        for usage in requests:
            self._recent.append(usage)
            self.prompt_tokens += usage.prompt_tokens
            if usage.cached_tokens is not None:
                self.cached_tokens += usage.cached_tokens
                self.cache_reported = True

    def stats(self) -> dict[str, Any]:
        """The windowed figures in Hearth's stat keys (only those the server reported)."""
        recent = list(self._recent)
        stats: dict[str, Any] = {"window_requests": len(recent)}
        if recent:
            stats["prompt_tokens_total"] = self.prompt_tokens
        ttfts = [u.ttft_ms for u in recent if u.ttft_ms is not None]
        stats["ttft_ms_median"] = statistics.median(ttfts) if ttfts else None
        # The last of the 20-quantiles' cut points: the 95th percentile.
        stats["ttft_ms_p95"] = (
            statistics.quantiles(ttfts, n=20, method="inclusive")[-1] if ttfts else None
        )
        if recent:
            stats["last_request"] = {"ttft_ms": recent[-1].ttft_ms}
        if self.cache_reported:
            stats["prefix_cache_hits_tokens"] = self.cached_tokens
            reported = [u for u in recent if u.cached_tokens is not None]
            prompt = sum(u.prompt_tokens for u in reported)
            cached = sum(u.cached_tokens or 0 for u in reported)
            stats["window_hit_rate"] = cached / prompt if prompt else None
        speeds = [u for u in recent if u.prefill_ms is not None or u.decode_tokens_per_s]
        if speeds:
            last = speeds[-1]
            stats["decode_tokens_per_s"] = last.decode_tokens_per_s
            new_tokens = last.prompt_tokens - (last.cached_tokens or 0)
            if last.prefill_ms:
                stats["prefill_tokens_per_s"] = new_tokens / last.prefill_ms * 1000
        return stats


def server_stats(
    kind: ServerKind, metrics: Mapping[str, float] | None, window: RequestWindow
) -> dict[str, Any]:
    """Hearth's stat keys for a server of ``kind`` from its metrics and the window.

    What each request reported (the window: this integration's requests) wins; the
    server-wide metrics fill only the figures the requests did not carry.
    """
    stats = window.stats()
    for key, names in _METRICS.get(kind, {}).items() if metrics else ():
        value = next((metrics[name] for name in names if name in metrics), None)
        if value is not None and stats.get(key) is None:
            stats[key] = value
    start = metrics.get(START_TIME) if metrics else None
    stats["instance_id"] = f"{kind}-{start:.0f}" if start is not None else ""
    return stats
