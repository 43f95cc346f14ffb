"""PostgreSQL drops connections: keyed bookings broken at each step, idle web and worker connections after a
restart, the agent's heartbeat while the database is away.

The web is the live server (real HTTP, keep-alive, one persistent database connection per handler thread, as
under gunicorn's threads); the fault is the real one, ``pg_terminate_backend`` of the connection serving the
request (tests/faults/pg_support.py), as a PostgreSQL restart or failover drops it: the next statement on it
fails with AdminShutdown or "the connection is lost". The worker is a real ``celery worker`` process.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests
from django.utils import timezone

from controlplane.core import idempotency
from controlplane.core.models import IdempotencyRecord
from controlplane.reservations import services
from controlplane.reservations.models import Reservation
from tests.conftest import service_missing
from tests.dispatch.support import CeleryWorker, PrivateRedis, celery_broker, database_url
from tests.factories import ApiTokenFactory, UserFactory
from tests.faults.pg_support import Gate, backend_pid, fault_at, terminate, terminate_all, wait_until, waits_on_lock
from tests.reservations.fleet import gpu_model, project, server

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

# "Promptly": a retry must not sit out IDEMPOTENCY_WAIT_S (10 s), let alone the old 600 s stale timeout.
PROMPT_S = 3.0


class Booker:
    """A tenant's automation: a keep-alive session with a bearer token, booking with an Idempotency-Key."""

    def __init__(self, base_url: str) -> None:
        owner = UserFactory()
        self.project = project(owner=owner)
        self.model = gpu_model()
        server(self.model, gpus=4)
        token = ApiTokenFactory(user=owner)
        self.url = f"{base_url}/api/v1/reservations/"
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token.plaintext}"  # type: ignore[attr-defined]
        start = timezone.now() + timedelta(hours=1)
        self.body = {
            "project": self.project.slug,
            "name": "fault",
            "spec": {"gpu_model": self.model.name, "gpu_count": 2},
            "window": {"start": start.isoformat(), "end": (start + timedelta(hours=2)).isoformat()},
            "container": {"image": "img"},
        }

    def book(self, key: str, session: requests.Session | None = None) -> tuple[requests.Response, float]:
        t0 = time.monotonic()
        response = (session or self.session).post(
            self.url, json=self.body, headers={"Idempotency-Key": key}, timeout=30
        )
        return response, time.monotonic() - t0

    def fresh_session(self) -> requests.Session:
        session = requests.Session()
        session.headers.update(self.session.headers)
        return session

    def close(self) -> None:
        self.session.close()


@pytest.fixture
def booker(live_server) -> Iterator[Booker]:  # type: ignore[no-untyped-def]
    b = Booker(live_server.url)
    yield b
    b.close()


def assert_booked_once(response: requests.Response) -> None:
    assert response.status_code == 201, response.text[:500]
    assert Reservation.objects.filter(name="fault").count() == 1
    assert response.json()["id"] == str(Reservation.objects.get(name="fault").public_id)
    assert not IdempotencyRecord.objects.filter(state="in_progress").exists()


# Each step of a keyed booking, and where its connection is cut: (what is patched, before or after it runs).
STEPS = {
    # The claim's INSERT meets the dead connection: nothing was written.
    "at the claim": (idempotency, "_insert", True),
    # Inside the booking's transaction, its allocations in, its ledger hold not yet.
    "in the booking's transaction": (services, "ledger_hold", True),
    # The booking done (a savepoint of the request's transaction), its response about to be stored.
    "before the response is stored": (idempotency, "_store", True),
    # The response stored, the COMMIT about to go.
    "after the response is stored": (idempotency, "_store", False),
}


@pytest.mark.parametrize("step", list(STEPS))
def test_a_keyed_booking_cut_off_from_the_database_runs_once_on_its_retry(booker, monkeypatch, step):
    target, name, before = STEPS[step]
    key = f"cut-{uuid.uuid4()}"
    with fault_at(monkeypatch, target, name, before=before) as fault:
        first, _ = booker.book(key)
    assert fault.fired == [name]
    assert first.status_code >= 500, first.text[:500]
    assert Reservation.objects.filter(name="fault").count() == 0  # everything went with the connection
    retry, took = booker.book(key)
    assert_booked_once(retry)
    assert "Idempotent-Replayed" not in retry.headers  # it ran, at once
    assert took < PROMPT_S
    print(f"cut {step}: first {first.status_code}, retry 201 in {took:.2f}s")


def test_a_keyed_booking_whose_answer_was_lost_after_its_commit_is_replayed_not_booked_again(booker, monkeypatch):
    """The COMMIT went through and then the connection died, so the web could not tell: the client got a 503.
    The retry finds the booking's stored response and returns that booking."""
    from django.db.backends.postgresql.base import DatabaseWrapper

    key = f"lost-{uuid.uuid4()}"
    committed: list[int] = []
    real_commit = DatabaseWrapper._commit
    test_thread = threading.get_ident()

    def commit_then_die(self: Any) -> None:
        real_commit(self)
        if threading.get_ident() != test_thread and not committed:
            committed.append(backend_pid())
            terminate(committed[0])
            with self.wrap_database_errors:
                self.connection.execute("SELECT 1")  # what the lost reply looks like: the connection is gone

    monkeypatch.setattr(DatabaseWrapper, "_commit", commit_then_die)
    first, _ = booker.book(key)
    monkeypatch.undo()
    assert committed
    assert first.status_code == 503, first.text[:500]
    assert first.json()["error"]["code"] == "database_unavailable"
    retry, took = booker.book(key)
    assert_booked_once(retry)
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert took < PROMPT_S
    print(f"answer lost after COMMIT: first 503, retry replayed 201 in {took:.2f}s")


def test_a_retry_waiting_on_a_request_whose_connection_died_runs_at_once(booker, monkeypatch):
    """The first request holds the key (its transaction open, mid-booking) and a retry waits on it; then the
    first one's connection is terminated. The database ends its transaction and frees the key, and the
    waiting retry books at once, once."""
    key = f"held-{uuid.uuid4()}"
    gate = Gate()
    monkeypatch.setattr(services, "ledger_hold", gate.wrap(services.ledger_hold))
    results: dict[str, Any] = {}

    def send(name: str, session: requests.Session) -> None:
        try:
            results[name] = booker.book(key, session)
        except Exception as exc:
            results[name] = exc

    first_session, retry_session = booker.fresh_session(), booker.fresh_session()
    first = threading.Thread(target=send, args=("first", first_session))
    retry = threading.Thread(target=send, args=("retry", retry_session))
    try:
        first.start()
        assert gate.reached.wait(timeout=15)
        retry.start()
        # The retry blocks on the key's lock (not polling): its backend waits in PostgreSQL.
        wait_until(lambda: any(waits_on_lock(pid) for pid in _other_backends(spare=gate.pid)), what="the retry to wait")
        assert gate.pid is not None
        killed_at = time.monotonic()
        terminate(gate.pid)
        retry.join(timeout=30)
        freed_after = time.monotonic() - killed_at
    finally:
        gate.open()
        first.join(timeout=30)
        retry.join(timeout=30)
        first_session.close()
        retry_session.close()
    response, _ = results["retry"]
    assert_booked_once(response)
    assert "Idempotent-Replayed" not in response.headers
    assert freed_after < PROMPT_S
    print(f"waiting retry booked {freed_after:.2f}s after the holder's connection was terminated")
    first_response, _ = results["first"]
    assert first_response.status_code >= 500


def _other_backends(*, spare: int | None) -> list[int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND pid <> %s",
            [spare or 0],
        )
        return [row[0] for row in cursor.fetchall()]


def test_the_first_request_after_a_restart_on_a_kept_alive_connection_is_served(live_server):
    """Every backend of the app terminated while the web's connections sit idle: the next request on the same
    keep-alive HTTP connection (the same handler thread, the same persistent database connection) is served,
    because the connection is tested before use (CONN_HEALTH_CHECKS), not failed with AdminShutdown."""
    token = ApiTokenFactory()
    with requests.Session() as session:
        session.headers["Authorization"] = f"Bearer {token.plaintext}"  # type: ignore[attr-defined]
        assert session.get(f"{live_server.url}/api/v1/me/", timeout=10).status_code == 200
        assert terminate_all(spare=backend_pid()) >= 1
        after = [session.get(f"{live_server.url}/api/v1/me/", timeout=10).status_code for _ in range(3)]
    assert after == [200, 200, 200]


# The worker as runsystem starts it with Redis: the thread pool, four threads.
WORKER_ARGS = ["worker", "--pool", "threads", "--concurrency", "4", "--loglevel", "INFO", "-Q", "celery"]
WORKER_ARGS += ["--without-heartbeat", "--without-gossip", "--without-mingle"]


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[CeleryWorker]:
    import shutil

    if shutil.which("redis-server") is None:
        service_missing("redis-server (for a private Celery broker)")
    broker = PrivateRedis(log_path=tmp_path / "redis.log")
    broker.start()
    w: CeleryWorker | None = None
    try:
        with celery_broker(broker.url, {}):
            w = CeleryWorker(
                broker_url=broker.url, transport_options={}, log_path=tmp_path / "worker.log", worker_args=WORKER_ARGS
            )
            w.wait_ready()
            yield w
    finally:
        if w is not None:
            w.stop()
        broker.stop()


def _expired_record(key: str) -> IdempotencyRecord:
    return IdempotencyRecord.objects.create(
        scope="s" * 64,
        key=key,
        request_fingerprint="f",
        state="completed",
        created_at=timezone.now() - timedelta(days=2),
    )


def test_a_periodic_task_after_a_restart_succeeds_on_its_first_run(worker):
    """Every backend of the app is terminated between two runs of a periodic task; the second run succeeds
    at once. (Celery's Django fixup closes a task's connections before and after it, so an idle worker holds
    none for a restart to break; the health check covers a connection that is reused.)"""
    from controlplane.core.tasks import prune_idempotency_records

    _expired_record("before")
    prune_idempotency_records.delay()
    wait_until(lambda: not IdempotencyRecord.objects.filter(key="before").exists(), what="the first run")
    terminate_all(spare=backend_pid())
    _expired_record("after")
    t0 = time.monotonic()
    prune_idempotency_records.delay()
    wait_until(lambda: not IdempotencyRecord.objects.filter(key="after").exists(), what="the run after the restart")
    assert time.monotonic() - t0 < 10
    log = worker.log()
    assert "AdminShutdown" not in log and "raised unexpected" not in log, log[-3000:]


# -- the agent's heartbeat while the database is away (issue 22) ------------------------------------------


class Agent:
    """An enrolled node's agent: a keep-alive session posting heartbeats with its node credential."""

    def __init__(self, base_url: str) -> None:
        from tests.fleet.helpers import enroll, h100_model

        h100_model()
        self.server, credential = enroll("node-pg")
        self.url = f"{base_url}/api/v1/agent/heartbeat"
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {credential}"
        self.seq = 0

    def beat(self) -> requests.Response:
        from tests.fleet.helpers import heartbeat

        self.seq += 1
        body = heartbeat("node-pg", seq=self.seq, start=timezone.now())
        return self.session.post(self.url, json=body, timeout=30)


@pytest.fixture
def pg_agent(live_server) -> Iterator[Agent]:  # type: ignore[no-untyped-def]
    a = Agent(live_server.url)
    yield a
    a.session.close()


def assert_unavailable(response: requests.Response) -> None:
    assert response.status_code == 503, response.text[:500]
    error = response.json()["error"]
    assert error["code"] == "database_unavailable" and error["message"], error
    assert response.headers["Retry-After"] == "1"


@contextmanager
def database_away() -> Iterator[None]:
    """The test database refuses every new connection and loses the ones it had (but this test's own): to the
    web, PostgreSQL is down. ``ALLOW_CONNECTIONS false`` holds superusers out too."""
    from django.db import connection

    name, spare = connection.settings_dict["NAME"], backend_pid()
    with psycopg.connect(database_url().rsplit("/", 1)[0] + "/postgres", autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        try:
            admin.execute(
                "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE datname = %s AND pid <> %s",
                [name, spare],
            )
            yield
        finally:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')


def test_the_heartbeat_answers_503_database_unavailable_while_the_database_is_away(pg_agent):
    """Not a 500: the agent is told to send it again, in the API's one error shape, as the booking API tells a
    keyed booking (core.api.errors.database_unavailable). Nothing of it is kept; once the database is back
    the next heartbeat is taken."""
    assert pg_agent.beat().status_code == 200
    with database_away():
        down = [pg_agent.beat() for _ in range(3)]
    for response in down:
        assert_unavailable(response)
    back = pg_agent.beat()
    assert back.status_code == 200, back.text[:500]
    pg_agent.server.refresh_from_db()
    assert pg_agent.server.last_heartbeat_seq == pg_agent.seq


def test_a_heartbeat_whose_connection_dies_mid_ingest_answers_503_and_the_next_is_taken(pg_agent, monkeypatch):
    """A restart or failover drops the connection between the heartbeat's statements."""
    from controlplane.fleet import ingest

    assert pg_agent.beat().status_code == 200
    with fault_at(monkeypatch, ingest, "_ingest", before=True) as fault:
        cut = pg_agent.beat()
    assert fault.fired == ["_ingest"]
    assert_unavailable(cut)
    pg_agent.server.refresh_from_db()
    assert pg_agent.server.last_heartbeat_seq == pg_agent.seq - 1  # nothing of the cut one was kept
    again = pg_agent.beat()
    assert again.status_code == 200, again.text[:500]
