"""Render a Home Assistant dashboard in headless Chromium and save it as a PNG.

Drives Debian's ``chromium`` over the DevTools protocol (no Playwright needed): the page
is opened on Home Assistant's origin, the long-lived token of the demo user is put where
the frontend keeps its session (``localStorage.hassTokens``), and the dashboard is loaded,
given time to draw its history graphs, and captured. Run with the engine env's Python
(it has aiohttp); ``scripts/screenshot`` does that.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp


class DevTools:
    """One page target of a Chromium started with a remote debugging port."""

    def __init__(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        self.socket = socket
        self.ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        message_id = next(self.ids)
        await self.socket.send_json({"id": message_id, "method": method, "params": params})
        while True:
            reply = await self.socket.receive_json(timeout=60)
            if reply.get("id") == message_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return dict(reply.get("result", {}))

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    async def goto(self, url: str, settle_s: float) -> None:
        await self.call("Page.navigate", url=url)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if await self.evaluate("document.readyState") == "complete":
                break
            await asyncio.sleep(0.25)
        await asyncio.sleep(settle_s)


def start_chromium(profile: Path, width: int, height: int) -> tuple[subprocess.Popen[bytes], int]:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        raise SystemExit("chromium is not installed (Debian: apt-get install chromium)")
    proc = subprocess.Popen(
        [
            binary,
            "--headless=new",
            "--no-sandbox",  # runs as root in containers
            "--disable-gpu",
            "--hide-scrollbars",
            f"--window-size={width},{height}",
            f"--user-data-dir={profile}",
            "--remote-debugging-port=0",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    port_file = profile / "DevToolsActivePort"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if port_file.exists() and (lines := port_file.read_text().split()):
            return proc, int(lines[0])
        if proc.poll() is not None:
            raise SystemExit(f"chromium exited with {proc.returncode}")
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("chromium did not open its DevTools port within 60 s")


def hass_tokens(ha_url: str, token: str) -> str:
    """The frontend's stored session, made of a long-lived access token."""
    return json.dumps(
        {
            "access_token": token,
            "token_type": "Bearer",
            "expires_in": 10 * 365 * 86400,
            "expires": int(time.time() * 1000) + 10 * 365 * 86400 * 1000,
            "refresh_token": "",
            "hassUrl": ha_url,
            "clientId": f"{ha_url}/",
        }
    )


async def capture(args: argparse.Namespace) -> Path:
    token = args.token_file.read_text(encoding="utf-8").strip()
    with tempfile.TemporaryDirectory(prefix="hearth-chromium-") as profile:
        proc, port = start_chromium(Path(profile), args.width, args.height)
        try:
            async with aiohttp.ClientSession() as session:
                async with session.get(f"http://127.0.0.1:{port}/json/list") as resp:
                    targets = await resp.json()
                page = next(t for t in targets if t.get("type") == "page")
                async with session.ws_connect(
                    page["webSocketDebuggerUrl"], max_msg_size=64 << 20
                ) as socket:
                    tools = DevTools(socket)
                    await tools.call("Page.enable")
                    await tools.call(
                        "Emulation.setDeviceMetricsOverride",
                        width=args.width,
                        height=args.height,
                        deviceScaleFactor=1,
                        mobile=False,
                    )
                    await tools.goto(f"{args.ha_url}/auth/authorize", settle_s=0.5)
                    stored = json.dumps(hass_tokens(args.ha_url, token))
                    await tools.evaluate(f"localStorage.setItem('hassTokens', {stored})")
                    await tools.goto(f"{args.ha_url}{args.path}", settle_s=args.settle)
                    shot = await tools.call("Page.captureScreenshot", format="png")
        finally:
            proc.terminate()
            proc.wait(10)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(base64.b64decode(shot["data"]))
    return args.out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ha-url", default="http://127.0.0.1:8123")
    parser.add_argument("--token-file", type=Path, default=Path("config/.demo_token"))
    parser.add_argument("--path", default="/hearth-engine/hearth", help="dashboard path")
    parser.add_argument("--out", type=Path, default=Path("out/dashboard.png"))
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=860)
    parser.add_argument("--settle", type=float, default=12.0, help="seconds to let it draw")
    args = parser.parse_args()
    if not args.token_file.exists():
        print(f"no token at {args.token_file}: is scripts/develop running?", file=sys.stderr)
        return 1
    out = asyncio.run(capture(args))
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
