"""Prometheus metrics, named ``hearth:*`` with vLLM's meanings where they exist.

Counters and gauges are read from the engine at scrape time; the latency histograms are
observed as requests finish. A scrape runs on the event loop and never waits for the
worker: counters are plain numbers, the cache's figures are the immutable ``CacheStats``
it publishes after each change, and the working buffers' the ``KVUsage`` the worker
publishes after each step (walking the worker's live sequences from here raced with it).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from importlib import metadata
from statistics import median
from typing import TYPE_CHECKING, Any

import psutil
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .. import cpu_class
from ..model import native
from .schemas import HEARTH_EXTENSIONS

if TYPE_CHECKING:
    from ..serving.engine import Engine
    from ..serving.sequence import RequestStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1, 2, 5, 10, 20, 40, 80, 160)


def engine_version() -> str:
    """The installed hearth-engine package's version ("unknown" when run from a tree)."""
    try:
        return metadata.version("hearth-engine")
    except metadata.PackageNotFoundError:
        return "unknown"


def _rss() -> int:
    """This process's resident memory in bytes (what a small box has to spare for it)."""
    return int(psutil.Process().memory_info().rss)


def _rate(part: float, whole: float, digits: int = 6) -> float:
    return round(part / whole, digits) if whole else 0.0


def engine_stats(engine: Engine) -> dict[str, Any]:
    """The engine's counters and cache figures: the body of ``/v1/stats`` (and ``/metrics``)."""
    c = engine.counters
    kv = engine.kv
    cache = kv.cache.stats()  # published snapshots: no lock, no live walk
    usage = kv.usage
    return {
        "instance_id": engine.instance_id,
        "uptime_s": round(time.time() - engine.started_at, 3),
        "version": engine_version(),
        "extensions": list(HEARTH_EXTENSIONS),
        "model": engine.info.name,
        "device": engine.info.device,
        "dtype": engine.info.dtype,
        "quantization": engine.info.quantization,
        "linears": engine.info.linears,
        "quant_prefill": engine.info.quant_prefill or None,  # integer, dense; None: unpacked
        "forward": engine.info.forward,
        "compiled_step": engine.runner.compile_state,
        "native_attention": native.state(),
        **cpu_class.report(cpu_class.selected()),  # HEARTH_CPU, checked at start
        "cache_mode": engine.config.cache_mode.value,
        "requests_total": c.requests,
        "requests_failed": c.requests_failed,
        "requests_cancelled": c.requests_cancelled,
        "requests_running": engine.scheduler.running,
        "requests_waiting": len(engine.scheduler.waiting) + engine.pending,
        "prefix_cache_queries_tokens": c.query_tokens,
        "prefix_cache_hits_tokens": c.hit_tokens,
        "prefix_cache_hit_rate": _rate(c.hit_tokens, c.query_tokens),
        "prompt_tokens_total": c.prompt_tokens,
        "prefill_tokens_total": c.prefill_tokens,
        "prefill_seconds_total": round(c.prefill_seconds, 6),
        "prefill_tokens_per_s": _rate(c.prefill_tokens, c.prefill_seconds, 2),
        "generation_tokens_total": c.generated_tokens,
        "decode_seconds_total": round(c.decode_seconds, 6),
        "decode_steps_total": c.decode_steps,
        "mixed_steps_total": c.mixed_steps,
        "forced_tokens_total": c.forced_tokens,
        "extend_steps_total": c.extend_steps,
        "decode_tokens_per_s": _rate(c.generated_tokens, c.decode_seconds, 2),
        "kv_cache_capacity_bytes": cache.capacity_bytes,
        "kv_cache_used_bytes": cache.used_bytes,
        "kv_cache_usage": _rate(cache.used_bytes, cache.capacity_bytes),
        "kv_cache_pinned_bytes": cache.pinned_bytes,
        "kv_cache_locked_bytes": cache.locked_bytes,
        "kv_cache_nodes": cache.nodes,
        "kv_cache_locked_nodes": cache.locked_nodes,
        "kv_cache_evictions_total": cache.evictions,
        "kv_cache_evicted_bytes_total": cache.evicted_bytes,
        "kv_working_bytes": usage.working_bytes,
        "kv_peak_bytes": kv.peak_bytes,  # cache + snapshots + buffers, the most at once
        "kv_pool_free_bytes": usage.pool_free_bytes,
        "kv_bytes_per_token": engine.info.bytes_per_token,
        "kv_cache_budget_rule": engine.budget_rule,  # how the capacity was chosen
        "process_rss_bytes": _rss(),
        # Hybrid models: recurrent-state snapshots at prefix boundaries (0 for others).
        "state_snapshots": kv.snapshots.count if kv.snapshots is not None else 0,
        "state_snapshot_bytes": kv.snapshots.nbytes if kv.snapshots is not None else 0,
        "pinned_prefix_tokens": cache.pinned_tokens,
        "pins": cache.pins,
        "pin_rebuilds_total": c.pin_rebuilds,
        "pin_restores_total": c.pin_restores,
        "pin_reuses_total": c.pin_reuses,
        "store_failures_total": c.store_failures,
        # Constrained decoding: masked tokens (rows x steps) and what masking cost.
        "constrained_tokens_total": engine.masker.tokens,
        "mask_seconds_total": round(engine.masker.seconds, 6),
        "mask_ms_per_token": _rate(engine.masker.seconds * 1000, engine.masker.tokens, 4),
    }


# name, help, key in engine_stats(), kind
_FROM_STATS = [
    (
        "prefix_cache_queries",
        "Prompt tokens looked up in the prefix cache",
        "prefix_cache_queries_tokens",
        "counter",
    ),
    (
        "prefix_cache_hits",
        "Prompt tokens served from the prefix cache",
        "prefix_cache_hits_tokens",
        "counter",
    ),
    ("prompt_tokens", "Prompt tokens processed", "prompt_tokens_total", "counter"),
    ("generation_tokens", "Tokens generated", "generation_tokens_total", "counter"),
    (
        "prefill_tokens",
        "Prompt tokens computed (not served from cache)",
        "prefill_tokens_total",
        "counter",
    ),
    ("request_success", "Requests finished", "requests_total", "counter"),
    (
        "constrained_tokens",
        "Tokens sampled under a grammar (tools, response_format)",
        "constrained_tokens_total",
        "counter",
    ),
    (
        "mask_seconds",
        "Time spent filling and applying grammar masks",
        "mask_seconds_total",
        "counter",
    ),
    ("request_failure", "Requests failed by an engine error", "requests_failed", "counter"),
    ("kv_cache_evictions", "Prefix cache nodes evicted", "kv_cache_evictions_total", "counter"),
    (
        "kv_cache_evicted_bytes",
        "Prefix cache bytes evicted",
        "kv_cache_evicted_bytes_total",
        "counter",
    ),
    ("prefix_pin_rebuilds", "Pins computed by prefill", "pin_rebuilds_total", "counter"),
    ("prefix_pin_restores", "Pins restored from the disk store", "pin_restores_total", "counter"),
    ("kv_cache_usage_perc", "Prefix cache usage (0-1)", "kv_cache_usage", "gauge"),
    ("kv_cache_bytes", "Prefix cache bytes in use", "kv_cache_used_bytes", "gauge"),
    ("kv_cache_capacity_bytes", "Prefix cache budget in bytes", "kv_cache_capacity_bytes", "gauge"),
    ("kv_cache_pinned_bytes", "Pinned prefix bytes", "kv_cache_pinned_bytes", "gauge"),
    ("kv_working_bytes", "KV bytes of running requests", "kv_working_bytes", "gauge"),
    (
        "state_snapshot_bytes",
        "Bytes of hybrid models' state snapshots at prefix boundaries",
        "state_snapshot_bytes",
        "gauge",
    ),
    ("pinned_prefix_tokens", "Tokens kept resident by pins", "pinned_prefix_tokens", "gauge"),
    ("requests_running", "Requests prefilling or decoding", "requests_running", "gauge"),
    ("requests_waiting", "Requests queued", "requests_waiting", "gauge"),
]


class _EngineCollector(Collector):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        stats = engine_stats(self.engine)
        labels = {"model_name": str(stats["model"])}
        for name, doc, key, kind in _FROM_STATS:
            family: Metric
            if kind == "counter":
                family = CounterMetricFamily(f"hearth:{name}", doc, labels=list(labels))
            else:
                family = GaugeMetricFamily(f"hearth:{name}", doc, labels=list(labels))
            family.add_metric(list(labels.values()), float(stats[key]))
            yield family


class Metrics:
    """The server's registry plus a short window of per-request figures for /v1/stats."""

    def __init__(self, engine: Engine, window: int = 200) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(engine))
        self.ttft = Histogram(
            "hearth:time_to_first_token_seconds",
            "Time to first token",
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.prefill = Histogram(
            "hearth:request_prefill_time_seconds",
            "Time from admission to first token",
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self._recent: deque[RequestStats] = deque(maxlen=window)
        engine.output.finished_listeners.append(self.observe)

    def observe(self, stats: RequestStats) -> None:
        if stats.completion_tokens == 0:
            return
        self.ttft.observe(stats.ttft_ms / 1000)
        self.prefill.observe(stats.prefill_ms / 1000)
        self._recent.append(stats)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def recent(self) -> dict[str, object]:
        """Figures over the last requests (a window), for dashboards."""
        items = list(self._recent)
        if not items:
            return {"window_requests": 0}
        ttfts = sorted(s.ttft_ms for s in items)
        p95 = ttfts[min(len(ttfts) - 1, round(0.95 * (len(ttfts) - 1)))]
        prompt = sum(s.prompt_tokens for s in items)
        cached = sum(s.cached_tokens for s in items)
        last = items[-1]
        return {
            "window_requests": len(items),
            "ttft_ms_median": round(median(ttfts), 3),
            "ttft_ms_p95": round(p95, 3),
            "window_hit_rate": round(cached / prompt, 6) if prompt else 0.0,
            "last_request": last.as_dict(),
        }
