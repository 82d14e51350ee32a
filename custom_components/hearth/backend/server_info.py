"""What the server behind an engine entry is and can do, probed when the entry loads.

An engine entry can point at any OpenAI-compatible server. The integration adapts:

* a **Hearth engine** has the pin API (``/v1/stats`` with an ``instance_id``,
  ``/v1/prefixes``);
* **llama.cpp** (``llama-server``), **vLLM** and **SGLang** cache prompt prefixes on
  their own, and tell themselves apart by their routes and metric names;
* any **other** OpenAI-compatible server is just that.

What each kind can do is its backend's business (``backend/base.py``, ``backend/kinds.py``).

The kind comes from what the server answers: the Hearth routes, the metric names on
``/metrics`` (``vllm:``, ``sglang:``, ``llamacpp:``), llama.cpp's ``/props``, and the
``owned_by`` of ``/v1/models``. What a kind cannot report leaves its sensors
unavailable (``backend/server_stats.py``).

The model's context (the most tokens one request may hold, prompt and reply) is read
where the server tells it: ``context_length`` of a Hearth engine's ``/v1/models``,
``max_model_len`` of vLLM's and SGLang's, and llama.cpp's context per slot
(``default_generation_settings.n_ctx`` of ``/props``, else ``meta.n_ctx`` of its
``/v1/models``). Where none is told it is unknown, and the engine entry's option gives it
(``coordinator.context_length``).
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
    context_length: int | None = None  # the model's context in tokens (None: not told)
    extensions: frozenset[str] = frozenset()  # what a Hearth engine's ``hearth`` field takes

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
            "context_length": self.context_length,
            "extensions": sorted(self.extensions),
        }


async def async_probe(client: HearthClient) -> ServerInfo:
    """Find out what ``client``'s server is.

    Raises ``HearthError`` when it cannot be reached, refuses the key, or answers
    ``/v1/models`` with something that is not an OpenAI model list.
    """
    health = await client.async_optional_text("/health") is not None
    models = await client.async_models()
    served = next((m for m in models if isinstance(m, dict) and "id" in m), None)
    model = str(served["id"]) if served is not None else None
    context = model_context_length(served)
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
            context_length=context,
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
        context = props_context_length(props) or context
    metrics = metrics_text is not None and kind is not ServerKind.OPENAI
    return ServerInfo(
        kind, model=model, health=health, metrics=metrics, slots=slots, context_length=context
    )


def model_context_length(model: Any) -> int | None:
    """The context a ``/v1/models`` entry tells (None: it tells none): ``context_length``
    (Hearth), ``max_model_len`` (vLLM, SGLang) or ``meta.n_ctx`` (llama.cpp)."""
    if not isinstance(model, dict):
        return None
    meta = model.get("meta")
    told = (
        model.get("context_length"),
        model.get("max_model_len"),
        meta.get("n_ctx") if isinstance(meta, dict) else None,
    )
    return next((n for n in map(_tokens, told) if n is not None), None)


def props_context_length(props: Any) -> int | None:
    """llama.cpp's context per slot, from ``/props`` (None: not told)."""
    settings = props.get("default_generation_settings") if isinstance(props, dict) else None
    return _tokens(settings.get("n_ctx")) if isinstance(settings, dict) else None


def _tokens(value: Any) -> int | None:
    """A count of tokens: a positive JSON integer (a bool, a float or a string is none)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if value > 0 else None


async def _optional(client: HearthClient, path: str) -> str | None:
    """An optional route: absent, or refused (e.g. llama.cpp answers 501 for routes
    turned off, a proxy 403), counts as absent; a dead server still raises."""
    try:
        return await client.async_optional_text(path)
    except HearthResponseError:
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
