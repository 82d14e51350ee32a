"""Pin Home Assistant's HTTP bind address and port in config/.storage/http.

Since 2026.x Home Assistant keeps its HTTP settings in storage: a YAML `http:` section is
migrated once as a *pending* trial that reverts (and restarts Home Assistant) unless it is
confirmed within five minutes, and later starts ignore the YAML. So scripts/develop writes
the wanted host and port as the confirmed (stable) settings before every start, using Home
Assistant's own schema. Run with the HA environment's Python. When the file already says
so, it is left alone (and Home Assistant is not even imported, to keep this fast).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

STORE_FILE = Path(".storage") / "http"
KNOWN_VERSION = (2, 2)  # (version, minor_version) of the store this check understands


def is_current(path: Path, host: str, port: int) -> bool:
    """True when the stored stable settings bind `host:port` and nothing is pending."""
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    data = stored.get("data", {})
    stable = data.get("stable") or {}
    return (
        (stored.get("version"), stored.get("minor_version")) == KNOWN_VERSION
        and data.get("pending") is None
        and data.get("yaml_migration_done") is True
        and stable.get("server_host") == [host]
        and stable.get("server_port") == port
    )


def wanted_store(host: str, port: int) -> dict[str, Any]:
    """The whole store file, validated by Home Assistant's own schema."""
    from homeassistant.components.http import config as http_config
    from homeassistant.util import dt as dt_util

    stable: dict[str, Any] = dict(
        http_config.HTTP_STORAGE_SCHEMA({"server_host": [host], "server_port": port})
    )
    stable[http_config.HTTP_CONFIG_CREATED_AT] = dt_util.utcnow().isoformat()
    stable[http_config.HTTP_CONFIG_ERROR] = None
    stable[http_config.HTTP_CONFIG_ERROR_MESSAGE] = None
    return {
        "version": http_config.STORAGE_VERSION,
        "minor_version": http_config.STORAGE_MINOR_VERSION,
        "key": http_config.STORAGE_KEY,
        "data": {
            http_config.KEY_STABLE: stable,
            http_config.KEY_PENDING: None,
            http_config.KEY_YAML_MIGRATION_DONE: True,
        },
    }


def write(path: Path, payload: dict[str, Any]) -> None:
    """Write atomically, readable by the owner only, like Home Assistant's private stores."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.hearth-tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(payload, handle, indent=2)
    os.replace(tmp, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="the config folder")
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()

    path = args.config / STORE_FILE
    if not is_current(path, args.host, args.port):
        write(path, wanted_store(args.host, args.port))
        print(f"Home Assistant HTTP set to {args.host}:{args.port} in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
