"""Ask Assist through Home Assistant's REST API and report the engine's figures.

Used by `scripts/develop --once`. Each answer is printed with the time to first token,
the cached prompt tokens, the decode speed over the turn and the answer time, read from
the engine's `GET /v1/stats` around the request (Home Assistant's conversation response
carries no usage). Standard library only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HTTP_TIMEOUT_S = 600


@dataclass(frozen=True)
class Client:
    """Home Assistant (with a bearer token) and the engine, by URL."""

    ha_url: str
    token: str
    engine_url: str

    def _call(self, url: str, body: dict[str, Any] | None, auth: bool) -> Any:
        headers = {"Content-Type": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.token}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, headers=headers)
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
            return json.load(response)

    def converse(self, text: str, agent_id: str) -> dict[str, Any]:
        body = {"text": text, "agent_id": agent_id, "language": "en"}
        return self._call(f"{self.ha_url}/api/conversation/process", body, auth=True)

    def engine_stats(self) -> dict[str, Any]:
        return self._call(f"{self.engine_url}/v1/stats", None, auth=False)

    def pins(self) -> list[dict[str, Any]]:
        return self._call(f"{self.engine_url}/v1/prefixes", None, auth=False)["data"]


def wait_for_pins(client: Client, timeout_s: float, first_pin_s: float = 30.0) -> str:
    """Wait until the engine's pins are ready (none warming), so answers show the reuse.

    Gives up after `first_pin_s` when no pin shows up at all (a client that does not pin),
    and after `timeout_s` when one stays warming.
    """
    started = time.monotonic()
    while (waited := time.monotonic() - started) < timeout_s:
        pins = client.pins()
        if pins and all(pin.get("state") == "ready" for pin in pins):
            return ", ".join(f"{pin['name']} ({pin['tokens']} tokens)" for pin in pins)
        if not pins and waited > first_pin_s:
            break
        time.sleep(1)
    return "none ready"


def speech_of(result: dict[str, Any], limit: int = 400) -> str:
    """The spoken answer on one line (shortened), or what kind of response came back."""
    response = result.get("response", {})
    speech = " ".join(str(response.get("speech", {}).get("plain", {}).get("speech", "")).split())
    if not speech:
        return f"(no text: {response.get('response_type', 'no response')})"
    return speech if len(speech) <= limit else speech[: limit - 3] + "..."


def ask(client: Client, number: int, question: str, agent_id: str) -> None:
    before = client.engine_stats()
    started = time.monotonic()
    result = client.converse(question, agent_id)
    elapsed = time.monotonic() - started
    after = client.engine_stats()

    print(f"[{number}] Q: {question}")
    print(f"    A: {speech_of(result)}")
    data = result.get("response", {}).get("data", {})
    for outcome in ("success", "failed"):
        if targets := data.get(outcome):
            names = ", ".join(f"{t.get('name')} ({t.get('id')})" for t in targets)
            print(f"    Home Assistant reports {outcome}: {names}")
    requests = after["requests_total"] - before["requests_total"]
    if requests <= 0:
        print(f"    answered by {agent_id} without the engine in {elapsed:.1f} s")
        return
    last = after["last_request"]
    queried = after["prefix_cache_queries_tokens"] - before["prefix_cache_queries_tokens"]
    hits = after["prefix_cache_hits_tokens"] - before["prefix_cache_hits_tokens"]
    generated = after["generation_tokens_total"] - before["generation_tokens_total"]
    decode_s = after["decode_seconds_total"] - before["decode_seconds_total"]
    speed = f"{generated / decode_s:.1f} tok/s" if decode_s > 0 else "-"
    print(
        f"    TTFT {last['ttft_ms']:.0f} ms, cached {last['cached_tokens']}/"
        f"{last['prompt_tokens']} prompt tokens (last of {requests} engine request"
        f"{'s' if requests > 1 else ''}; turn total {hits}/{queried} cached)\n"
        f"    decode {speed} ({generated} tokens in the turn), answer in {elapsed:.1f} s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("question")
    parser.add_argument("--ha-url", required=True)
    parser.add_argument("--token-file", type=Path, required=True)
    parser.add_argument("--engine-url", required=True)
    parser.add_argument("--agent", default="conversation.hearth")
    parser.add_argument("--times", type=int, default=2)
    parser.add_argument("--pin-timeout", type=float, default=900.0)
    args = parser.parse_args()

    token = args.token_file.read_text(encoding="utf-8").strip()
    client = Client(args.ha_url.rstrip("/"), token, args.engine_url.rstrip("/"))
    try:
        pinned = args.agent == "conversation.hearth"
        if pinned:
            wait_for_pins(client, args.pin_timeout)
        for number in range(1, args.times + 1):
            ask(client, number, args.question, args.agent)
        if pinned:
            # After the turns: a pin restored from the store may be replaced by the house's
            # own once the plugin has rendered it (a changed house pins on first use).
            print(f"pinned prefixes: {wait_for_pins(client, args.pin_timeout)}", flush=True)
    except urllib.error.HTTPError as err:
        detail = err.read().decode(errors="replace")[:500]
        print(f"request to {err.url} failed: HTTP {err.code} {detail}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, TimeoutError, KeyError) as err:
        print(f"asking Assist failed: {err!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
