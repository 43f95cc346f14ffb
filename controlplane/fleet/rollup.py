"""Folding 1 Hz samples into per-minute rows with one statement per heartbeat.

The agent sends a few seconds of samples per heartbeat, so a minute's row is written by about a dozen
heartbeats. Samples are first folded per (GPU, minute) in Python - PostgreSQL refuses an upsert that touches
one row twice - then written with a single ``INSERT ... ON CONFLICT (gpu_id, minute) DO UPDATE`` that adds
counts and sums, keeps maxima, keeps the first energy reading and moves the last. The upsert is the same
on PostgreSQL and SQLite (3.24+): no GREATEST/MAX(a, b), whose NULL handling differs between the two. On
PostgreSQL the rows travel as one JSON document (``jsonb_to_recordset``), so the statement's text is the same
for any number of rows.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import connection

from controlplane.fleet.bulk import Statement
from controlplane.fleet.models import GpuTelemetryMinute
from nodeagent import schema


@dataclass
class MinuteFold:
    samples: int = 0
    util_samples: int = 0
    util_sum: float = 0.0
    util_max: float | None = None
    fb_used_max_mib: float | None = None
    power_samples: int = 0
    power_sum_w: float = 0.0
    temp_max_c: float | None = None
    energy_first_mj: float | None = None
    energy_last_mj: float | None = None
    sm_active_samples: int = 0
    sm_active_sum: float = 0.0
    tensor_active_samples: int = 0
    tensor_active_sum: float = 0.0
    dram_active_samples: int = 0
    dram_active_sum: float = 0.0

    def _profiling(self, name: str, values: list[float]) -> None:
        prefix = _PROFILING[name]
        setattr(self, f"{prefix}_samples", getattr(self, f"{prefix}_samples") + len(values))
        setattr(self, f"{prefix}_sum", getattr(self, f"{prefix}_sum") + sum(values))

    def add_columns(self, fields: Mapping[str, Sequence[float | None]], start: int, stop: int) -> None:
        """Fold readings ``start:stop`` of a GPU's columns at once: one pass over a slice of each field's list,
        no per-sample look-ups (a heartbeat after an outage brings hundreds)."""

        def readings(name: str) -> list[float]:
            column = fields.get(name)
            return [] if column is None else [v for v in column[start:stop] if v is not None]

        self.samples += stop - start
        if utils := readings(schema.GPU_UTIL):
            self.util_samples += len(utils)
            self.util_sum += sum(utils)
            self.util_max = _greatest(self.util_max, max(utils))
        if fbs := readings(schema.FB_USED):
            self.fb_used_max_mib = _greatest(self.fb_used_max_mib, max(fbs))
        if powers := readings(schema.POWER_USAGE):
            self.power_samples += len(powers)
            self.power_sum_w += sum(powers)
        if temps := readings(schema.GPU_TEMP):
            self.temp_max_c = _greatest(self.temp_max_c, max(temps))
        if energies := readings(schema.TOTAL_ENERGY):
            if self.energy_first_mj is None:
                self.energy_first_mj = energies[0]
            self.energy_last_mj = energies[-1]
        for name in schema.PROFILING_FIELDS:
            if name in fields and (values := readings(name)):
                self._profiling(name, values)

    def add(self, fields: dict[str, float | None]) -> None:
        self.samples += 1
        util = fields.get(schema.GPU_UTIL)
        if util is not None:
            self.util_samples += 1
            self.util_sum += util
            self.util_max = util if self.util_max is None else max(self.util_max, util)
        fb = fields.get(schema.FB_USED)
        if fb is not None:
            self.fb_used_max_mib = fb if self.fb_used_max_mib is None else max(self.fb_used_max_mib, fb)
        power = fields.get(schema.POWER_USAGE)
        if power is not None:
            self.power_samples += 1
            self.power_sum_w += power
        temp = fields.get(schema.GPU_TEMP)
        if temp is not None:
            self.temp_max_c = temp if self.temp_max_c is None else max(self.temp_max_c, temp)
        energy = fields.get(schema.TOTAL_ENERGY)
        if energy is not None:
            if self.energy_first_mj is None:
                self.energy_first_mj = energy
            self.energy_last_mj = energy
        for name in schema.PROFILING_FIELDS:
            value = fields.get(name)
            if value is not None:
                self._profiling(name, [value])


# DCGM profiling field -> the prefix of its minute columns.
_PROFILING = {
    schema.PROF_SM_ACTIVE: "sm_active",
    schema.PROF_PIPE_TENSOR_ACTIVE: "tensor_active",
    schema.PROF_DRAM_ACTIVE: "dram_active",
}
_SUMMED = (
    "samples",
    "util_samples",
    "util_sum",
    "power_samples",
    "power_sum_w",
    *(f"{prefix}_{part}" for prefix in _PROFILING.values() for part in ("samples", "sum")),
)


def _greatest(current: float | None, new: float) -> float:
    return new if current is None else max(current, new)


def minute_of(ts: datetime) -> datetime:
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    return ts.astimezone(UTC).replace(second=0, microsecond=0)


_COLUMNS = (
    "gpu_id",
    "minute",
    "samples",
    "util_samples",
    "util_sum",
    "util_max",
    "fb_used_max_mib",
    "power_samples",
    "power_sum_w",
    "temp_max_c",
    "energy_first_mj",
    "energy_last_mj",
    *(f"{prefix}_{part}" for prefix in _PROFILING.values() for part in ("samples", "sum")),
)


def _greater(column: str, table: str) -> str:
    return (
        f"{column} = CASE WHEN excluded.{column} IS NULL THEN {table}.{column} "
        f"WHEN {table}.{column} IS NULL OR excluded.{column} > {table}.{column} THEN excluded.{column} "
        f"ELSE {table}.{column} END"
    )


def _rows_sql(rows: int) -> str:
    if rows == 0:
        # PostgreSQL: the rows travel as one JSON document, so the statement's text does not change with the
        # number of rows and the driver neither re-parses it nor quotes each value.
        meta = GpuTelemetryMinute._meta
        record = ", ".join(f"{c} {meta.get_field(c.removesuffix('_id')).db_type(connection)}" for c in _COLUMNS)
        return f"SELECT * FROM jsonb_to_recordset(%s::jsonb) AS r({record})"  # noqa: S608 - no user input in SQL
    placeholders = "(" + ", ".join(["%s"] * len(_COLUMNS)) + ")"
    return "VALUES " + ", ".join([placeholders] * rows)


@functools.cache
def _upsert_sql(rows: int, vendor: str) -> str:
    """The statement for ``rows`` rows (0: PostgreSQL's JSON document), written once per shape: building it
    (the column types) cost more than a heartbeat's fold."""
    table = connection.ops.quote_name(GpuTelemetryMinute._meta.db_table)
    updates = ", ".join(
        [
            *(f"{c} = {table}.{c} + excluded.{c}" for c in _SUMMED),
            *(_greater(c, table) for c in ("util_max", "fb_used_max_mib", "temp_max_c")),
            f"energy_first_mj = COALESCE({table}.energy_first_mj, excluded.energy_first_mj)",
            f"energy_last_mj = COALESCE(excluded.energy_last_mj, {table}.energy_last_mj)",
        ]
    )
    return (
        f"INSERT INTO {table} ({', '.join(_COLUMNS)}) {_rows_sql(rows)} "
        f"ON CONFLICT (gpu_id, minute) DO UPDATE SET {updates}"
    )


def _iso(value: object) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def minutes_statement(folds: dict[tuple[int, datetime], MinuteFold]) -> Statement | None:
    """The one upsert of the folded minutes; None when there is nothing to write."""
    if not folds:
        return None
    adapt = connection.ops.adapt_datetimefield_value
    rows: list[tuple[Any, ...]] = []
    # Sorted so concurrent heartbeats touching the same rows take their row locks in one order (no deadlock).
    for (gpu_id, minute), f in sorted(folds.items()):
        rows.append(
            (
                gpu_id,
                adapt(minute),
                f.samples,
                f.util_samples,
                f.util_sum,
                f.util_max,
                f.fb_used_max_mib,
                f.power_samples,
                f.power_sum_w,
                f.temp_max_c,
                f.energy_first_mj,
                f.energy_last_mj,
                f.sm_active_samples,
                f.sm_active_sum,
                f.tensor_active_samples,
                f.tensor_active_sum,
                f.dram_active_samples,
                f.dram_active_sum,
            )
        )
    if connection.vendor == "postgresql":
        try:
            document = json.dumps(
                [dict(zip(_COLUMNS, row, strict=True)) for row in rows], default=_iso, allow_nan=False
            )
            return _upsert_sql(0, connection.vendor), [document]
        except ValueError:
            pass  # a NaN or infinity, which JSON cannot carry: the plain VALUES list below can
    return _upsert_sql(len(rows), connection.vendor), [value for row in rows for value in row]
