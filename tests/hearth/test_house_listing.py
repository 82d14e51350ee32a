"""The house listing: HA's static-context facts said once per area and domain, fitted to
a budget by leaving out what a voice user needs least (``house/listing.py``)."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from custom_components.hearth.house.diff import HouseEntity
from custom_components.hearth.house.listing import (
    NO_AREA,
    drop_order,
    fit,
    render_listing,
    replace_yaml,
)


def _thing(name: str, domain: str, areas: str = "", aliases: str = "") -> HouseEntity:
    names = f"{name}, {aliases}" if aliases else name
    return HouseEntity(
        name=name,
        names=names,
        domain=domain,
        area=areas.split(", ", maxsplit=1)[0] if areas else None,
        areas=areas,
        acts=domain not in ("sensor", "binary_sensor"),
    )


HOUSE = [
    _thing("Kitchen Lights", "light", "Kitchen, cookhouse", "counter lights"),
    _thing("Pendant", "light", "Kitchen, cookhouse"),
    _thing("Coffee Maker", "switch", "Kitchen, cookhouse"),
    _thing("Attic Temperature", "sensor", "Attic"),
    _thing("Attic Light", "light", "Attic"),
    _thing("Outside Temperature", "sensor"),
]


def test_one_heading_per_area_one_line_per_domain() -> None:
    assert render_listing(HOUSE) == (
        "Attic:\n"
        "- light: Attic Light\n"
        "- sensor: Attic Temperature\n"
        "Kitchen (cookhouse):\n"
        "- light: Kitchen Lights (counter lights); Pendant\n"
        "- switch: Coffee Maker\n"
        f"{NO_AREA}:\n"
        "- sensor: Outside Temperature\n"
    )
    assert render_listing([]) == ""


@given(st.randoms(use_true_random=False))
def test_the_listing_is_the_same_in_any_order(rng: random.Random) -> None:
    """HA sorts by state name, registries by id: the listing must not care."""
    shuffled = list(HOUSE)
    rng.shuffle(shuffled)
    assert render_listing(shuffled) == render_listing(HOUSE)


def test_every_fact_of_the_yaml_is_kept() -> None:
    listing = render_listing(HOUSE)
    for thing in HOUSE:
        for word in (*thing.names.split(", "), *thing.areas.split(", "), thing.domain):
            if word:
                assert word in listing


def test_read_only_things_go_first_then_the_last_areas() -> None:
    order = [thing.name for thing in drop_order(HOUSE)]
    assert order[:2] == ["Outside Temperature", "Attic Temperature"]  # sensors, no area first
    assert order[2:] == ["Coffee Maker", "Pendant", "Kitchen Lights", "Attic Light"]


def test_fit_keeps_the_most_that_fit() -> None:
    full = render_listing(HOUSE)
    assert fit(HOUSE, lambda text: True).listing == full
    assert fit(HOUSE, lambda text: True).left_out == ()
    limit = len(render_listing(HOUSE[:3] + HOUSE[4:5]))  # without the two sensors
    fitted = fit(HOUSE, lambda text: len(text) <= limit)
    assert {thing.name for thing in fitted.left_out} == {"Attic Temperature", "Outside Temperature"}
    assert fitted.listing == render_listing(fitted.kept)
    assert len(fitted.listing) <= limit
    nothing = fit(HOUSE, lambda text: text == "")
    assert nothing.kept == () and len(nothing.left_out) == len(HOUSE)


@given(st.integers(min_value=0, max_value=400))
def test_fit_never_leaves_out_more_than_it_must(limit: int) -> None:
    fitted = fit(HOUSE, lambda text: len(text) <= limit)
    assert len(fitted.listing) <= limit or not fitted.kept
    if fitted.left_out:  # one fewer left out would not fit
        order = drop_order(HOUSE)
        fewer = order[: len(fitted.left_out) - 1]
        assert len(render_listing([t for t in HOUSE if t not in fewer])) > limit


YAML = (
    "- names: Kitchen Lights, counter lights\n  domain: light\n  areas: Kitchen, cookhouse\n"
    "- names: Attic Light\n  domain: light\n  areas: Attic\n"
)


def test_the_yaml_is_replaced_where_it_is() -> None:
    prompt = f"Static Context: An overview:\n{YAML}You are in area Attic.\n"
    assert replace_yaml(prompt, YAML, "LISTING\n") == (
        "Static Context: An overview:\nLISTING\nYou are in area Attic.\n"
    )
    # Not the exact text (HA's house moved on since the render): the YAML block still goes.
    other = YAML.replace("Attic Light", "Loft Light")
    assert replace_yaml(prompt, other, "LISTING\n") == (
        "Static Context: An overview:\nLISTING\nYou are in area Attic.\n"
    )
    assert replace_yaml("No entities.\n", YAML, "LISTING\n") == "No entities.\n"
