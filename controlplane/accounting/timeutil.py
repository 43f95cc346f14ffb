"""Hour arithmetic in UTC: the grid every accounting figure is split on."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

HOUR = timedelta(hours=1)


def utc(ts: datetime) -> datetime:
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


def hour_floor(ts: datetime) -> datetime:
    return utc(ts).replace(minute=0, second=0, microsecond=0)


def is_on_the_hour(ts: datetime) -> bool:
    return utc(ts) == hour_floor(ts)


def overlap_s(a_start: datetime, a_end: datetime, b_start: datetime, b_end: datetime) -> float:
    return max(0.0, (min(a_end, b_end) - max(a_start, b_start)).total_seconds())


def split_by_hour(start: datetime, end: datetime) -> Iterator[tuple[datetime, float]]:
    """(hour, seconds) for each UTC hour the interval [start, end) touches."""
    hour = hour_floor(start)
    while hour < end:
        seconds = overlap_s(start, end, hour, hour + HOUR)
        if seconds > 0:
            yield hour, seconds
        hour += HOUR


def month_start(ts: datetime) -> datetime:
    return utc(ts).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def next_month(ts: datetime) -> datetime:
    first = month_start(ts)
    return first.replace(year=first.year + 1, month=1) if first.month == 12 else first.replace(month=first.month + 1)
