"""Hand-written UPDATEs for the heartbeat path: one UPDATE for many rows, each with its own values, without
the ORM's per-value expression building.

``QuerySet.bulk_update`` builds a ``Case(When(...))`` expression tree per field and row and resolves it in
Python; on the heartbeat path that cost more than the database work itself. This writes the same SQL
(``SET col = CASE id WHEN ... THEN ... END WHERE id IN (...)``) directly, with each value prepared by its
field exactly as ``save()`` would. ``update_row_statement`` is ``filter(pk=...).update(...)`` without
compiling the query each time. Each builds a statement; ``execute_together`` sends a heartbeat's writes at once.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import date, datetime
from typing import Any

from django.db import connection
from django.db.models import Field, Model

Statement = tuple[str, list[Any]]


def bulk_set_statement(objs: Sequence[Model], fields: Sequence[str]) -> Statement:
    """The UPDATE that writes ``fields`` of every object in ``objs`` (same model, saved, at least one)."""
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
    return sql, params


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


def _json_ready(value: Any) -> Any:
    # The values come from the heartbeat's own code, already of their field's type: a JSON field's value is
    # nested as is (the column is jsonb); only dates need text. ``get_db_prep_save`` per value cost more than
    # the UPDATE.
    return value.isoformat() if isinstance(value, datetime | date) else value


def _bulk_set_json(objs: Sequence[Model], fields: Sequence[str]) -> Statement:
    """PostgreSQL: the rows travel as one JSON document, typed by ``jsonb_to_recordset``. One parameter, one
    statement text for any number of rows: the driver neither re-parses the SQL nor quotes a value per cell,
    which on this path cost more than the UPDATE itself."""
    meta = objs[0]._meta
    columns: list[Field] = []
    for field in [meta.pk, *(meta.get_field(name) for name in fields)]:
        assert isinstance(field, Field), f"{field.name} is not a concrete field"
        columns.append(field)
    names = [(str(f.column), f.attname) for f in columns]
    rows = [{column: _json_ready(getattr(obj, attname)) for column, attname in names} for obj in objs]
    return _bulk_set_json_sql(type(objs[0]), tuple(fields)), [json.dumps(rows, allow_nan=False)]


@functools.cache
def _update_row_sql(model: type[Model], names: tuple[str, ...]) -> str:
    qn = connection.ops.quote_name
    meta = model._meta
    sets = ", ".join(f"{qn(str(meta.get_field(name).column))} = %s" for name in names)  # type: ignore[union-attr]
    return f"UPDATE {qn(meta.db_table)} SET {sets} WHERE {qn(str(meta.pk.column))} = %s"  # noqa: S608


def update_row_statement(obj: Model, values: Mapping[str, Any]) -> Statement:
    """The UPDATE that writes ``values`` (field name -> value) to ``obj``'s row, each prepared by its field."""
    names = tuple(sorted(values))
    meta = obj._meta
    params = [meta.get_field(name).get_db_prep_save(values[name], connection) for name in names]  # type: ignore[union-attr]
    params.append(obj.pk)
    return _update_row_sql(type(obj), names), params


def execute_together(statements: Sequence[Statement], query: Statement | None = None) -> tuple[Any, ...] | None:
    """Run data-modifying statements on different tables, then ``query`` if given, as one round trip where the
    database allows it; returns ``query``'s first row.

    PostgreSQL runs every statement in a ``WITH`` (a data-modifying CTE) whether or not anything reads it, all
    on one snapshot, with ``query`` (or the last statement) as the main statement. That is safe only because no
    statement, nor ``query``, reads what another writes. Each statement cost a round trip of its own, with its
    driver and Django overhead, on the heartbeat path. Elsewhere (SQLite has no data-modifying CTEs) they run
    one after the other.
    """
    main = query if query is not None else statements[-1] if statements else None
    if main is None:
        return None
    ctes = [statement for statement in statements if statement is not main]
    with connection.cursor() as cursor:
        if connection.vendor != "postgresql" or not ctes:
            for sql, params in [*ctes, main]:
                cursor.execute(sql, params)
        else:
            with_sql = ", ".join(f"w{i} AS ({sql})" for i, (sql, _) in enumerate(ctes))
            params = [value for _, statement_params in ctes for value in statement_params]
            cursor.execute(f"WITH {with_sql} {main[0]}", params + main[1])
        return cursor.fetchone() if query is not None else None
