"""Constants of the Hearth demo house."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from homeassistant.const import Platform
from homeassistant.util.hass_dict import HassKey

if TYPE_CHECKING:
    from .entity import DemoEntity
    from .model import House

DOMAIN: Final = "hearth_demo"
DATA_HOUSE: HassKey[House] = HassKey(DOMAIN)
DATA_ENTITIES: HassKey[dict[str, DemoEntity]] = HassKey(f"{DOMAIN}_entities")

# The assistant the demo entities are exposed to (Assist / conversation agents).
ASSISTANT: Final = "conversation"

PLATFORMS: Final = (
    Platform.BINARY_SENSOR,
    Platform.CALENDAR,
    Platform.CLIMATE,
    Platform.COVER,
    Platform.FAN,
    Platform.LIGHT,
    Platform.LOCK,
    Platform.MEDIA_PLAYER,
    Platform.SENSOR,
    Platform.SWITCH,
    Platform.TODO,
    Platform.VACUUM,
    Platform.VALVE,
    Platform.WEATHER,
)

# Hearth wiring.
HEARTH_DOMAIN: Final = "hearth"
HEARTH_AGENT: Final = "conversation.hearth"
ENV_ENGINE_URL: Final = "HEARTH_ENGINE_URL"
DEFAULT_ENGINE_URL: Final = "http://127.0.0.1:8765"

# Access for people and scripts.
DEFAULT_USERNAME: Final = "demo"
DEFAULT_TOKEN_FILE: Final = ".demo_token"
DEFAULT_PASSWORD_FILE: Final = ".demo_password"
TOKEN_CLIENT_NAME: Final = "Hearth scripts"
TOKEN_LIFETIME_DAYS: Final = 3650

SERVICE_RENDER_PROMPT: Final = "render_prompt"
SERVICE_SET_STATES: Final = "set_states"
