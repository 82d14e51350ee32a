"""strings.json, translations/*.json and manifest.json pass hassfest's rules
(hassfest_rules.py); the rules themselves reject what hassfest rejects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import homeassistant.components
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from .hassfest_rules import check_manifest, check_strings, check_translation

PACKAGE = Path(__file__).resolve().parents[2] / "custom_components" / "hearth"
CORE_COMPONENTS = Path(homeassistant.components.__path__[0])
TRANSLATIONS = sorted((PACKAGE / "translations").glob("*.json"))


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def test_strings_json_passes() -> None:
    assert check_strings(_load(PACKAGE / "strings.json")) == []


@pytest.mark.parametrize("path", TRANSLATIONS, ids=lambda path: path.name)
def test_translation_passes(path: Path) -> None:
    strings = _load(PACKAGE / "strings.json")
    problems = check_translation(
        strings, _load(path), f"translations/{path.name}", complete=path.name == "en.json"
    )
    assert problems == []


def test_english_translation_exists() -> None:
    assert PACKAGE / "translations" / "en.json" in TRANSLATIONS


def test_manifest_passes() -> None:
    problems = check_manifest(_load(PACKAGE / "manifest.json"), PACKAGE.name, CORE_COMPONENTS)
    assert problems == []


# The rules, on what hassfest refuses (each case: a change to a valid file, what is said).
_VALID: dict[str, Any] = {
    "config": {"step": {"user": {"data": {"url": "URL"}, "data_description": {"url": "Where"}}}},
    "common": {"spoken_done": "Done."},
    "exceptions": {"cannot_connect": {"message": "Cannot reach {name}"}},
}


@pytest.mark.parametrize(
    ("strings", "said"),
    [
        (
            {**_VALID, "spoken": {"done": {"message": "Done."}}},
            "strings.json.spoken: unknown top-level",
        ),
        (
            {**_VALID, "dashboard": {"agent": "{name} agent"}},
            "strings.json.dashboard: unknown top-level",
        ),
        (
            {**_VALID, "exceptions": {"x": {"text": "Hi"}}},
            "strings.json.exceptions.x.text: unknown key",
        ),
        ({**_VALID, "common": {"Bad-Key": "Hi"}}, "strings.json.common.Bad-Key: not a valid key"),
        (
            {**_VALID, "common": {"x": {"message": "Hi"}}},
            "strings.json.common.x: expected a string",
        ),
        ({**_VALID, "common": {"x": " padded"}}, "leading or trailing white space"),
        ({**_VALID, "common": {"x": "see <b>this</b>"}}, "contains HTML"),
        ({**_VALID, "common": {"x": "go to https://example.com/a"}}, "contains a URL"),
        ({**_VALID, "common": {"x": "named '{name}'"}}, "inside single quotes"),
        ({**_VALID, "common": {"x": "{1bad}"}}, "not an identifier"),
        (
            {"config": {"step": {"user": {"data_description": {"url": "Where"}}}}},
            "data_description.url: not in data",
        ),
        ({"config": {"abort": {}}}, "strings.json.config.step: missing"),
        (
            {"config_subentries": {"conversation": {"step": {}, "initiate_flow": {"user": "Add"}}}},
            "config_subentries.conversation.entry_type: missing",
        ),
        (
            {"entity": {"sensor": {"x": {"state": {"on": "On {what}"}}}}},
            "placeholders are not allowed here",
        ),
        ({"issues": {"x": {"title": "T"}}}, "needs exactly one of description, fix_flow"),
        ({"services": {"x": {"name": "X"}}}, "strings.json.services.x.description: missing"),
    ],
)
def test_rules_reject(strings: dict[str, Any], said: str) -> None:
    problems = check_strings(strings)
    assert any(said in problem for problem in problems), problems


def test_valid_sample_passes() -> None:
    assert check_strings(_VALID) == []


def test_translation_rules() -> None:
    translation = {
        "config": {"step": {"user": {"data": {"url": "Adresse"}}}},
        "common": {"spoken_done": "Fertig {who}.", "spoken_gone": "Weg."},
        "exceptions": {"cannot_connect": {"message": "Nicht erreichbar: {name}"}},
    }
    problems = check_translation(_VALID, translation, "de.json", complete=True)
    assert "de.json: common.spoken_done has other placeholders than strings.json" in problems
    assert "de.json: common.spoken_gone is not in strings.json" in problems
    assert "de.json: config.step.user.data_description.url is missing" in problems
    assert not any("exceptions" in problem for problem in problems)
    # Only English must be complete.
    partial = {"common": {"spoken_done": "Fertig."}}
    assert check_translation(_VALID, partial, "de.json", complete=False) == []


def _manifest(**changes: Any) -> dict[str, Any]:
    manifest = _load(PACKAGE / "manifest.json")
    for key, value in changes.items():
        if value is None:
            manifest.pop(key, None)
        else:
            manifest[key] = value
    return manifest


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"domain": "other"}, "is not the folder"),
        ({"codeowners": []}, "codeowners must name at least one owner"),
        ({"codeowners": ["someone"]}, "is not @user or @org/team"),
        ({"documentation": None}, "documentation is missing"),
        ({"documentation": "http://example.com"}, "documentation must be an https URL"),
        ({"iot_class": "local_magic"}, "iot_class 'local_magic' is not one of"),
        ({"integration_type": "gadget"}, "integration_type 'gadget' is unknown"),
        ({"requirements": ["openai >= 2.0"]}, "is not name + version specifiers"),
        ({"requirements": ["openai"]}, "is not name + version specifiers"),
        ({"dependencies": ["no_such_integration"]}, "names 'no_such_integration'"),
        ({"after_dependencies": ["no_such_either"]}, "names 'no_such_either'"),
        ({"version": None}, "version is missing"),
        ({"colour": "red"}, "unknown key 'colour'"),
    ],
)
def test_manifest_rules_reject(changes: dict[str, Any], said: str) -> None:
    problems = check_manifest(_manifest(**changes), PACKAGE.name, CORE_COMPONENTS)
    assert any(said in problem for problem in problems), problems


def test_manifest_key_order() -> None:
    manifest = _manifest()
    reordered = {"name": manifest["name"], **{k: v for k, v in manifest.items() if k != "name"}}
    problems = check_manifest(reordered, PACKAGE.name, CORE_COMPONENTS)
    assert "manifest.json: keys must be domain, name, then alphabetical" in problems


def test_requirements_admit_home_assistants_pins() -> None:
    """Each requirement HA constrains admits HA's own pinned version (an exact pin that
    HA moves away from would stop the integration from loading)."""
    constraints = (CORE_COMPONENTS.parent / "package_constraints.txt").read_text().splitlines()
    pinned = {
        canonicalize_name(name): version
        for name, _, version in (line.partition("==") for line in constraints)
        if version and not name.startswith("#")
    }
    checked = 0
    for requirement in map(Requirement, _load(PACKAGE / "manifest.json")["requirements"]):
        if (version := pinned.get(canonicalize_name(requirement.name))) is not None:
            assert requirement.specifier.contains(version), (str(requirement), version)
            assert len(requirement.specifier) > 1 or "==" not in str(requirement.specifier)
            checked += 1
    assert checked >= 1  # openai is constrained by HA
