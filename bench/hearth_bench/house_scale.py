"""``--house-scale N`` on the bench's side: the demo house with N guest suites added.

Home Assistant builds the suites itself: the demo integration reads
``HEARTH_HOUSE_SCALE`` when it starts (``config/custom_components/hearth_demo/scale.py``),
and harness/stack.py gives every Home Assistant it starts that variable (0 unless asked, so one
left in a shell never scales a run by surprise). The bench reads N with the demo's own
rule: it loads scale.py by its path, which needs no Home Assistant.
"""

from __future__ import annotations

import argparse
import importlib.util
from functools import cache
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
SCALE_PY = ROOT / "config" / "custom_components" / "hearth_demo" / "scale.py"


@cache
def scale_module() -> ModuleType:
    """The demo's scale.py, loaded from its file."""
    spec = importlib.util.spec_from_file_location("hearth_demo_scale", SCALE_PY)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {SCALE_PY}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rooms_arg(text: str) -> int:
    """argparse's type for ``--house-scale``: the demo's message for a bad N."""
    try:
        return int(scale_module().parse_rooms(text))
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """``--house-scale N``; ``what`` says what the rooms are added to."""
    scale = scale_module()
    parser.add_argument(
        "--house-scale",
        type=rooms_arg,
        default=0,
        metavar="N",
        help=f"add N guest suites to {what}, {scale.ENTITIES_PER_ROOM} exposed entities each"
        f" (0 to {scale.MAX_ROOMS}; the demo house has 106 entities, so 32 makes about 300"
        " and 150 about 1,000)",
    )


def environment(rooms: int) -> dict[str, str]:
    """What Home Assistant's environment carries for ``rooms`` guest suites."""
    return {scale_module().ENV_HOUSE_SCALE: str(rooms)}


def describe(rooms: int, exposed: int | None, house: str = "the demo house") -> str:
    """One line on the house a run used."""
    if rooms:
        house = f"{house} + {rooms} guest suites"
    return house if exposed is None else f"{house}: {exposed} entities exposed to Assist"
