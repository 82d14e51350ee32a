"""A Lovelace dashboard for every loaded Hearth engine and agent (the ``dashboard`` action).

A static YAML dashboard has to name entity ids, and those depend on the install: a
second engine gets ``_2`` suffixes, another language other names, a renamed entity
another id. So the dashboard is generated from the entity registry (by unique id) and
returned by ``hearth.dashboard``; paste the answer into a dashboard's raw configuration
editor. Disabled entities are left out.

Per engine it answers what a user asks at a glance: *is it fast* (the engine's section:
TTFT now, median and p95, decode speed, the last hour of TTFT), *is it hitting, did it
re-pin* (the cache's section: hit rate and its last hour, KV use, re-pins, evictions), and
per agent, by the agent's own name, its pin's state and TTFT over the last hour. Cards show
an entity's own name without the device name in front (``name: {type: entity}``), and the
few words of its own (headings, graph titles, short names) come from the ``common``
translations (``dashboard_<key>``), so it reads in the install's language.
"""

from __future__ import annotations

from collections import Counter
from typing import Any
from urllib.parse import urlsplit

from homeassistant.config_entries import ConfigEntryState
from homeassistant.const import CONF_URL
from homeassistant.core import HomeAssistant
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers.translation import async_get_cached_translations

from .const import DOMAIN, SUBENTRY_CONVERSATION
from .data import HearthConfigEntry

HOURS_TO_SHOW = 1  # the graphs' window: a short session fills it; a day's detail is in History
_KV_SEVERITY = {"green": 0, "yellow": 70, "red": 90}
_ENTITY_NAME = {"type": "entity"}  # the entity's own name, not "<device> <name>"
Card = dict[str, Any]


class _Words:
    """The dashboard's own words in the install's language (``common.dashboard_<key>``)."""

    def __init__(self, hass: HomeAssistant) -> None:
        self._strings = async_get_cached_translations(hass, hass.config.language, "common", DOMAIN)

    def get(self, key: str, **placeholders: str) -> str | None:
        """The translated text, None where the translations lack it."""
        text = self._strings.get(f"component.{DOMAIN}.common.dashboard_{key}")
        return text.format(**placeholders) if text is not None else None


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


def _device_name(hass: HomeAssistant, entry_id: str, identifier: str, default: str) -> str:
    """The name of the entry's device ``identifier`` as the user sees it."""
    device = dr.async_get(hass).async_get_device_by_identifier((DOMAIN, identifier), entry_id)
    if device is None:
        return default
    return device.name_by_user or device.name or default


def _heading(text: str, icon: str, badge: str | None = None) -> Card:
    card: Card = {"type": "heading", "heading": text, "icon": icon}
    if badge is not None:
        card["badges"] = [{"type": "entity", "entity": badge, "name": _ENTITY_NAME}]
    return card


def _tile(entity_id: str | None, name: str | None = None, columns: int = 6) -> list[Card]:
    """A tile named by its entity alone, or ``name`` where that would be cut off."""
    if entity_id is None:
        return []
    return [
        {
            "type": "tile",
            "entity": entity_id,
            "name": name if name is not None else _ENTITY_NAME,
            "grid_options": {"columns": columns},
        }
    ]


def _graph(title: str | None, *entity_ids: str | None, y_range: bool = False) -> list[Card]:
    """The last HOURS_TO_SHOW of the entities' states (a percentage drawn on 0-100)."""
    entities = [{"entity": e, "name": _ENTITY_NAME} for e in entity_ids if e is not None]
    if not entities:
        return []
    card: Card = {"type": "history-graph", "hours_to_show": HOURS_TO_SHOW}
    if title is not None:
        card["title"] = title
    if y_range:
        card["min_y_axis"] = 0
        card["max_y_axis"] = 100
    card["grid_options"] = {"columns": 12}
    card["entities"] = entities
    return [card]


def _engine_section(ids: _Ids, words: _Words, name: str) -> Card:
    """Is it fast: TTFT (last, median, p95), decode speed and the last hour of TTFT."""
    return {
        "type": "grid",
        "cards": [
            # The engine device's name says what it is ("Hearth engine").
            _heading(name, "mdi:server", ids.engine("engine_connected", "binary_sensor")),
            *_tile(ids.engine("last_ttft")),
            *_tile(ids.engine("ttft_median")),
            *_tile(ids.engine("ttft_p95")),
            *_tile(ids.engine("decode_throughput"), words.get("decode")),
            *_graph(
                words.get("ttft_graph"),
                ids.engine("last_ttft"),
                ids.engine("ttft_median"),
                ids.engine("ttft_p95"),
            ),
        ],
    }


def _cache_section(ids: _Ids, words: _Words, name: str) -> Card:
    """Is it hitting, did it re-pin: hit rate and its last hour, KV use, re-pins, evictions."""
    gauge: list[Card] = []
    if (kv_usage := ids.engine("kv_cache_usage")) is not None:
        gauge = [
            {
                "type": "gauge",
                "entity": kv_usage,
                "name": _ENTITY_NAME,
                "min": 0,
                "max": 100,
                "needle": True,
                "severity": _KV_SEVERITY,
                "grid_options": {"columns": 6, "rows": 2},
            }
        ]
    rows = [
        {"entity": entity_id, "name": _ENTITY_NAME}
        for key in (
            "prefix_re_pins",
            "evictions",
            "prefill_throughput",
            "prompt_tokens",
            "reused_tokens",
        )
        if (entity_id := ids.engine(key)) is not None
    ]
    return {
        "type": "grid",
        "cards": [
            _heading(words.get("cache", name=name) or name, "mdi:memory"),
            *_tile(ids.engine("cache_hit_rate"), columns=12),
            *gauge,
            *_tile(ids.engine("kv_cache_used"), words.get("kv_used")),
            *_tile(ids.engine("pinned_prefix_tokens"), words.get("pinned")),
            *_graph(words.get("hit_rate_graph"), ids.engine("cache_hit_rate"), y_range=True),
            *(
                [{"type": "entities", "grid_options": {"columns": 12}, "entities": rows}]
                if rows
                else []
            ),
        ],
    }


def _agent_section(ids: _Ids, words: _Words, name: str, subentry_id: str) -> Card:
    """Did this agent's pin hold, and how fast were its turns."""
    return {
        "type": "grid",
        "cards": [
            _heading(words.get("agent", name=name) or name, "mdi:account-voice"),
            *_tile(ids.agent(subentry_id, "pin_state")),
            *_tile(ids.agent(subentry_id, "ttft")),
            *_tile(ids.agent(subentry_id, "errors")),
            *_tile(ids.agent(subentry_id, "requests")),
            *_graph(
                words.get("agent_graph"),
                ids.agent(subentry_id, "pin_state"),
                ids.agent(subentry_id, "ttft"),
            ),
        ],
    }


def _entry_sections(
    hass: HomeAssistant, entry: HearthConfigEntry, name: str, words: _Words
) -> list[Card]:
    ids = _Ids(hass, entry)
    sections = [_engine_section(ids, words, name), _cache_section(ids, words, name)]
    for subentry in entry.subentries.values():
        if subentry.subentry_type != SUBENTRY_CONVERSATION:
            continue
        agent = _device_name(hass, entry.entry_id, subentry.subentry_id, subentry.title)
        sections.append(_agent_section(ids, words, agent, subentry.subentry_id))
    return sections


def _engine_names(hass: HomeAssistant, entries: list[HearthConfigEntry]) -> list[str]:
    """Each engine's device name; where two engines share one, with its host and port."""
    names = [_device_name(hass, entry.entry_id, entry.entry_id, entry.title) for entry in entries]
    shared = {name for name, count in Counter(names).items() if count > 1}
    return [
        f"{name} ({urlsplit(str(entry.data[CONF_URL])).netloc})" if name in shared else name
        for name, entry in zip(names, entries, strict=True)
    ]


def build_dashboard(hass: HomeAssistant) -> dict[str, Any]:
    """The dashboard of every loaded Hearth entry: one view, its sections per engine
    (the engine, its cache) and per agent (named after it)."""
    words = _Words(hass)
    entries: list[HearthConfigEntry] = [
        entry
        for entry in hass.config_entries.async_entries(DOMAIN)
        if entry.state is ConfigEntryState.LOADED
    ]
    sections = [
        section
        for entry, name in zip(entries, _engine_names(hass, entries), strict=True)
        for section in _entry_sections(hass, entry, name, words)
    ]
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
