"""``GET /metrics``: Prometheus text that ``prometheus_client``'s parser reads, whose
counters move with the requests."""

from __future__ import annotations

import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import Client, ServerProcess
from .test_server_chat import system, user

COUNTERS = [
    "prefix_cache_queries",
    "prefix_cache_hits",
    "prompt_tokens",
    "generation_tokens",
    "prefill_tokens",
    "request_success",
    "kv_cache_evictions",
    "prefix_pin_rebuilds",
    "prefix_pin_restores",
]
GAUGES = [
    "kv_cache_usage_perc",
    "kv_cache_bytes",
    "kv_cache_capacity_bytes",
    "kv_cache_pinned_bytes",
    "pinned_prefix_tokens",
    "requests_running",
    "requests_waiting",
]
HISTOGRAMS = ["time_to_first_token_seconds", "request_prefill_time_seconds"]


@pytest.fixture(scope="module")
def server(tools_server: ServerProcess) -> ServerProcess:
    return tools_server


class Scrape:
    def __init__(self, text: str) -> None:
        self.types: dict[str, str] = {}
        self.values: dict[tuple[str, str], float] = {}  # (sample name, le or "") -> value
        self.labels: dict[str, dict[str, str]] = {}
        for family in text_string_to_metric_families(text):
            self.types[family.name] = family.type
            for sample in family.samples:
                self.values[(sample.name, sample.labels.get("le", ""))] = sample.value
                self.labels[sample.name] = sample.labels

    def __getitem__(self, name: str) -> float:
        return self.values[(f"hearth:{name}", "")]

    def buckets(self, name: str) -> list[tuple[float, float]]:
        return sorted(
            (float(le), value)
            for (sample, le), value in self.values.items()
            if sample == f"hearth:{name}_bucket"
        )


async def scrape(client: Client) -> Scrape:
    async with client.session.get(client.url("/metrics"), headers=client.server.auth) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        return Scrape(await response.text())


async def test_metrics_parse_with_the_prometheus_parser(client: Client) -> None:
    await client.chat(messages=[system(), user("hi")], max_tokens=4)
    metrics = await scrape(client)
    for name in COUNTERS:
        assert metrics.types[f"hearth:{name}"] == "counter", name
        assert metrics.labels[f"hearth:{name}_total"] == {"model_name": "tiny-tools"}
    for name in GAUGES:
        assert metrics.types[f"hearth:{name}"] == "gauge", name
        assert metrics[name] >= 0
    for name in HISTOGRAMS:
        assert metrics.types[f"hearth:{name}"] == "histogram", name
        buckets = metrics.buckets(name)
        counts = [count for _, count in buckets]
        assert counts == sorted(counts)  # cumulative
        assert buckets[-1] == (float("inf"), metrics[f"{name}_count"])
    assert 0 <= metrics["kv_cache_usage_perc"] <= 1


async def test_counters_move_with_requests(client: Client) -> None:
    house = system(words=30)
    before = await scrape(client)
    first = await client.chat(messages=[house, user("hi")])
    second = await client.chat(messages=[house, user("good evening")])
    await client.settled()
    after = await scrape(client)

    def delta(name: str) -> float:
        return after[name] - before[name]

    replies = [first["usage"], second["usage"]]
    assert delta("prefix_cache_queries_total") == sum(u["prompt_tokens"] for u in replies)
    assert delta("prefix_cache_hits_total") == sum(
        u["prompt_tokens_details"]["cached_tokens"] for u in replies
    )
    assert delta("prefix_cache_hits_total") > 30  # the second request reused the system text
    assert delta("prompt_tokens_total") == sum(u["prompt_tokens"] for u in replies)
    assert delta("generation_tokens_total") == sum(u["completion_tokens"] for u in replies)
    assert delta("request_success_total") == 2
    assert delta("time_to_first_token_seconds_count") == 2
    assert delta("request_prefill_time_seconds_count") == 2
    assert delta("time_to_first_token_seconds_sum") > 0

    # a pin shows up in its counter and gauges
    name = f"metrics-{uuid.uuid4().hex[:8]}"
    pin = await client.put_pin(name, messages=[system(words=30)])
    pinned = await scrape(client)
    assert pinned["prefix_pin_rebuilds_total"] == after["prefix_pin_rebuilds_total"] + 1
    assert pinned["pinned_prefix_tokens"] >= after["pinned_prefix_tokens"] + pin["tokens"]
    assert pinned["kv_cache_pinned_bytes"] > after["kv_cache_pinned_bytes"]
    await client.request("DELETE", f"/v1/prefixes/{name}")
    unpinned = await scrape(client)
    assert unpinned["pinned_prefix_tokens"] == after["pinned_prefix_tokens"]


async def test_metrics_agree_with_stats(client: Client) -> None:
    stats = await client.settled()
    metrics = await scrape(client)
    assert metrics["prefix_cache_queries_total"] == stats["prefix_cache_queries_tokens"]
    assert metrics["prefix_cache_hits_total"] == stats["prefix_cache_hits_tokens"]
    assert metrics["request_success_total"] == stats["requests_total"]
    assert metrics["kv_cache_capacity_bytes"] == stats["kv_cache_capacity_bytes"]
