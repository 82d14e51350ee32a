"""Brand images shipped in the integration folder (HA 2026.3+ serves them locally)."""

from __future__ import annotations

from pathlib import Path

import pytest
from homeassistant.core import HomeAssistant
from homeassistant.setup import async_setup_component
from pytest_homeassistant_custom_component.typing import ClientSessionGenerator

BRAND = Path(__file__).resolve().parents[2] / "custom_components" / "hearth" / "brand"


@pytest.mark.parametrize(
    ("image", "served"),
    [
        ("icon.png", "icon.png"),
        ("logo.png", "logo.png"),
        ("icon@2x.png", "icon@2x.png"),
        ("dark_logo.png", "dark_logo.png"),
        ("dark_icon@2x.png", "icon@2x.png"),  # HA's fallback chain
    ],
)
async def test_brand_images_are_served(
    hass: HomeAssistant, hass_client: ClientSessionGenerator, image: str, served: str
) -> None:
    """Home Assistant's brands API answers with the integration's own PNG files."""
    assert await async_setup_component(hass, "brands", {})
    client = await hass_client()
    response = await client.get(f"/api/brands/integration/hearth/{image}?placeholder=no")
    assert response.status == 200
    assert response.content_type == "image/png"
    assert await response.read() == (BRAND / served).read_bytes()
