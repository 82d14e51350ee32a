"""A way in without clicking: the demo user, onboarding marked done, a token for scripts.

The password and the long-lived access token are written to files in config/ with mode
600 (git-ignored). Neither is ever logged.
"""

from __future__ import annotations

import logging
import os
import secrets
from datetime import timedelta
from ipaddress import ip_address
from pathlib import Path

from homeassistant.auth.const import GROUP_ID_ADMIN
from homeassistant.auth.models import TOKEN_TYPE_LONG_LIVED_ACCESS_TOKEN, User
from homeassistant.auth.providers import homeassistant as auth_ha
from homeassistant.components import onboarding
from homeassistant.components.http.server import DEFAULT_BIND
from homeassistant.components.onboarding.const import STEPS as ONBOARDING_STEPS
from homeassistant.core import HomeAssistant

from .const import TOKEN_CLIENT_NAME, TOKEN_LIFETIME_DAYS
from .model import AccessSpec

_LOGGER = logging.getLogger(__name__)


def _read_secret(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except FileNotFoundError:
        return None


def _write_secret(path: Path, value: str) -> None:
    """Write a secret atomically, readable by the owner only (mode 600)."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(value + "\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def _read_or_create_password(path: Path) -> str:
    if (password := _read_secret(path)) is not None:
        os.chmod(path, 0o600)
        return password
    password = secrets.token_urlsafe(12)
    _write_secret(path, password)
    return password


async def async_ensure_user(hass: HomeAssistant, access: AccessSpec) -> User:
    """Create the demo user (an admin, the owner on a fresh install) with the file's password."""
    password = await hass.async_add_executor_job(_read_or_create_password, access.password_file)
    provider = auth_ha.async_get_provider(hass)
    await provider.async_initialize()
    if provider.data is None:
        raise RuntimeError("the homeassistant auth provider did not load its data")
    wanted = provider.data.normalize_username(access.username)
    known = {provider.data.normalize_username(user["username"]) for user in provider.data.users}
    if wanted not in known:
        await provider.async_add_auth(access.username, password)
        _LOGGER.info("Created login %s (password in %s)", access.username, access.password_file)
    else:
        try:
            await provider.async_validate_login(access.username, password)
        except auth_ha.InvalidAuth:
            await provider.async_change_password(access.username, password)
            _LOGGER.info(
                "Reset the password of %s to the one in %s", access.username, access.password_file
            )

    credentials = await provider.async_get_or_create_credentials({"username": access.username})
    if (user := await hass.auth.async_get_user_by_credentials(credentials)) is None:
        user = await hass.auth.async_create_user(access.display_name, group_ids=[GROUP_ID_ADMIN])
        await hass.auth.async_link_user(user, credentials)
        _LOGGER.info("Created user %s (owner: %s)", access.display_name, user.is_owner)
    return user


async def async_ensure_onboarded(hass: HomeAssistant) -> None:
    """Mark every onboarding step done, so the UI goes straight to the dashboard."""
    if onboarding.async_is_onboarded(hass):
        return
    data: onboarding.OnboardingData = hass.data[onboarding.DOMAIN]
    data.steps["done"].extend(step for step in ONBOARDING_STEPS if step not in data.steps["done"])
    store = onboarding.OnboardingStorage(
        hass, onboarding.STORAGE_VERSION, onboarding.STORAGE_KEY, private=True
    )
    await store.async_save(data.steps)
    data.onboarded = True
    for listener in data.listeners:
        listener()
    _LOGGER.info("Onboarding marked done")


async def async_ensure_token(hass: HomeAssistant, user: User, path: Path) -> None:
    """Keep a valid long-lived access token of `user` in `path` (mode 600)."""
    token = await hass.async_add_executor_job(_read_secret, path)
    if token is not None:
        refresh_token = hass.auth.async_validate_access_token(token)
        if refresh_token is not None and refresh_token.user.id == user.id:
            await hass.async_add_executor_job(os.chmod, path, 0o600)
            return

    # One long-lived token per client name: replace ours.
    for old in list(user.refresh_tokens.values()):
        if (
            old.token_type == TOKEN_TYPE_LONG_LIVED_ACCESS_TOKEN
            and old.client_name == TOKEN_CLIENT_NAME
        ):
            hass.auth.async_remove_refresh_token(old)
    refresh_token = await hass.auth.async_create_refresh_token(
        user,
        client_name=TOKEN_CLIENT_NAME,
        token_type=TOKEN_TYPE_LONG_LIVED_ACCESS_TOKEN,
        access_token_expiration=timedelta(days=TOKEN_LIFETIME_DAYS),
    )
    token = hass.auth.async_create_access_token(refresh_token)
    await hass.async_add_executor_job(_write_secret, path, token)
    _LOGGER.info("Wrote a long-lived access token for scripts to %s", path)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ip_address(host).is_loopback
    except ValueError:  # a host name
        return False


def warn_if_reachable_from_network(hass: HomeAssistant) -> None:
    """The demo user is an admin with a printed password: say so when HTTP is not loopback."""
    hosts = hass.http.server_host or DEFAULT_BIND
    exposed = [host for host in hosts if not _is_loopback(host)]
    if exposed:
        _LOGGER.warning(
            "Home Assistant listens on %s, not only on loopback, and the demo user is an"
            " admin: start it with scripts/develop (which binds 127.0.0.1) or set"
            " server_host in .storage/http",
            ", ".join(exposed),
        )


async def async_ensure_access(hass: HomeAssistant, access: AccessSpec) -> None:
    """User, onboarding and token, each idempotent."""
    warn_if_reachable_from_network(hass)
    user = await async_ensure_user(hass, access)
    await async_ensure_onboarded(hass)
    await async_ensure_token(hass, user, access.token_file)
