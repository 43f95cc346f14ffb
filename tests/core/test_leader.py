"""The leader lease (controlplane/core/leader.py): one holder at a time across processes, never waited for,
freed with its holder's connection; and granted always on SQLite, one host's database."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from django.db import connection

from controlplane.core.leader import LOCK_CLASS, leader_lease, leader_only, lock_key
from tests.dispatch.support import database_url
from tests.runtime.support import wait_for


@contextmanager
def held_elsewhere(name: str) -> Iterator[psycopg.Connection[Any]]:
    """The lease ``name`` held by another session, as by a worker on the other host."""
    with psycopg.connect(database_url(), autocommit=True) as other:
        row = other.execute("SELECT pg_try_advisory_lock(%s, %s)", [LOCK_CLASS, lock_key(name)]).fetchone()
        assert row == (True,)
        yield other
        # Unlocked here, not left to the close: a closing session's locks go when its backend exits, a moment
        # after the client has moved on.
        with contextlib.suppress(psycopg.OperationalError):  # terminated by the test: nothing left to unlock
            other.execute("SELECT pg_advisory_unlock(%s, %s)", [LOCK_CLASS, lock_key(name)])


def holders(name: str) -> int:
    with psycopg.connect(database_url(), autocommit=True) as probe:
        row = probe.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s::oid "
            "AND objid = (%s::bigint & 4294967295)::oid AND objsubid = 2 AND granted",
            [LOCK_CLASS, lock_key(name)],
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_run_finding_the_lease_held_elsewhere_skips_at_once_and_runs_once_it_is_free():
    ran: list[int] = []

    @leader_only(skipped=-1, name="test.leader.skip")
    def task() -> int:
        ran.append(1)
        return len(ran)

    with held_elsewhere("test.leader.skip"):
        assert task() == -1
        assert ran == []
    assert task() == 1
    assert holders("test.leader.skip") == 0, "released when the run ended"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_holder_that_dies_frees_the_lease_with_its_connection():
    """A worker SIGKILLed mid-task: PostgreSQL ends its session, and with it the lease, with no expiry to wait."""
    with psycopg.connect(database_url(), autocommit=True) as admin, held_elsewhere("test.leader.dies") as other:
        with leader_lease("test.leader.dies") as held:
            assert held is False
        admin.execute("SELECT pg_terminate_backend(%s, 5000)", [other.info.backend_pid])
        with leader_lease("test.leader.dies") as held:
            assert held is True


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_copies_at_the_same_instant_run_the_body_once():
    """Two beats sent the task, two workers run it at once: one runs, the other returns at once, not after."""
    inside, release = threading.Event(), threading.Event()
    ran: list[str] = []
    results: dict[str, int] = {}

    @leader_only(skipped=0, name="test.leader.race")
    def task(who: str) -> int:
        ran.append(who)
        inside.set()
        assert release.wait(10)
        return 1

    def worker(who: str) -> None:
        try:
            results[who] = task(who)
        finally:
            connection.close()

    first = threading.Thread(target=worker, args=("a",))
    first.start()
    assert inside.wait(10)
    second = threading.Thread(target=worker, args=("b",))
    second.start()
    second.join(10)
    assert not second.is_alive() and results == {"b": 0}, "the second copy returned without waiting"
    release.set()
    first.join(10)
    assert ran == ["a"] and results == {"a": 1, "b": 0}
    assert holders("test.leader.race") == 0


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_run_that_raises_releases_the_lease():
    @leader_only(skipped=None, name="test.leader.raises")
    def task() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        task()
    assert holders("test.leader.raises") == 0


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_node_loss_detector_and_the_scheduler_pass_are_behind_their_leases(monkeypatch):
    from controlplane.fleet import services as fleet_services
    from controlplane.fleet import tasks as fleet_tasks
    from controlplane.scheduling import services as scheduling_services
    from controlplane.scheduling import tasks as scheduling_tasks

    calls: list[str] = []

    def recorder(what: str) -> Callable[[], int]:
        def service() -> int:
            calls.append(what)
            return 1

        return service

    monkeypatch.setattr(fleet_services, "detect_lost_servers", recorder("detect"))
    monkeypatch.setattr(scheduling_services, "schedule_pass", recorder("schedule"))
    for task, name, what in (
        (fleet_tasks.detect_lost_servers, "controlplane.fleet.tasks.detect_lost_servers", "detect"),
        (scheduling_tasks.schedule_pass, "controlplane.scheduling.tasks.schedule_pass", "schedule"),
    ):
        with held_elsewhere(name):
            assert task() == 0
            assert what not in calls
        # Another test's server thread may still be finishing a pass of its own (the scheduler's is queued
        # whenever GPUs free up): the lease is then rightly taken, so wait for it to be free.
        wait_for(lambda name=name: holders(name) == 0, timeout=10, what=f"{name}'s lease free")  # type: ignore[misc]
        assert task() == 1
        assert what in calls


@pytest.mark.django_db
def test_on_sqlite_the_lease_is_always_granted():
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's behaviour")
    with leader_lease("test.leader.sqlite") as a, leader_lease("test.leader.sqlite") as b:
        assert a is True and b is True


def test_lease_keys_are_postgresql_int4s_and_distinct_per_name():
    keys = {lock_key(f"controlplane.app{n}.tasks.task") for n in range(200)}
    assert len(keys) == 200
    assert all(-(2**31) <= key < 2**31 for key in keys)
