"""``scripts/lib/apt_sources.sh``: the machine's own apt sources, for another suite.

``scripts/setup`` fetches Python 3.14 from Debian forky through the archive the machine
already uses (a local mirror included), so the project names no host: only the suite
of the release's own entries changes.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "lib" / "apt_sources.sh"
KEY = "/usr/share/keyrings/debian-archive-keyring.gpg"


def _sources(etc: Path, codename: str = "bookworm") -> str:
    command = f'source "{SCRIPT}"; apt_sources_for_suite forky {codename} "{etc}"'
    result = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, check=True, timeout=30
    )
    assert result.stderr == ""
    return result.stdout


def test_a_deb822_file_keeps_everything_but_the_suite(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\n"
        "# a comment about the snapshot\n"
        "URIs: http://archive.invalid/debian http://other.invalid/debian\n"
        "Suites: bookworm bookworm-updates\n"
        "Components: main contrib\n"
        f"Signed-By: {KEY}\n"
        "\n"
        "Types: deb\n"
        "URIs: http://archive.invalid/debian-security\n"
        "Suites: bookworm-security\n"
        "Components: main\n"
    )
    assert _sources(tmp_path) == (
        "Types: deb\n"
        "URIs: http://archive.invalid/debian http://other.invalid/debian\n"
        "Suites: forky\n"
        "Components: main contrib\n"
        f"Signed-By: {KEY}\n"
        "\n"
    )


def test_an_inline_key_travels_whole_and_other_archives_stay_out(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "mirror.sources").write_text(
        "Types: deb deb-src\n"
        "URIs: http://mirror.invalid/debian\n"
        "Suites: bookworm\n"
        "Components: main\n"
        "Signed-By:\n"
        " -----BEGIN PGP PUBLIC KEY BLOCK-----\n"
        " .\n"
        " -----END PGP PUBLIC KEY BLOCK-----\n"
        "\n"
        "Types: deb\n"
        "URIs: http://off.invalid/debian\n"
        "Suites: bookworm\n"
        "Components: main\n"
        "Enabled: no\n"
        "\n"
        "Types: deb\n"
        "URIs: http://vendor.invalid/node\n"
        "Suites: nodistro\n"
        "Components: main\n"
    )
    out = _sources(tmp_path)
    assert out.startswith("Types: deb\nURIs: http://mirror.invalid/debian\nSuites: forky\n")
    assert " -----END PGP PUBLIC KEY BLOCK-----\n" in out
    assert "off.invalid" not in out and "vendor.invalid" not in out


def test_one_line_sources_become_deb822_with_their_options(tmp_path: Path) -> None:
    (tmp_path / "sources.list").write_text(
        "# deb http://commented.invalid/debian bookworm main\n"
        f"deb [arch=amd64 signed-by={KEY}] http://mirror.invalid/debian bookworm main non-free\n"
        "deb http://mirror.invalid/debian bookworm-updates main\n"
        "deb-src http://mirror.invalid/debian bookworm main\n"
        "deb [ signed-by=/etc/apt/v.asc ] http://vendor.invalid/debian bookworm stable\n"
    )
    assert _sources(tmp_path) == (
        "Types: deb\n"
        "URIs: http://mirror.invalid/debian\n"
        "Suites: forky\n"
        "Components: main non-free\n"
        "Architectures: amd64\n"
        f"Signed-By: {KEY}\n"
        "\n"
    )


def test_nothing_for_another_release(tmp_path: Path) -> None:
    (tmp_path / "sources.list").write_text("deb http://mirror.invalid/debian bookworm main\n")
    assert _sources(tmp_path, codename="trixie") == ""
