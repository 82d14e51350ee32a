"""Demo calendars: a fixed list of events (summary, start, end) from a fixture."""

from __future__ import annotations

import datetime
from typing import Any

from homeassistant.components.calendar import CalendarEntity, CalendarEvent
from homeassistant.const import Platform
from homeassistant.core import HomeAssistant
from homeassistant.util import dt as dt_util

from .entity import DemoEntity, demo_platform


def _when(value: str) -> datetime.date | datetime.datetime:
    """An ISO date (all day) or date and time (local time when it has no zone)."""
    if len(value) <= 10:
        return datetime.date.fromisoformat(value)
    moment = datetime.datetime.fromisoformat(value)
    return moment if moment.tzinfo else moment.replace(tzinfo=dt_util.get_default_time_zone())


class DemoCalendar(DemoEntity, CalendarEntity):
    """Events that never change; the state is on while one of them runs."""

    def apply_options(self, options: dict[str, Any]) -> None:
        """The fixture's events, in start order."""
        events = [
            CalendarEvent(_when(e["start"]), _when(e["end"]), e["summary"], uid=str(n))
            for n, e in enumerate(options["events"])
        ]
        self._events = sorted(events, key=lambda e: e.start_datetime_local)

    @property
    def event(self) -> CalendarEvent | None:
        """The event running now, or the next one."""
        now = dt_util.now()
        return next((e for e in self._events if e.end_datetime_local > now), None)

    async def async_get_events(
        self, hass: HomeAssistant, start_date: datetime.datetime, end_date: datetime.datetime
    ) -> list[CalendarEvent]:
        """The events that overlap the range."""
        return [
            e
            for e in self._events
            if e.end_datetime_local > start_date and e.start_datetime_local < end_date
        ]


async_setup_platform = demo_platform(Platform.CALENDAR, DemoCalendar)
