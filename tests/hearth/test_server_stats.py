"""What the integration reads from servers other than Hearth (backend/server_stats.py,
backend/priming.py).

Pure functions over what such servers send: ``/metrics`` text in the names vLLM, SGLang
and llama.cpp export, and per-request usage. The real llama.cpp server is exercised
end to end in ``test_llama_cpp.py``; vLLM and SGLang need a GPU, so their metric text
is written here from their documented names.
"""

from __future__ import annotations

from custom_components.hearth.backend.api import RequestUsage
from custom_components.hearth.backend.priming import request_extras
from custom_components.hearth.backend.server_info import ServerInfo, ServerKind
from custom_components.hearth.backend.server_stats import RequestWindow, parse_metrics, server_stats

VLLM_METRICS = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="qwen"} 9000.0
vllm:prefix_cache_queries_total{engine="1",model_name="qwen"} 1000.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="qwen"} 8000.0
vllm:prefix_cache_hits_total{engine="1",model_name="qwen"} 900.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="qwen"} 10000.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="qwen"} 0.25
# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.7645e+09
"""

LLAMA_METRICS = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 5400
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 64
"""


def _usage(prompt: int, cached: int | None, ttft: float | None = 100.0) -> RequestUsage:
    return RequestUsage(
        prompt_tokens=prompt,
        completion_tokens=4,
        cached_tokens=cached,
        ttft_ms=ttft,
        prefill_ms=None,
        decode_tokens_per_s=None,
        pin=None,
    )


def test_vllm_metrics_map_to_hearth_keys() -> None:
    """Counters summed over engines; KV usage; the start time tells a restart."""
    metrics = parse_metrics(VLLM_METRICS)
    stats = server_stats(ServerKind.VLLM, metrics, RequestWindow())
    assert stats["prefix_cache_hits_tokens"] == 8900
    assert stats["prompt_tokens_total"] == 10000
    assert stats["kv_cache_usage"] == 0.25
    assert stats["instance_id"] == "vllm-1764500000"
    # What the integration's own requests reported wins over server-wide counters.
    window = RequestWindow()
    window.record([_usage(1000, 900)])
    own = server_stats(ServerKind.VLLM, metrics, window)
    assert (own["prefix_cache_hits_tokens"], own["prompt_tokens_total"]) == (900, 1000)
    assert own["kv_cache_usage"] == 0.25
    restarted = VLLM_METRICS.replace("1.7645e+09", "1.7646e+09")
    assert (
        server_stats(ServerKind.VLLM, parse_metrics(restarted), RequestWindow())["instance_id"]
        != stats["instance_id"]
    )


def test_figures_a_server_cannot_report_are_absent() -> None:
    """llama.cpp exports no KV bytes, evictions or cache hits: those keys stay out, so
    their sensors are unavailable rather than 0. Its prompt token counter counts only
    what it prefilled, so it is not the prompt-tokens figure."""
    stats = server_stats(ServerKind.LLAMA_CPP, parse_metrics(LLAMA_METRICS), RequestWindow())
    for key in (
        "kv_cache_used_bytes",
        "kv_cache_evictions_total",
        "window_hit_rate",
        "prompt_tokens_total",
    ):
        assert key not in stats
    assert stats["instance_id"] == ""  # no start time: no restart detection


def test_malformed_metrics_keep_what_parsed() -> None:
    """A broken line (a proxy's error page, a truncated body) is not an error."""
    assert parse_metrics(LLAMA_METRICS + "not a metric line {\n")["llamacpp:tokens_predicted_total"]
    assert parse_metrics("<html>502 Bad Gateway</html>") == {}


def test_window_hit_rate_from_reported_cached_tokens() -> None:
    """Hit rate over the requests that reported reuse; TTFT percentiles; totals."""
    window = RequestWindow()
    window.record([_usage(1000, 900, 50.0), _usage(1000, 1000, 150.0)])
    window.record([_usage(500, None, 400.0)])  # no figure: not in the hit rate
    stats = window.stats()
    assert stats["window_requests"] == 3
    assert stats["window_hit_rate"] == 0.95
    assert stats["prefix_cache_hits_tokens"] == 1900
    assert stats["prompt_tokens_total"] == 2500
    assert stats["ttft_ms_median"] == 150.0
    assert stats["ttft_ms_p95"] == 375.0  # interpolated: 150 + 0.9 * (400 - 150)


def test_window_without_any_reuse_figure_has_no_hit_rate() -> None:
    """A server that never reports cached tokens: hit rate and reused tokens unknown."""
    window = RequestWindow()
    window.record([_usage(1000, None)])
    stats = window.stats()
    assert "window_hit_rate" not in stats
    assert "prefix_cache_hits_tokens" not in stats


def test_usage_from_llama_cpp_timings() -> None:
    """llama.cpp's ``timings``: reuse, prefill time and decode speed; client TTFT."""
    usage = RequestUsage.from_usage(
        {"prompt_tokens": 1200, "completion_tokens": 8},
        {"cache_n": 1100, "prompt_ms": 250.0, "predicted_per_second": 80.0},
        client_ttft_ms=300.0,
    )
    assert usage.cached_tokens == 1100
    assert usage.ttft_ms == 300.0
    window = RequestWindow()
    window.record([usage])
    stats = window.stats()
    assert stats["prefill_tokens_per_s"] == 400.0  # 100 new tokens in 250 ms
    assert stats["decode_tokens_per_s"] == 80.0
    # OpenAI's field wins over timings; Hearth's own TTFT over the client's.
    both = RequestUsage.from_usage(
        {
            "prompt_tokens": 10,
            "prompt_tokens_details": {"cached_tokens": 7},
            "hearth": {"ttft_ms": 5},
        },
        {"cache_n": 3},
        client_ttft_ms=9.0,
    )
    assert (both.cached_tokens, both.ttft_ms) == (7, 5.0)
    assert RequestUsage.from_usage({"prompt_tokens": 10}).cached_tokens is None


def test_llama_cpp_requests_reuse_prompts_without_a_fixed_slot() -> None:
    """llama.cpp: ``cache_prompt``, never ``id_slot`` (a slot per pin stalled a request
    on llama-server 0.3.36); other servers: nothing added."""
    assert request_extras(ServerInfo(ServerKind.LLAMA_CPP, slots=4)) == {"cache_prompt": True}
    assert request_extras(ServerInfo(ServerKind.VLLM)) == {}
    assert request_extras(None) == {}


def test_ttft_percentiles_of_one_request_and_of_none() -> None:
    """One request: its TTFT is the median and the p95; none: both unknown."""
    window = RequestWindow()
    assert window.stats()["ttft_ms_p95"] is None
    window.record([_usage(100, None, 80.0)])
    assert window.stats()["ttft_ms_median"] == window.stats()["ttft_ms_p95"] == 80.0
