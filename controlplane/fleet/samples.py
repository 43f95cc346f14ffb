"""A heartbeat's samples as columns per GPU, whichever wire version brought them.

Version 2 heartbeats already carry columns; version 1 samples are regrouped once. Times become integer
microseconds since the epoch: exact (a datetime's own resolution), cheap to compare with the per-GPU watermark,
and cheap to cut into minutes, with no datetime object per sample.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import pairwise

from controlplane.fleet.rollup import MinuteFold
from nodeagent import schema

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ONE_US = timedelta(microseconds=1)
MINUTE_US = 60_000_000

Fields = dict[str, list[float | None]]


@dataclass
class GpuColumns:
    """One GPU's readings in time order: ``ts[i]`` (microseconds since the epoch) is the time of every
    ``fields[name][i]``."""

    ts: list[int] = field(default_factory=list)
    fields: Fields = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ts)

    def after(self, watermark_us: int | None) -> GpuColumns:
        """The readings strictly after ``watermark_us``: those at or before it were folded in already."""
        if watermark_us is None:
            return self
        first = bisect_right(self.ts, watermark_us)
        if first == 0:
            return self
        return GpuColumns(self.ts[first:], {name: values[first:] for name, values in self.fields.items()})

    def latest(self) -> dict[str, float | None]:
        return {name: values[-1] for name, values in self.fields.items()}

    def fold_into(self, folds: dict[tuple[int, datetime], MinuteFold], gpu_id: int) -> None:
        """Add these readings to their (GPU, minute) folds, one slice per minute."""
        ts, n, start = self.ts, len(self.ts), 0
        while start < n:
            minute = ts[start] // MINUTE_US
            stop = bisect_left(ts, (minute + 1) * MINUTE_US, start)
            key = (gpu_id, EPOCH + timedelta(minutes=minute))
            fold = folds.get(key)
            if fold is None:
                fold = folds[key] = MinuteFold()
            fold.add_columns(self.fields, start, stop)
            start = stop


def to_us(ts: datetime) -> int:
    """Microseconds since the epoch; a naive time is UTC, as the agent means it."""
    return ((ts if ts.tzinfo else ts.replace(tzinfo=UTC)) - EPOCH) // ONE_US


def from_us(us: int) -> datetime:
    return EPOCH + timedelta(microseconds=us)


def columns_by_gpu(heartbeat: schema.Heartbeat | schema.HeartbeatV1) -> dict[str, GpuColumns]:
    """Each GPU's readings, sorted by time (a stable sort: of two readings at one time, the later sent is the
    later)."""
    if isinstance(heartbeat, schema.HeartbeatV1):
        return _from_samples(heartbeat.samples)
    out: dict[str, GpuColumns] = {}
    for series in heartbeat.samples:
        # Rounded, not truncated: a float of epoch seconds is the nearest to the microsecond the agent meant.
        ts = [round(t * 1_000_000) for t in series.ts]
        columns = out.get(series.uuid)
        if columns is None:
            out[series.uuid] = GpuColumns(ts, dict(series.fields))
        else:
            _extend(columns, ts, series.fields)
    for columns in out.values():
        _sort(columns)
    return out


def _extend(columns: GpuColumns, ts: list[int], fields: Fields) -> None:
    """Append a second series of the same GPU; a field only one of them has is null in the other's readings."""
    before, added = len(columns.ts), len(ts)
    names = dict.fromkeys([*columns.fields, *fields])
    # New lists: the first series' lists belong to the parsed heartbeat.
    columns.fields = {
        name: (columns.fields.get(name) or [None] * before) + (fields.get(name) or [None] * added) for name in names
    }
    columns.ts = columns.ts + ts


def _from_samples(samples: Iterable[schema.GpuSample]) -> dict[str, GpuColumns]:
    out = {}
    for uuid, (ts, fields) in schema.samples_as_columns(samples, to_us).items():
        columns = out[uuid] = GpuColumns(ts, fields)
        _sort(columns)
    return out


def _sort(columns: GpuColumns) -> None:
    ts = columns.ts
    if all(a <= b for a, b in pairwise(ts)):
        return  # the agent sends its readings in order: the usual case costs one pass
    order = sorted(range(len(ts)), key=ts.__getitem__)
    columns.ts = [ts[i] for i in order]
    columns.fields = {name: [values[i] for i in order] for name, values in columns.fields.items()}
