"""The engine device's configuration URL shows no credentials."""

from __future__ import annotations

import pytest

from custom_components.hearth.engine_device import public_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://127.0.0.1:8765", "http://127.0.0.1:8765"),
        ("http://user:secret@engine.lan:8765/v1", "http://engine.lan:8765/v1"),
        ("https://token@engine.lan", "https://engine.lan"),
        ("http://user:secret@[::1]:8765", "http://[::1]:8765"),
    ],
)
def test_configuration_url_without_credentials(url: str, shown: str) -> None:
    assert public_url(url) == shown
    assert "secret" not in public_url(url)
