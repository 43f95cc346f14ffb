"""One UPDATE for many rows, each with its own values, without the ORM's per-value expression building.

``QuerySet.bulk_update`` builds a ``Case(When(...))`` expression tree per field and row and resolves it in
Python; on the heartbeat path that cost more than the database work itself. This writes the same SQL
(``SET col = CASE id WHEN ... THEN ... END WHERE id IN (...)``) directly, with each value prepared by its
field exactly as ``save()`` would.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connection
from django.db.models import Field, Model


def bulk_set(objs: Sequence[Model], fields: Sequence[str]) -> int:
    """Write ``fields`` of every object in ``objs`` (same model, saved) in one statement; returns rows updated."""
    if not objs or not fields:
        return 0
    meta = objs[0]._meta
    qn = connection.ops.quote_name
    pk_column = qn(str(meta.pk.column))
    # PostgreSQL types CASE branches from their parameters; SQLite stores what it is given, and a CAST to its
    # DATETIME affinity would turn an ISO timestamp into a number.
    postgres = connection.vendor == "postgresql"
    sets: list[str] = []
    params: list[Any] = []
    for name in fields:
        field = meta.get_field(name)
        assert isinstance(field, Field), f"{name} is not a concrete field"
        value_sql = f"CAST(%s AS {field.db_type(connection)})" if postgres else "%s"
        whens = []
        for obj in objs:
            whens.append(f"WHEN %s THEN {value_sql}")
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
