"""Every relative link and ``#anchor`` in README.md and docs/*.md leads somewhere.

Anchors are computed from headings as GitHub computes them: the heading's text (inline
code, links and emphasis reduced to their words), lower-cased, every character that is not
a letter, digit, space, hyphen or underscore dropped, spaces made hyphens, and a repeated
anchor numbered ``-1``, ``-2``... Fenced code blocks hold no headings and no links.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_INLINE_CODE = re.compile(r"`+[^`]*`+")
_MARKUP_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line outside fenced code blocks."""
    lines: list[tuple[int, str]] = []
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's markdown text (without its numbering suffix)."""
    text = _MARKUP_LINK.sub(r"\1", heading)
    text = text.replace("`", "")
    text = re.sub(r"[*_]{1,3}(\S(?:.*?\S)?)[*_]{1,3}", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor the headings of a markdown text define."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, line in _prose_lines(text):
        match = _HEADING.match(line)
        if match is None:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(path: Path) -> list[str]:
    """'file:line: target (why)' for every relative link or anchor that leads nowhere."""
    problems: list[str] = []
    own_anchors = anchors(path.read_text(encoding="utf-8"))
    for number, line in _prose_lines(path.read_text(encoding="utf-8")):
        for target in _LINK.findall(_INLINE_CODE.sub("", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
                continue  # http:, https:, mailto: ...
            where = f"{path.relative_to(ROOT)}:{number}: {target}"
            file_part, _, anchor = target.partition("#")
            if file_part:
                linked = (path.parent / file_part).resolve()
                if not linked.exists():
                    problems.append(f"{where} (no such file)")
                    continue
                if (
                    anchor
                    and linked.suffix == ".md"
                    and anchor not in anchors(linked.read_text(encoding="utf-8"))
                ):
                    problems.append(f"{where} (no such heading in {file_part})")
            elif anchor not in own_anchors:
                problems.append(f"{where} (no such heading)")
    return problems


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_lead_somewhere(path: Path) -> None:
    assert broken_links(path) == []


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Scale out: llama.cpp, vLLM and SGLang", "scale-out-llamacpp-vllm-and-sglang"),
        ("`--model` (serve and generate)", "--model-serve-and-generate"),
        (
            "1. The integration (Home Assistant 2026.10 or newer)",
            "1-the-integration-home-assistant-202610-or-newer",
        ),
        (
            "The `hearth` extension: values from the house",
            "the-hearth-extension-values-from-the-house",
        ),
        ("[Linked](x.md) and **bold** words", "linked-and-bold-words"),
        ("snake_case stays", "snake_case-stays"),
    ],
)
def test_anchor_is_githubs(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_a_broken_anchor_or_file_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check fails where it should: a missing heading, a missing file, a missing
    heading in another file; a repeated heading's numbered anchor and code are fine."""
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    (tmp_path / "other.md").write_text("# Other\n\n## Part\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n## Setup\n\n## Setup\n\n"
        "[ok](#setup-1) [ok](other.md#part) [ok](other.md) [web](https://example.org/#x)\n"
        "`[in code](#nowhere)`\n\n```\n[fenced](#nowhere)\n# not a heading\n```\n"
        "[bad](#set-up) [gone](missing.md) [bad](other.md#whole)\n",
        encoding="utf-8",
    )
    assert broken_links(page) == [
        "page.md:14: #set-up (no such heading)",
        "page.md:14: missing.md (no such file)",
        "page.md:14: other.md#whole (no such heading in other.md)",
    ]
