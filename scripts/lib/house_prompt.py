"""Size the demo house's stable prompt in tokens (run by scripts/house-prompt).

Asks the running Home Assistant for the Assist LLM API prompt and tools
(`hearth_demo.render_prompt`) and counts them with a model's tokenizer: the prompt alone,
the tools as JSON, the system turn as the engine's chat template renders it, and what
Hearth's worked examples (examples.py) add after it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def fetch_prompt(url: str, token: str) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{url}/api/services/hearth_demo/render_prompt?return_response",
        data=b"{}",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)["service_response"]


def main() -> int:
    port = os.environ.get("HEARTH_HA_PORT", "8123")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=f"http://127.0.0.1:{port}", help="Home Assistant URL")
    parser.add_argument("--token-file", type=Path, default=ROOT / "config" / ".demo_token")
    parser.add_argument("--model", default="default", help="default, tiny or a model folder")
    parser.add_argument("--dump", type=Path, help="also write the prompt and tools as JSON here")
    args = parser.parse_args()

    try:
        token = args.token_file.read_text(encoding="utf-8").strip()
        rendered = fetch_prompt(args.url, token)
    except (OSError, urllib.error.URLError) as err:
        print(f"cannot get the prompt from {args.url} (is scripts/develop running?): {err}")
        return 1
    if args.dump:
        args.dump.write_text(json.dumps(rendered, indent=1), encoding="utf-8")

    from transformers import AutoTokenizer

    from hearth_engine.model.loader import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model(args.model)))
    prompt, tools = rendered["prompt"], rendered["tools"]
    system = tokenizer.apply_chat_template(
        [{"role": "system", "content": prompt}], tools=tools, tokenize=False
    )

    def count(text: str) -> int:
        return len(tokenizer(text)["input_ids"])

    prompt_tokens, tools_tokens = count(prompt), count(json.dumps(tools))
    print(f"Assist API prompt:           {prompt_tokens:6d} tokens ({len(prompt)} chars)")
    print(f"tools as JSON ({len(tools):2d} tools):    {tools_tokens:6d} tokens")
    print(f"prompt + tools:              {prompt_tokens + tools_tokens:6d} tokens")
    print(f"system turn (chat template): {count(system):6d} tokens ({args.model} tokenizer)")
    examples = rendered.get("examples") or []
    with_examples = tokenizer.apply_chat_template(
        [{"role": "system", "content": prompt}, *examples], tools=tools, tokenize=False
    )
    requests = sum(message["role"] == "user" for message in examples)
    print(
        f"worked examples ({requests:2d} requests): {count(with_examples) - count(system):6d}"
        " tokens after the system turn"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
