"""A Lovelace dashboard for every loaded Hearth engine and agent (the ``dashboard`` action).

A static YAML dashboard has to name entity ids, and those depend on the install: a
second engine gets ``_2`` suffixes, another language other names, a renamed entity
another id. So the dashboard is generated from the entity registry (by unique id) and
returned by ``hearth.dashboard``; paste the answer into a dashboard's raw configuration
editor. It holds no text of its own: headings are device names, cards show the entities'
translated names, so it reads in the install's language. Disabled entities are left out.
"""

from __future__ import annotations

from typing import Any

from homeassistant.config_entries import ConfigEntryState
from homeassistant.core import HomeAssistant
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers import entity_registry as er

from .const import DOMAIN, SUBENTRY_CONVERSATION
from .data import HearthConfigEntry

_KV_SEVERITY = {"green": 0, "yellow": 70, "red": 90}


class _Ids:
    """Entity ids of one engine entry, looked up by unique id (None: absent or disabled)."""

    def __init__(self, hass: HomeAssistant, entry: HearthConfigEntry) -> None:
        self._registry = er.async_get(hass)
        self._entry = entry

    def get(self, platform: str, unique_id: str) -> str | None:
        entity_id = self._registry.async_get_entity_id(platform, DOMAIN, unique_id)
        if entity_id is None:
            return None
        entity = self._registry.async_get(entity_id)
        return entity_id if entity is not None and entity.disabled_by is None else None

    def engine(self, key: str, platform: str = "sensor") -> str | None:
        return self.get(platform, f"{self._entry.entry_id}_{key}")

    def agent(self, subentry_id: str, key: str) -> str | None:
        return self.get("sensor", f"{subentry_id}_{key}")


def _device_name(hass: HomeAssistant, identifier: str, default: str) -> str:
    device = dr.async_get(hass).async_get_device(identifiers={(DOMAIN, identifier)})
    if device is None:
        return default
    return device.name_by_user or device.name or default


def _tiles(*entity_ids: str | None, columns: int | None = None) -> list[dict[str, Any]]:
    cards: list[dict[str, Any]] = []
    for entity_id in entity_ids:
        if entity_id is None:
            continue
        card: dict[str, Any] = {"type": "tile", "entity": entity_id}
        if columns is not None:
            card["grid_options"] = {"columns": columns}
        cards.append(card)
    return cards


def _history(*entity_ids: str | None) -> list[dict[str, Any]]:
    entities = [entity_id for entity_id in entity_ids if entity_id is not None]
    if not entities:
        return []
    return [
        {
            "type": "history-graph",
            "hours_to_show": 6,
            "grid_options": {"columns": 12},
            "entities": entities,
        }
    ]


def _engine_sections(hass: HomeAssistant, entry: HearthConfigEntry) -> list[dict[str, Any]]:
    ids = _Ids(hass, entry)
    name = _device_name(hass, entry.entry_id, entry.title)
    kv_usage = ids.engine("kv_cache_usage")
    gauge: list[dict[str, Any]] = []
    if kv_usage is not None:
        gauge = [
            {
                "type": "gauge",
                "entity": kv_usage,
                "min": 0,
                "max": 100,
                "needle": True,
                "severity": _KV_SEVERITY,
                "grid_options": {"columns": 6, "rows": 2},
            }
        ]
    counters = [
        entity_id
        for key in ("prefix_re_pins", "evictions", "prompt_tokens", "reused_tokens")
        if (entity_id := ids.engine(key)) is not None
    ]
    sections = [
        {
            "type": "grid",
            "cards": [
                {"type": "heading", "heading": name, "icon": "mdi:server"},
                *_tiles(ids.engine("engine_connected", "binary_sensor"), columns=12),
                *_tiles(
                    ids.engine("cache_hit_rate"),
                    ids.engine("last_ttft"),
                    ids.engine("ttft_median"),
                    ids.engine("ttft_p95"),
                ),
                *_history(
                    ids.engine("last_ttft"), ids.engine("ttft_median"), ids.engine("ttft_p95")
                ),
                *_history(ids.engine("cache_hit_rate")),
            ],
        },
        {
            "type": "grid",
            "cards": [
                {"type": "heading", "heading": name, "icon": "mdi:memory"},
                *gauge,
                *_tiles(ids.engine("kv_cache_used"), ids.engine("pinned_prefix_tokens"), columns=6),
                *_tiles(ids.engine("prefill_throughput"), ids.engine("decode_throughput")),
                *(
                    [{"type": "entities", "grid_options": {"columns": 12}, "entities": counters}]
                    if counters
                    else []
                ),
            ],
        },
    ]
    for subentry in entry.subentries.values():
        if subentry.subentry_type != SUBENTRY_CONVERSATION:
            continue
        sid = subentry.subentry_id
        sections.append(
            {
                "type": "grid",
                "cards": [
                    {
                        "type": "heading",
                        "heading": _device_name(hass, sid, subentry.title),
                        "icon": "mdi:account-voice",
                    },
                    *_tiles(ids.agent(sid, "pin_state"), columns=12),
                    *_tiles(
                        ids.agent(sid, "ttft"),
                        ids.agent(sid, "errors"),
                        ids.agent(sid, "requests"),
                    ),
                    *_history(ids.agent(sid, "pin_state"), ids.agent(sid, "ttft")),
                ],
            }
        )
    return sections


def build_dashboard(hass: HomeAssistant) -> dict[str, Any]:
    """The dashboard of every loaded Hearth entry: one view, its sections per engine
    (status and latency, KV cache) and per agent (pin state, TTFT, errors)."""
    entries: list[HearthConfigEntry] = [
        entry
        for entry in hass.config_entries.async_entries(DOMAIN)
        if entry.state is ConfigEntryState.LOADED
    ]
    sections = [section for entry in entries for section in _engine_sections(hass, entry)]
    return {
        "title": "Hearth",
        "views": [
            {
                "title": "Hearth",
                "path": "hearth",
                "icon": "mdi:fireplace",
                "type": "sections",
                "max_columns": 3,
                "sections": sections,
            }
        ],
    }
