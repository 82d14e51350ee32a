"""What hassfest (HA core's ``script/hassfest``) rejects in an integration's
``strings.json``, ``translations/*.json`` and ``manifest.json``, written down as rules.

These are this project's own rules, read from hassfest's translation and manifest
schemas (Home Assistant 2026.x): every function returns the problems it finds as lines
(``path: why``), an empty list when there are none. Only sections this integration uses
are checked in depth; any other section hassfest allows is accepted as a name only.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

Problems = list[str]
Rule = Callable[[Any, str], Problems]

# Top-level sections of strings.json that hassfest's schema knows.
SECTIONS = frozenset(
    {
        "title",
        "config",
        "config_subentries",
        "options",
        "preview_features",
        "selector",
        "device_automation",
        "system_health",
        "config_panel",
        "application_credentials",
        "issues",
        "entity_component",
        "device",
        "entity",
        "exceptions",
        "services",
        "conditions",
        "triggers",
        "conversation",
        "common",
    }
)
_SLUG = re.compile(r"^[a-z0-9]+(_[a-z0-9]+)*$")  # HA's cv.slug, as a pattern
_KEY = re.compile(r"^(?![_-])(?!.*[_-]{2})[a-z0-9_-]+(?<![_-])$")  # a translation key
_HTML = re.compile(r"<[a-z/!][^<>]*>", re.IGNORECASE)
_QUOTED_PLACEHOLDER = re.compile(r"'\{\w+\}'")
_COMBINED_REFERENCE = re.compile(r".\[%|%\].")
_URL = re.compile(
    r"((ftp|ftps|scp|http|https|mqtt|mqtts|socket|socks5)://|www\.)"
    r"[a-z0-9]+([-.][a-z0-9]+)*\.[a-z]{2,5}(:\d{1,5})?",
    re.IGNORECASE,
)


def placeholders(text: str) -> set[str]:
    """The ``{name}`` placeholders of a translation string."""
    return {field for _, field, _, _ in string.Formatter().parse(text) if field}


def text(value: Any, path: str, *, allow_placeholders: bool = True) -> Problems:
    """A translation string: no HTML, URLs, padding, quoted or odd placeholders."""
    if not isinstance(value, str):
        return [f"{path}: expected a string, got {type(value).__name__}"]
    why: list[str] = []
    if _HTML.search(value):
        why.append("contains HTML")
    if _QUOTED_PLACEHOLDER.search(value):
        why.append("a placeholder inside single quotes")
    try:
        fields = placeholders(value)
    except ValueError as err:
        fields, why = set(), [*why, f"unbalanced braces ({err})"]
    if fields and not allow_placeholders:
        why.append("placeholders are not allowed here")
    why.extend(f"placeholder {f!r} is not an identifier" for f in fields if not f.isidentifier())
    if _COMBINED_REFERENCE.search(value):
        why.append("a reference combined with other text")
    if value != value.strip():
        why.append("leading or trailing white space")
    if _URL.search(value):
        why.append("contains a URL (use a placeholder)")
    return [f"{path}: {reason}" for reason in why]


def plain(value: Any, path: str) -> Problems:
    """Any string (hassfest checks some names only for being text)."""
    return [] if isinstance(value, str) else [f"{path}: expected a string"]


def no_placeholders(value: Any, path: str) -> Problems:
    return text(value, path, allow_placeholders=False)


def section(
    required: Mapping[str, Rule] | None = None, optional: Mapping[str, Rule] | None = None
) -> Rule:
    """A mapping with these keys only: ``required`` ones must be there."""
    required, optional = dict(required or {}), dict(optional or {})

    def check(value: Any, path: str) -> Problems:
        if not isinstance(value, dict):
            return [f"{path}: expected a mapping"]
        found = [f"{path}.{key}: missing" for key in required if key not in value]
        for key, item in value.items():
            rule = required.get(key) or optional.get(key)
            if rule is None:
                found.append(
                    f"{path}.{key}: unknown key (allowed: {sorted({*required, *optional})})"
                )
            else:
                found.extend(rule(item, f"{path}.{key}"))
        return found

    return check


def each(rule: Rule, key_pattern: re.Pattern[str] | None = None) -> Rule:
    """A mapping of any keys (matching ``key_pattern``) to values that meet ``rule``."""

    def check(value: Any, path: str) -> Problems:
        if not isinstance(value, dict):
            return [f"{path}: expected a mapping"]
        found: Problems = []
        for key, item in value.items():
            if key_pattern is not None and not key_pattern.match(key):
                found.append(f"{path}.{key}: not a valid key")
            found.extend(rule(item, f"{path}.{key}"))
        return found

    return check


def _flow(*, subentry: bool) -> Rule:
    """A config, options or subentry flow."""
    step = section(
        optional={
            "title": text,
            "description": text,
            "data": each(text),
            "data_description": each(text),
            "menu_options": each(text),
            "menu_option_descriptions": each(text),
            "submit": text,
            "sections": each(
                section(
                    optional={
                        "data": each(text),
                        "data_description": each(text),
                        "description": text,
                        "name": text,
                    }
                )
            ),
        }
    )
    optional: dict[str, Rule] = {
        "flow_title": text,
        "error": each(text),
        "abort": each(text),
        "progress": each(text),
        "create_entry": each(text),
        "initiate_flow": section(required={"user": text}),
    }
    required: dict[str, Rule] = {"step": each(step)}
    if subentry:
        required["entry_type"] = text
        required["initiate_flow"] = each(text)
        del optional["initiate_flow"]
    shape = section(required, optional)

    def check(value: Any, path: str) -> Problems:
        found = shape(value, path)
        if subentry and isinstance(value, dict) and "user" not in value.get("initiate_flow", {}):
            found.append(f"{path}.initiate_flow.user: missing")
        for step_id, info in (value.get("step") or {}).items() if isinstance(value, dict) else ():
            if not isinstance(info, dict):
                continue
            for key in info.get("data_description", {}):
                if key not in info.get("data", {}):
                    found.append(f"{path}.step.{step_id}.data_description.{key}: not in data")
        return found

    return check


def _issue(value: Any, path: str) -> Problems:
    found = section(
        required={"title": text}, optional={"description": text, "fix_flow": _flow(subentry=False)}
    )(value, path)
    if isinstance(value, dict) and ("description" in value) == ("fix_flow" in value):
        found.append(f"{path}: needs exactly one of description, fix_flow")
    return found


_STATES = each(no_placeholders, _KEY)
_ENTITY = each(
    each(
        section(
            optional={
                "name": text,
                "state": _STATES,
                "state_attributes": each(
                    section(optional={"name": no_placeholders, "state": _STATES}), _KEY
                ),
                "unit_of_measurement": no_placeholders,
            }
        ),
        _KEY,
    ),
    _SLUG,
)
_SERVICES = each(
    section(
        required={"name": text, "description": text},
        optional={
            "fields": each(
                section(required={"name": plain, "description": text}, optional={"example": text}),
                _KEY,
            ),
            "sections": each(
                section(required={"name": plain}, optional={"description": text}), _KEY
            ),
        },
    ),
    _KEY,
)
# The sections checked in depth; the others are accepted by name (SECTIONS).
_DEEP: dict[str, Rule] = {
    "title": text,
    "config": _flow(subentry=False),
    "options": _flow(subentry=False),
    "config_subentries": each(_flow(subentry=True), _SLUG),
    "entity": _ENTITY,
    "device": each(section(optional={"name": text}), _KEY),
    "exceptions": each(section(optional={"message": text}), _SLUG),
    "issues": each(_issue),
    "services": _SERVICES,
    "common": each(text, _SLUG),
    "conversation": section(required={"agent": section(required={"done": text})}),
}


def check_strings(strings: Any, name: str = "strings.json") -> Problems:
    """What hassfest's translation schema rejects in one strings file."""
    if not isinstance(strings, dict):
        return [f"{name}: expected a mapping"]
    found: Problems = []
    for key, value in strings.items():
        if key not in SECTIONS:
            found.append(f"{name}.{key}: unknown top-level section")
        elif (rule := _DEEP.get(key)) is not None:
            found.extend(rule(value, f"{name}.{key}"))
    return found


def flatten(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Leaves of a translation tree as ``(dotted key, value)``."""
    for key, value in tree.items():
        if isinstance(value, Mapping):
            yield from flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def check_translation(
    strings: Mapping[str, Any], translation: Mapping[str, Any], name: str, *, complete: bool
) -> Problems:
    """A translation against strings.json: the same schema, no keys strings.json lacks,
    the same placeholders per string, and (``complete``: English) every key."""
    found = check_strings(translation, name)
    source = dict(flatten(strings))
    target = dict(flatten(translation))
    found.extend(f"{name}: {key} is not in strings.json" for key in target.keys() - source.keys())
    if complete:
        found.extend(f"{name}: {key} is missing" for key in source.keys() - target.keys())
    for key in source.keys() & target.keys():
        try:
            same = placeholders(str(source[key])) == placeholders(str(target[key]))
        except ValueError:
            continue  # reported as unbalanced braces by check_strings
        if not same:
            found.append(f"{name}: {key} has other placeholders than strings.json")
    return found


IOT_CLASSES = frozenset(
    {"assumed_state", "calculated", "cloud_polling", "cloud_push", "local_polling", "local_push"}
)
INTEGRATION_TYPES = frozenset(
    {"device", "entity", "hardware", "helper", "hub", "service", "system"}
)
MANIFEST_KEYS = frozenset(
    {
        "domain",
        "name",
        "integration_type",
        "config_flow",
        "mqtt",
        "zeroconf",
        "ssdp",
        "bluetooth",
        "homekit",
        "dhcp",
        "usb",
        "documentation",
        "issue_tracker",
        "quality_scale",
        "requirements",
        "dependencies",
        "after_dependencies",
        "codeowners",
        "loggers",
        "disabled",
        "iot_class",
        "single_config_entry",
        "version",
        "import_executor",
    }
)
_REQUIREMENT = re.compile(
    r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?"
    r"((==|>=|<=|~=|!=|<|>)[0-9][A-Za-z0-9.*+!-]*)"
    r"(,(==|>=|<=|~=|!=|<|>)[0-9][A-Za-z0-9.*+!-]*)*$"  # no spaces: hassfest refuses them
)
_VERSION = re.compile(r"^\d+(\.\d+)*([.-]?(a|b|rc|dev|post)\d*)?$")
_CODEOWNER = re.compile(r"^@[A-Za-z0-9][A-Za-z0-9-]*(/[A-Za-z0-9._-]+)?$")


def check_manifest(manifest: Any, folder: str, core_components: Path) -> Problems:
    """What hassfest rejects in a custom integration's manifest.json (plus HACS's
    non-empty codeowners)."""
    if not isinstance(manifest, dict):
        return ["manifest.json: expected a mapping"]
    found = [f"manifest.json: unknown key {key!r}" for key in manifest if key not in MANIFEST_KEYS]
    for key in ("domain", "name", "documentation", "codeowners", "iot_class", "version"):
        if key not in manifest:
            found.append(f"manifest.json: {key} is missing")
    if manifest.get("domain") != folder:
        found.append(
            f"manifest.json: domain {manifest.get('domain')!r} is not the folder {folder!r}"
        )
    if not isinstance(manifest.get("name", ""), str) or not manifest.get("name"):
        found.append("manifest.json: name must be a non-empty string")
    for key in ("documentation", "issue_tracker"):
        if key in manifest and not str(manifest[key]).startswith("https://"):
            found.append(f"manifest.json: {key} must be an https URL")
    owners = manifest.get("codeowners")
    if not isinstance(owners, list) or not owners:
        found.append("manifest.json: codeowners must name at least one owner")
    else:
        found.extend(
            f"manifest.json: codeowner {o!r} is not @user or @org/team"
            for o in owners
            if not isinstance(o, str) or not _CODEOWNER.match(o)
        )
    if "iot_class" in manifest and manifest["iot_class"] not in IOT_CLASSES:
        found.append(
            f"manifest.json: iot_class {manifest['iot_class']!r} is not one of "
            f"{sorted(IOT_CLASSES)}"
        )
    if manifest.get("integration_type", "hub") not in INTEGRATION_TYPES:
        found.append(f"manifest.json: integration_type {manifest['integration_type']!r} is unknown")
    if "config_flow" in manifest and not isinstance(manifest["config_flow"], bool):
        found.append("manifest.json: config_flow must be true or false")
    if not _VERSION.match(str(manifest.get("version", ""))):
        found.append(f"manifest.json: version {manifest.get('version')!r} is not a version")
    for requirement in manifest.get("requirements", []):
        if not isinstance(requirement, str) or not _REQUIREMENT.match(requirement):
            found.append(
                f"manifest.json: requirement {requirement!r} is not name + version "
                "specifiers without spaces"
            )
    for key in ("dependencies", "after_dependencies"):
        for domain in manifest.get(key, []):
            if not (core_components / str(domain) / "manifest.json").is_file():
                found.append(f"manifest.json: {key} names {domain!r}, not an integration of HA")
    keys = list(manifest)
    ordered = sorted(keys, key=lambda key: {"domain": "0", "name": "1"}.get(key, f"2{key}"))
    if keys != ordered:
        found.append("manifest.json: keys must be domain, name, then alphabetical")
    return found
