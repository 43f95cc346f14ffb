"""Row-level helpers for the few statements that run on every request (a heartbeat, a booking, its ledger
hold, the token lookup).

``select_list`` and ``build`` turn the columns of a hand-written SELECT into model instances without a
QuerySet: ``Model.objects.raw`` would do, but resolving its columns, converters and init order on every call
cost more than the database's work; here they are worked out once per model and database vendor, and a row
becomes an instance with ``Model.from_db``.

``insert`` does what ``bulk_create`` does for plain rows (each field's ``pre_save`` and database
preparation, the new primary keys set on the objects) in one ``INSERT ... RETURNING`` written directly:
building the statement through the ORM's query compiler costs several times what the database spends on it.
No model on this path has ``save()`` logic or signal receivers that an insert would skip.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from decimal import Context, Decimal
from typing import Any, TypeVar

from django.db import connection, models
from django.db.models import BooleanField, DateTimeField, JSONField, Model
from django.utils.dateparse import parse_datetime

M = TypeVar("M", bound=models.Model)

_FLOAT_DECIMALS = Context(prec=15)


def insert(objs: Sequence[M]) -> Sequence[M]:
    """Insert unsaved ``objs`` (one model) in one statement and set their primary keys."""
    if not objs:
        return objs
    meta = objs[0]._meta
    assert meta.pk is not None
    fields = [f for f in meta.concrete_fields if not f.primary_key]
    quote = connection.ops.quote_name
    columns = ", ".join(quote(str(f.column)) for f in fields)
    row = "(" + ", ".join(["%s"] * len(fields)) + ")"
    sql = (
        f"INSERT INTO {quote(meta.db_table)} ({columns}) VALUES {', '.join([row] * len(objs))} "  # noqa: S608 - names from metadata
        f"RETURNING {quote(str(meta.pk.column))}"
    )
    params: list[Any] = []
    for obj in objs:
        for f in fields:
            params.append(f.get_db_prep_save(f.pre_save(obj, True), connection))
    with connection.cursor() as c:
        c.execute(sql, params)
        ids = c.fetchall()
    for obj, (pk,) in zip(objs, ids, strict=True):
        obj.pk = pk
        obj._state.adding = False
        obj._state.db = connection.alias
    return objs


def decimal(value: Any, places: Decimal) -> Decimal | None:
    """A DECIMAL column read through a plain cursor: SQLite hands back a float (or int), PostgreSQL a Decimal.

    Converted as the ORM converts it (15 significant digits, then the field's places)."""
    if value is None:
        return None
    if isinstance(value, float):
        return _FLOAT_DECIMALS.create_decimal_from_float(value).quantize(places)
    return Decimal(value).quantize(places)


def loaded(model: type[M], values: dict[str, Any]) -> M:
    """An instance of ``model`` as the ORM loads it with ``only()``: the given fields (by attname, already
    converted to Python), every other one deferred, read from the database if it is ever asked for."""
    ordered = tuple(values[f.attname] for f in model._meta.concrete_fields if f.attname in values)
    return model.from_db(connection.alias, list(values), ordered)


def instant(value: Any) -> datetime | None:
    """A DATETIME column read through a plain cursor, aware as the ORM gives it: PostgreSQL's are aware
    already; SQLite's are naive UTC (or, outside declared columns, its stored ISO text)."""
    if isinstance(value, str):
        value = parse_datetime(value)
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


Convert = Callable[[Any], Any]


def _json(value: Any) -> Any:
    # psycopg hands jsonb to Django as text (JSONField decodes it); SQLite stores text.
    return json.loads(value) if isinstance(value, str | bytes) else value


def _bool(value: Any) -> Any:
    return value if value is None else bool(value)  # SQLite stores 0 and 1


@functools.cache
def _plan(
    model: type[Model], vendor: str, defer: frozenset[str]
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[tuple[int, Convert], ...]]:
    """Attribute names and columns of the loaded fields, and the converters of those that need one (by
    position): most columns come from the driver as they are."""
    names: list[str] = []
    columns: list[str] = []
    converters: list[tuple[int, Convert]] = []
    for field in model._meta.concrete_fields:
        if field.attname in defer:
            continue
        position = len(names)
        names.append(field.attname)
        columns.append(str(field.column))
        if isinstance(field, JSONField):
            converters.append((position, _json))
        elif isinstance(field, DateTimeField):
            converters.append((position, instant))
        elif isinstance(field, BooleanField) and vendor != "postgresql":
            converters.append((position, _bool))
    return tuple(names), tuple(columns), tuple(converters)


def select_list(model: type[Model], alias: str, prefix: str, defer: frozenset[str] = frozenset()) -> str:
    """``alias.col AS prefixcol, ...`` for the concrete fields of ``model`` but ``defer``, in the order ``build``
    reads them."""
    qn = connection.ops.quote_name
    _, columns, _ = _plan(model, connection.vendor, defer)
    return ", ".join(f"{alias}.{qn(c)} AS {qn(prefix + c)}" for c in columns)


def width(model: type[Model], defer: frozenset[str] = frozenset()) -> int:
    return len(_plan(model, connection.vendor, defer)[0])


def build(model: type[M], values: Sequence[Any], defer: frozenset[str] = frozenset()) -> M:
    """An instance of ``model`` from its columns as ``select_list`` listed them, as if loaded by a QuerySet with
    ``defer`` deferred (read from the database if ever used)."""
    names, _, converters = _plan(model, connection.vendor, defer)
    if len(values) != len(names):
        raise ValueError(f"{model.__name__}: {len(values)} values for {len(names)} columns")
    converted = list(values)
    for position, convert in converters:
        converted[position] = convert(converted[position])
    return model.from_db(connection.alias, names, converted)
