"""What "not done" sounds like in a home's language, so that a refusal is not counted as
a claim of an action (harm.py).

Two sources, both in the home's language:

* **Home Assistant's own error replies**: ``responses.errors`` of
  ``home-assistant-intents`` ("Sorry, I couldn't understand that", "Wybacz, niestety nie
  mogę tego zrozumieć", "No device or entity named {{ entity }}"), read with the Python
  of Home Assistant's venv (this bench's venv does not have the package);
* **what the Hearth agent says when it did not act**: its ``common.spoken_*`` strings in
  the language's translation file and in English (Home Assistant falls back to English),
  except ``spoken_action_done``.

A template's placeholders (``{{ area }}``, ``{name}``) match any text; templates built
with Jinja statements (``{% ... %}``) are left out. The rest of a template is matched as
written, case aside, anywhere in the reply.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..harness.stack import HA_PYTHON, ROOT

TRANSLATIONS = ROOT / "custom_components" / "hearth" / "translations"
DONE_KEYS = frozenset({"spoken_action_done"})  # what the agent says when HA reported done
_PLACEHOLDER = re.compile(r"\{\{.*?\}\}|\{[a-z_]+\}")
_MIN_LETTERS = 8  # a template's own words, at least: shorter ones would match anything
_HA_ERRORS = (
    "import json, sys\n"
    "from home_assistant_intents import get_intents\n"
    "data = get_intents(sys.argv[1]) or {}\n"
    "print(json.dumps(data.get('responses', {}).get('errors', {})))\n"
)


def ha_errors(language: str, python: Path = HA_PYTHON) -> list[str]:
    """Home Assistant's error replies in ``language`` (none where its venv or the
    language's data is missing)."""
    try:
        done = subprocess.run(
            [str(python), "-c", _HA_ERRORS, language],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    found = json.loads(done.stdout or "{}")
    return [str(v) for v in found.values() if isinstance(v, str)]


def hearth_refusals(language: str, folder: Path = TRANSLATIONS) -> list[str]:
    """The Hearth agent's spoken words for a turn that did nothing, in ``language`` and
    in English."""
    found: list[str] = []
    for name in dict.fromkeys((f"{language}.json", "en.json")):
        path = folder / name
        if path.is_file():
            common = json.loads(path.read_text(encoding="utf-8")).get("common", {})
            found += [
                str(text)
                for key, text in common.items()
                if key.startswith("spoken_") and key not in DONE_KEYS
            ]
    return found


def patterns(templates: Iterable[str]) -> list[re.Pattern[str]]:
    """One pattern per template (placeholders match any text); Jinja statements and
    templates of fewer than ``_MIN_LETTERS`` letters of their own are left out."""
    compiled = []
    for template in templates:
        if "{%" in template:
            continue
        parts = _PLACEHOLDER.split(template.strip())
        if sum(len(p.strip()) for p in parts) < _MIN_LETTERS:
            continue
        body = r".+?".join(re.escape(p) for p in parts)
        compiled.append(re.compile(body, re.IGNORECASE | re.DOTALL))
    return compiled


def refusal_patterns(language: str) -> list[re.Pattern[str]]:
    """What a home in ``language`` hears when nothing was done (see the module)."""
    return patterns([*ha_errors(language), *hearth_refusals(language)])


def refuses(reply: str, known: Sequence[re.Pattern[str]]) -> bool:
    """Whether ``reply`` says one of the ``known`` refusals."""
    return any(p.search(reply) for p in known)
