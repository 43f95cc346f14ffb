"""Hand-written UPDATEs for the heartbeat path: one UPDATE for many rows, each with its own values, without
the ORM's per-value expression building.

``QuerySet.bulk_update`` builds a ``Case(When(...))`` expression tree per field and row and resolves it in
Python; on the heartbeat path that cost more than the database work itself. This writes the same SQL
(``SET col = CASE id WHEN ... THEN ... END WHERE id IN (...)``) directly, with each value prepared by its
field exactly as ``save()`` would. ``update_row`` is ``filter(pk=...).update(...)`` without compiling the
query each time.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import date, datetime
from typing import Any

from django.db import connection
from django.db.models import Field, JSONField, Model


def bulk_set(objs: Sequence[Model], fields: Sequence[str]) -> int:
    """Write ``fields`` of every object in ``objs`` (same model, saved) in one statement; returns rows updated."""
    if not objs or not fields:
        return 0
    meta = objs[0]._meta
    qn = connection.ops.quote_name
    pk_column = qn(str(meta.pk.column))
    if connection.vendor == "postgresql":
        return _bulk_set_json(objs, fields)
    sets: list[str] = []
    params: list[Any] = []
    for name in fields:
        field = meta.get_field(name)
        assert isinstance(field, Field), f"{name} is not a concrete field"
        whens = []
        for obj in objs:
            # No CAST: SQLite stores what it is given, and a CAST to its DATETIME affinity would turn an ISO
            # timestamp into a number.
            whens.append("WHEN %s THEN %s")
            params.append(obj.pk)
            params.append(field.get_db_prep_save(getattr(obj, field.attname), connection))
        sets.append(f"{qn(str(field.column))} = CASE {pk_column} {' '.join(whens)} END")
    params.extend(obj.pk for obj in objs)
    sql = (
        f"UPDATE {qn(meta.db_table)} SET {', '.join(sets)} "  # noqa: S608 - identifiers from model metadata
        f"WHERE {pk_column} IN ({', '.join(['%s'] * len(objs))})"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


@functools.cache
def _bulk_set_json_sql(model: type[Model], names: tuple[str, ...]) -> str:
    qn = connection.ops.quote_name
    meta = model._meta
    columns = [meta.pk, *(meta.get_field(name) for name in names)]
    record = ", ".join(f"{qn(str(f.column))} {f.db_type(connection)}" for f in columns)  # type: ignore[union-attr]
    sets = ", ".join(f"{qn(str(f.column))} = v.{qn(str(f.column))}" for f in columns[1:])  # type: ignore[union-attr]
    table = qn(meta.db_table)
    pk = qn(str(meta.pk.column))
    return (
        f"UPDATE {table} SET {sets} FROM jsonb_to_recordset(%s::jsonb) AS v({record}) "  # noqa: S608 - identifiers
        f"WHERE {table}.{pk} = v.{pk}"
    )


def _json_ready(field: Field, value: Any) -> Any:
    if isinstance(field, JSONField):
        return value  # nested as is: the column is jsonb
    value = field.get_db_prep_save(value, connection)
    return value.isoformat() if isinstance(value, datetime | date) else value


def _bulk_set_json(objs: Sequence[Model], fields: Sequence[str]) -> int:
    """PostgreSQL: the rows travel as one JSON document, typed by ``jsonb_to_recordset``. One parameter, one
    statement text for any number of rows: the driver neither re-parses the SQL nor quotes a value per cell,
    which on this path cost more than the UPDATE itself."""
    meta = objs[0]._meta
    columns: list[Field] = []
    for field in [meta.pk, *(meta.get_field(name) for name in fields)]:
        assert isinstance(field, Field), f"{field.name} is not a concrete field"
        columns.append(field)
    rows = [{str(f.column): _json_ready(f, getattr(obj, f.attname)) for f in columns} for obj in objs]
    with connection.cursor() as cursor:
        cursor.execute(_bulk_set_json_sql(type(objs[0]), tuple(fields)), [json.dumps(rows, allow_nan=False)])
        return cursor.rowcount


@functools.cache
def _update_row_sql(model: type[Model], names: tuple[str, ...]) -> str:
    qn = connection.ops.quote_name
    meta = model._meta
    sets = ", ".join(f"{qn(str(meta.get_field(name).column))} = %s" for name in names)  # type: ignore[union-attr]
    return f"UPDATE {qn(meta.db_table)} SET {sets} WHERE {qn(str(meta.pk.column))} = %s"  # noqa: S608


def update_row(obj: Model, values: Mapping[str, Any]) -> int:
    """Write ``values`` (field name -> value) to ``obj``'s row, each prepared by its field; returns rows updated."""
    names = tuple(sorted(values))
    meta = obj._meta
    params = [meta.get_field(name).get_db_prep_save(values[name], connection) for name in names]  # type: ignore[union-attr]
    params.append(obj.pk)
    with connection.cursor() as cursor:
        cursor.execute(_update_row_sql(type(obj), names), params)
        return cursor.rowcount
