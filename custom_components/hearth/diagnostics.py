"""Diagnostics: the server's kind, its model's context and chosen figures, pin state and
the last turn.

Redacted: the URL (``user:pass@`` credentials can sit in it), the entry's title and
unique id (the URL again), the API key and every prompt text; the URL or the key quoted
in an error message is masked too. The engine's stats are not dumped whole: only the figures
below, which say what serves the entry and how it is doing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from homeassistant.components.diagnostics import REDACTED, async_redact_data
from homeassistant.const import CONF_API_KEY, CONF_PROMPT, CONF_URL
from homeassistant.core import HomeAssistant

from .data import HearthConfigEntry

TO_REDACT = {CONF_API_KEY, CONF_PROMPT, CONF_URL, "title", "unique_id"}
# The engine figures diagnostics show (what the sensors show, and what serves them).
STATS = (
    "model",
    "version",
    "device",
    "dtype",
    "quantization",
    "cache_mode",
    "uptime_s",
    "requests_total",
    "requests_failed",
    "window_requests",
    "window_hit_rate",
    "ttft_ms_median",
    "ttft_ms_p95",
    "prefix_cache_hits_tokens",
    "prompt_tokens_total",
    "prefill_tokens_per_s",
    "decode_tokens_per_s",
    "kv_cache_used_bytes",
    "kv_cache_capacity_bytes",
    "kv_cache_usage",
    "kv_cache_evictions_total",
    "pinned_prefix_tokens",
    "pins",
)
PIN_FIELDS = ("tokens", "state", "hits", "restored")


async def async_get_config_entry_diagnostics(
    hass: HomeAssistant, entry: HearthConfigEntry
) -> dict[str, Any]:
    """Entry (redacted), server, chosen figures, pins and the last turn's usage."""
    data = entry.runtime_data
    status = data.coordinator.data
    backend = data.backend
    found = {
        "entry": async_redact_data(entry.as_dict(), TO_REDACT),
        "engine": {
            "connected": data.coordinator.last_update_success,
            "server": backend.info.as_dict(),
            # The model's context the agents go by: reported, else the entry's option.
            "context_length": data.coordinator.context_length,
            "features": list(backend.features()),
            "stats": {k: status.stats[k] for k in STATS if k in status.stats} if status else None,
            "pins": {
                name: {key: pin.get(key) for key in PIN_FIELDS}
                for name, pin in (status.pins.items() if status is not None else ())
            },
        },
        "prefixes": data.prefixes.as_diagnostics(),
        "last_turn": data.last_turn.as_dict() if data.last_turn is not None else None,
    }
    secrets = [entry.data.get(CONF_URL), entry.unique_id, entry.data.get(CONF_API_KEY)]
    return _masked(found, [s for s in secrets if isinstance(s, str) and s])


def _masked(value: Any, secrets: Iterable[str]) -> Any:
    """``value`` with every secret quoted in its strings replaced (longest first)."""
    ordered = sorted(secrets, key=len, reverse=True)
    if isinstance(value, str):
        for secret in ordered:
            value = value.replace(secret, REDACTED)
        return value
    if isinstance(value, dict):
        return {key: _masked(item, ordered) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_masked(item, ordered) for item in value]
    return value
