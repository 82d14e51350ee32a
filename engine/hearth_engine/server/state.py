"""What every handler needs, stored on the aiohttp application."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from aiohttp import web

from ..chat import ChatFormatter
from ..engine import Engine
from .metrics import Metrics


@dataclass
class ServerState:
    KEY: ClassVar[web.AppKey[ServerState]]

    engine: Engine
    formatter: ChatFormatter
    metrics: Metrics
    api_key: str | None
    log_prompts: bool = False


ServerState.KEY = web.AppKey("hearth_state", ServerState)
