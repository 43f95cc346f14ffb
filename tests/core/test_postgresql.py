"""The PostgreSQL backend's connection check (controlplane/core/postgresql/base.py): a healthy idle connection
is used without a round trip; one the server has closed is found unusable, so Django reconnects."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection
from django.db.backends.postgresql import base as django_base

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def idle_connection() -> Iterator[Any]:
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's backend")
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    yield connection
    connection.close()  # a terminated one too: the test database's teardown then connects afresh


@pytest.fixture
def round_trips(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each time the check falls back to Django's SELECT 1."""
    calls: list[int] = []
    original = django_base.DatabaseWrapper.is_usable

    def counted(self: Any) -> bool:
        calls.append(1)
        return bool(original(self))

    monkeypatch.setattr(django_base.DatabaseWrapper, "is_usable", counted)
    return calls


def terminate(pid: int) -> None:
    db = settings.DATABASES["default"]
    with psycopg.connect(
        host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"], password=db["PASSWORD"] or None,
        dbname=connection.settings_dict["NAME"], autocommit=True,
    ) as admin:  # fmt: skip
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])
    time.sleep(0.2)  # the FATAL message and the close reach the socket


def test_the_settings_use_this_backend_with_health_checks(idle_connection: Any) -> None:
    assert settings.DATABASES["default"]["ENGINE"] == "controlplane.core.postgresql"
    assert connection.vendor == "postgresql" and connection.settings_dict["CONN_HEALTH_CHECKS"] is True


def test_a_healthy_idle_connection_is_usable_without_a_round_trip(idle_connection: Any, round_trips: list[int]) -> None:
    assert idle_connection.is_usable() is True
    assert round_trips == []


def test_a_connection_the_server_terminated_is_unusable(idle_connection: Any, round_trips: list[int]) -> None:
    terminate(idle_connection.connection.info.backend_pid)
    assert idle_connection.is_usable() is False
    assert round_trips == [1], "the socket had something to say, so the server was asked"


def test_after_a_termination_the_next_request_reconnects(idle_connection: Any) -> None:
    old = idle_connection.connection.info.backend_pid
    terminate(old)
    # What Django does at each request's first use of the connection.
    idle_connection.health_check_done = False
    idle_connection.close_if_health_check_failed()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        assert cursor.fetchone()[0] != old


def test_inside_a_transaction_the_check_asks_the_server(idle_connection: Any, round_trips: list[int]) -> None:
    idle_connection.set_autocommit(False)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        assert idle_connection.is_usable() is True
    finally:
        idle_connection.rollback()
        idle_connection.set_autocommit(True)
    assert round_trips == [1]
