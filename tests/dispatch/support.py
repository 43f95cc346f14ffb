"""Builders for the dispatch tests: a booked reservation, and agent reports as the Docker runtime sends them."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

from django.utils import timezone

from controlplane.dispatch.models import Launch
from controlplane.reservations import services as reservations
from controlplane.reservations.models import Reservation
from controlplane.reservations.specs import ContainerSpec, Window
from nodeagent import schema
from tests.factories import UserFactory
from tests.reservations.fleet import spec

CONTAINER = ContainerSpec(image="gpucp-busybox:test", command=["sleep", "60"], env={"EPOCHS": "3"})


def book(
    proj: Any,
    model: Any,
    *,
    count: int = 1,
    start_in: float = 0.0,
    seconds: float = 60.0,
    now: datetime | None = None,
    user: Any = None,
) -> Reservation:
    now = now or timezone.now()
    start = now + timedelta(seconds=start_in)
    return reservations.reservation_create(
        project=proj,
        name="job",
        spec=spec(model, count=count),
        window=Window(start, start + timedelta(seconds=seconds)),
        container=CONTAINER,
        actor=user or UserFactory(),
        now=now,
    )


def report(launch: Launch, state: str, **fields: Any) -> schema.ContainerReport:
    return schema.ContainerReport(
        launch_id=launch.launch_id,
        reservation=str(launch.reservation.public_id),
        gpu_uuids=list(launch.gpu_uuids),
        state=state,
        **fields,
    )


# -- a private broker and real Celery workers, for the delivery tests --------------------------------------

REPO = Path(__file__).resolve().parents[2]
# The worker is `celery -A controlplane worker ...`, with the test's broker and transport options set on the
# app first: settings read the broker from REDIS_URL and keep a one-hour visibility timeout.
# Both names of each setting: Celery before 5.7 reads the Django settings' CELERY_ name before the plain one.
WORKER_MAIN = (
    "import json, sys; from controlplane.celery import app; "
    "url, options = sys.argv[1], json.loads(sys.argv[2]); "
    "app.conf.update(broker_url=url, CELERY_BROKER_URL=url, "
    "broker_transport_options=options, CELERY_BROKER_TRANSPORT_OPTIONS=options); "
    "app.worker_main(sys.argv[3:])"
)
REDIS_ARGS = ["redis-server", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "no"]
WORKER_ARGS = [
    "worker",
    "--pool",
    "solo",
    "-Q",
    "celery",
    "--without-heartbeat",
    "--without-gossip",
    "--without-mingle",
    "--loglevel",
    "INFO",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def database_url() -> str:
    """The URL of the database this test runs on (the live server's), for a worker in another process."""
    from django.db import connection

    db = connection.settings_dict
    auth = quote(db["USER"] or "", safe="")
    if db["PASSWORD"]:
        auth += ":" + quote(db["PASSWORD"], safe="")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


class PrivateRedis:
    """A redis-server of the test's own on a fixed port: stopping it is a broker outage, and starting it
    again on the same port is the broker coming back (empty, as after a restart without persistence)."""

    def __init__(self, *, log_path: Path, args: list[str] | None = None) -> None:
        self.port = free_port()
        self.log_path = log_path
        self.args = list(args or [])  # more redis-server options, e.g. persistence for tests/faults/
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=1)

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [*REDIS_ARGS, "--port", str(self.port), *self.args],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 10
        while True:
            try:
                self.client().ping()
                return
            except Exception:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise AssertionError(f"redis-server did not start: {self.log_path.read_text()[-2000:]}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)
        self.process = None


class CeleryWorker:
    """One real worker process on the private broker and the test's database."""

    def __init__(
        self,
        *,
        broker_url: str,
        transport_options: dict[str, Any],
        log_path: Path,
        worker_args: list[str] | None = None,
    ) -> None:
        env = dict(os.environ)
        env.update(
            DATABASE_URL=database_url(),
            CELERY_TASK_ALWAYS_EAGER="false",
            PYTHONPATH=str(REPO),
            DJANGO_SETTINGS_MODULE="controlplane.settings",
        )
        env.pop("REDIS_URL", None)
        self.log_path = log_path
        with log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    WORKER_MAIN,
                    broker_url,
                    json.dumps(transport_options),
                    *(WORKER_ARGS if worker_args is None else worker_args),
                ],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while "ready." not in self.log():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the Celery worker did not get ready:\n{self.log()[-3000:]}")
            time.sleep(0.1)

    def kill(self) -> None:
        """kill -9: no warm shutdown, no chance to ack or requeue anything."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()


@contextmanager
def celery_broker(url: str, transport_options: dict[str, Any]) -> Iterator[None]:
    """Point this process's Celery app (what ``transaction.on_commit`` publishes through) at ``url``, not
    eager, and put everything back afterwards."""
    from controlplane.celery import app

    conf = app.conf
    before = (conf.broker_url, conf.broker_transport_options, conf.task_always_eager)

    def fresh_pools() -> None:
        from kombu import pools

        if app._pool is not None:
            app._pool.force_close_all()
        app._pool = None
        app.amqp._producer_pool = None
        # kombu keeps producer pools in a process-wide registry keyed by connection: without a reset, the app
        # would get back the pool closed above ("Acquire on closed pool"), even in eager mode, which acquires a
        # producer too, and every later test in this process would lose its pushes.
        pools.reset()

    def configure(broker_url: Any, options: Any, eager: Any) -> None:
        # Both names of each setting: Celery before 5.7 reads the Django settings' CELERY_ name first.
        conf.update(
            broker_url=broker_url,
            CELERY_BROKER_URL=broker_url,
            broker_transport_options=options,
            CELERY_BROKER_TRANSPORT_OPTIONS=options,
            task_always_eager=eager,
            CELERY_TASK_ALWAYS_EAGER=eager,
        )

    fresh_pools()
    configure(url, transport_options, False)
    try:
        yield
    finally:
        fresh_pools()
        configure(*before)
