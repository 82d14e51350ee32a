"""What the server behind an engine entry is and can do, probed when the entry loads.

An engine entry can point at any OpenAI-compatible server. The integration adapts:

* a **Hearth engine** has the pin API (``/v1/stats`` with an ``instance_id``,
  ``/v1/prefixes``);
* **llama.cpp** (``llama-server``), **vLLM** and **SGLang** cache prompt prefixes on
  their own, and tell themselves apart by their routes and metric names;
* any **other** OpenAI-compatible server is just that.

What each kind can do is its backend's business (``backend.py``, ``backends.py``).

The kind comes from what the server answers: the Hearth routes, the metric names on
``/metrics`` (``vllm:``, ``sglang:``, ``llamacpp:``), llama.cpp's ``/props``, and the
``owned_by`` of ``/v1/models``. What a kind cannot report leaves its sensors
unavailable (``server_stats.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from .api import HearthClient, HearthResponseError


class ServerKind(StrEnum):
    """The software serving an engine entry."""

    HEARTH = "hearth"
    LLAMA_CPP = "llama_cpp"
    VLLM = "vllm"
    SGLANG = "sglang"
    OPENAI = "openai"  # another OpenAI-compatible server


# Who makes each kind's software (the engine device's manufacturer): product names, not
# translated. The kinds in words are translated (``names.py``, ``common.server_<kind>``).
MAKERS: dict[ServerKind, str | None] = {
    ServerKind.HEARTH: "Hearth",
    ServerKind.LLAMA_CPP: "llama.cpp",
    ServerKind.VLLM: "vLLM",
    ServerKind.SGLANG: "SGLang",
    ServerKind.OPENAI: None,  # unknown
}
# Prefixes of the metric names each server exports on /metrics.
_METRIC_PREFIXES = (
    ("vllm:", ServerKind.VLLM),
    ("sglang:", ServerKind.SGLANG),
    ("llamacpp:", ServerKind.LLAMA_CPP),
)
_OWNERS = {"vllm": ServerKind.VLLM, "sglang": ServerKind.SGLANG, "llamacpp": ServerKind.LLAMA_CPP}


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """The probed server: its kind and what it offers."""

    kind: ServerKind
    model: str | None = None
    health: bool = True  # it has a /health route (liveness); else /v1/models is used
    metrics: bool = False  # /metrics answers with the kind's metric names
    slots: int = 0  # llama.cpp's slots (0: unknown or not llama.cpp)
    extensions: frozenset[str] = frozenset()  # what a Hearth engine's ``hearth`` field takes
    context_length: int | None = None  # the model's context in tokens (None: not told)

    @property
    def maker(self) -> str | None:
        """Who makes the serving software (None: not known)."""
        return MAKERS[self.kind]

    def as_dict(self) -> dict[str, Any]:
        """For diagnostics."""
        return {
            "kind": self.kind.value,
            "model": self.model,
            "health": self.health,
            "metrics": self.metrics,
            "slots": self.slots,
            "extensions": sorted(self.extensions),
            "context_length": self.context_length,
        }


async def async_probe(client: HearthClient) -> ServerInfo:
    """Find out what ``client``'s server is.

    Raises ``HearthError`` when it cannot be reached, refuses the key, or answers
    ``/v1/models`` with something that is not an OpenAI model list.
    """
    health = await client.async_optional_text("/health") is not None
    models = await client.async_models()
    model = next((str(m["id"]) for m in models if isinstance(m, dict) and "id" in m), None)
    stats = _json_or_none(await client.async_optional_text("/v1/stats"))
    if isinstance(stats, dict) and "instance_id" in stats:
        told = stats.get("extensions")
        extensions = frozenset(str(e) for e in told) if isinstance(told, list) else frozenset()
        return ServerInfo(
            ServerKind.HEARTH,
            model=model,
            health=health,
            metrics=True,
            extensions=extensions,
            context_length=_context_length(models),
        )
    kind = _kind_from_owner(models)
    metrics_text = await _optional(client, "/metrics")
    if metrics_text is not None:
        kind = next((k for p, k in _METRIC_PREFIXES if p in metrics_text), kind)
    props = _json_or_none(await _optional(client, "/props"))
    slots = 0
    if isinstance(props, dict) and "default_generation_settings" in props:
        kind = ServerKind.LLAMA_CPP
        slots = int(props.get("total_slots") or 0)
    metrics = metrics_text is not None and kind is not ServerKind.OPENAI
    return ServerInfo(kind, model=model, health=health, metrics=metrics, slots=slots)


async def _optional(client: HearthClient, path: str) -> str | None:
    """An optional route: absent, or refused (e.g. llama.cpp answers 501 for routes
    turned off, a proxy 403), counts as absent; a dead server still raises."""
    try:
        return await client.async_optional_text(path)
    except HearthResponseError:
        return None


def _context_length(models: list[dict[str, Any]]) -> int | None:
    """The first model's context as ``/v1/models`` tells it (Hearth: ``context_length``)."""
    for model in models:
        value = model.get("context_length") if isinstance(model, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _kind_from_owner(models: list[dict[str, Any]]) -> ServerKind:
    for model in models:
        owner = str(model.get("owned_by", "")).lower() if isinstance(model, dict) else ""
        if owner in _OWNERS:
            return _OWNERS[owner]
    return ServerKind.OPENAI


def _json_or_none(text: str | None) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None
