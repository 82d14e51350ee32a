"""Who may talk to the engine: the ``Host`` and ``Origin`` policy (no aiohttp here).

A web page open in a browser on the same machine can send requests to a loopback server.
Two checks keep it out, before any route runs (like Ollama's fix for DNS rebinding,
CVE-2024-28224, and Jupyter server):

- ``Host``: without an API key, only loopback names (``localhost``, ``*.localhost``,
  127.0.0.0/8, ``[::1]``) and the configured ``--allowed-hosts`` are served. A DNS
  rebinding page reaches the engine under the attacker's own name, so it is refused.
- ``Origin``: a request that carries one must come from an ``--allowed-origins`` entry
  (none by default), with or without a key. The engine's own clients send none.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

ANY_HOST = "*"
_HOST = re.compile(r"[a-z0-9_:-][a-z0-9._:-]*\Z")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def split_host(value: str) -> str | None:
    """The host name of a ``Host`` header value (``name``, ``name:port``, ``[v6]:port``),
    lower-case, without a trailing dot; ``None`` if the value is malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        host, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
        return host or None
    host, colon, port = value.partition(":")
    if colon and not port.isdigit():
        return None  # a bare IPv6 address, an empty port or a second colon
    host = host.removesuffix(".")
    return host or None


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def is_loopback_host(host: str) -> bool:
    """``localhost``, ``*.localhost`` (RFC 6761: always loopback, no DNS) or a loopback IP."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def normalize_origin(value: str) -> str | None:
    """``scheme://host[:port]`` in lower case, default port dropped; ``None`` if the value
    is not an http(s) origin (``null``, a path, user info, garbage)."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname or parts.username is not None:
        return None
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return None
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    if port is None or port == _DEFAULT_PORTS[scheme]:
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


def _entries(values: Iterable[str]) -> list[str]:
    """Flag values, each one or several comma-separated entries, without blanks."""
    return [item.strip() for value in values for item in value.split(",") if item.strip()]


def parse_allowed_hosts(values: Iterable[str]) -> frozenset[str]:
    """``--allowed-hosts`` entries: names or addresses without a port, ``.suffix`` for a
    domain and its subdomains, or ``*`` for any host. Raises ``ValueError``."""
    hosts: set[str] = set()
    for entry in _entries(values):
        if entry == ANY_HOST:
            hosts.add(entry)
            continue
        suffix = entry.startswith(".")
        name = (entry[1:] if suffix else entry).lower()
        host = name if _is_ip(name) else split_host(name)
        if host is None or host != name.strip("[]").removesuffix(".") or not _HOST.match(host):
            raise ValueError(f"--allowed-hosts {entry!r}: give a host name or address, no port")
        hosts.add(f".{host}" if suffix else host)
    return frozenset(hosts)


def parse_allowed_origins(values: Iterable[str]) -> frozenset[str]:
    """``--allowed-origins`` entries such as ``http://localhost:3000``. Raises ``ValueError``:
    ``*`` and ``null`` are refused (either would let any page in)."""
    origins: set[str] = set()
    for entry in _entries(values):
        origin = normalize_origin(entry)
        if origin is None:
            raise ValueError(
                f"--allowed-origins {entry!r}: give an origin such as http://localhost:3000"
                " (scheme, host and port; no path, no '*', no 'null')"
            )
        origins.add(origin)
    return frozenset(origins)


@dataclass(frozen=True)
class Guard:
    """The policy: ``check_host`` is on when the engine has no API key."""

    check_host: bool = True
    allowed_hosts: frozenset[str] = frozenset()
    allowed_origins: frozenset[str] = frozenset()

    @classmethod
    def build(
        cls, *, api_key: str | None, allowed_hosts: Iterable[str], allowed_origins: Iterable[str]
    ) -> Guard:
        return cls(
            check_host=api_key is None,
            allowed_hosts=parse_allowed_hosts(allowed_hosts),
            allowed_origins=parse_allowed_origins(allowed_origins),
        )

    def host_allowed(self, header: str | None) -> bool:
        if not self.check_host or ANY_HOST in self.allowed_hosts:
            return True
        host = split_host(header or "")
        if host is None:
            return False
        if is_loopback_host(host) or host in self.allowed_hosts:
            return True
        return any(
            entry.startswith(".") and (host == entry[1:] or host.endswith(entry))
            for entry in self.allowed_hosts
        )

    def origin_allowed(self, header: str) -> bool:
        return normalize_origin(header) in self.allowed_origins
