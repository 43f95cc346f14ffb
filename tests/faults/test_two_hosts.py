"""Two control-plane hosts, one of them lost under load: nothing lost, nothing twice (issue 22, proof (e)).

Two hosts each run the web server, a Celery worker and a Celery beat, as ``runsystem`` starts them, on one
PostgreSQL (the test database) and one Redis (a private redis-server); a TCP balancer spreads new connections
over both webs. Two real agents (simulated GPUs, real Docker) heartbeat through the balancer. Eight booking
clients, each a project with a webhook endpoint on a real HTTP receiver, book one-GPU reservations through the
balancer whose windows open a few seconds later, with an Idempotency-Key and retries, as automation should.
Under that load every process of host A is SIGKILLed at once (a lost machine); the clients go on against host B
alone for a while, then the test waits for everything booked to run and end, and counts:

- launches: container starts per reservation, from Docker's own events: exactly one each;
- charges: ledger entries per reservation: one hold, one charge, one release;
- notifications: one event of each kind per reservation, each in its owner's list once;
- webhook deliveries: each event's webhook-id received exactly once by the receiver, none missing.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import requests
from django.db.models import F
from django.test import override_settings
from django.utils import timezone

from controlplane.dispatch.models import Launch
from controlplane.fleet import services as fleet
from controlplane.inventory.choices import ServerState
from controlplane.inventory.models import Gpu, GpuModel, Server
from controlplane.ledger.choices import EntryKind
from controlplane.ledger.models import LedgerEntry
from controlplane.notifications import services as notifications
from controlplane.notifications.choices import DeliveryState, EventType
from controlplane.notifications.models import Event, Notification, WebhookDelivery
from controlplane.reservations.choices import ReservationState
from controlplane.reservations.models import Reservation, ReservationEvent
from nodeagent.runtime.containers import LABEL_NODE
from nodeagent.runtime.localimage import DEFAULT_TAG, ensure_busybox_image
from tests.dispatch.support import database_url
from tests.factories import ApiTokenFactory, UserFactory
from tests.faults.redis_support import FaultRedis
from tests.faults.two_hosts_support import BalancerProcess, ContainerStarts, FleetAgent, Host, host_env
from tests.notifications.support import Receiver
from tests.reservations.fleet import project
from tests.runtime.support import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]

CLIENTS = 8
BEFORE_KILL_S = 25.0  # load on both hosts
AFTER_KILL_S = 25.0  # load on the survivor alone
BOOK_EVERY_S = 8.0
OPENS_IN_S = 4.0  # each window opens this long after its booking: the openings run under the load and the kill
# Long enough for an agent to start every container of a burst (all 8 clients book at the kill): it starts them
# one after the other, and on a loaded 2-core machine with the vfs storage driver each start has taken 1-2 s.
WINDOW_S = 15.0
EVENTS = [EventType.BOOKED, EventType.STARTING, EventType.RUNNING]
# The settings of both hosts, as environment variables (and of this process, which reads the same database).
SETTINGS: dict[str, Any] = {
    "FLEET_HEARTBEAT_INTERVAL_S": 5.0,
    # A fencing lease of 30 s, not the default 10 s: on a loaded 2-core machine a heartbeat under this load has
    # taken over 10 s to be answered, and a fenced node's interrupted reservations would hide what this test is
    # about (what losing a control-plane host costs), which holds at any lease.
    "FLEET_FENCE_AFTER_INTERVALS": 6,
    "FLEET_OFFLINE_AFTER_INTERVALS": 8,
    "DISPATCH_STOP_GRACE_S": 2,
    "DISPATCH_WARN_BEFORE_S": 0,
    "NOTIFICATIONS_WEBHOOK_ALLOW_PRIVATE": True,
    "NOTIFICATIONS_WEBHOOK_RETRY_S": [1, 2, 5, 10, 30],
}
# Each container exits at its SIGTERM (the window's end), so a reservation ends within a heartbeat of it.
JOB = ["sh", "-c", "trap 'exit 0' TERM; echo started; while true; do sleep 0.2; done"]


def as_env(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


class Client:
    """A tenant's automation: books through the balancer, each booking with its own Idempotency-Key, retried
    with the same key after a reset or a 5xx until it gets an answer that says what happened."""

    def __init__(self, base_url: str, receiver: Receiver, model: str) -> None:
        self.owner = UserFactory()
        self.project = project(owner=self.owner, grant="1000000")
        token = ApiTokenFactory(user=self.owner)
        self.endpoint = notifications.endpoint_create(
            project=self.project, url=receiver.url, events=list(EVENTS), description="two hosts", actor=None
        )
        receiver.secrets.append(self.endpoint.secret)
        self.url = f"{base_url}/api/v1/reservations/"
        self.headers = {"Authorization": f"Bearer {token.plaintext}"}  # type: ignore[attr-defined]
        self.model = model
        self.booked: dict[str, str] = {}  # Idempotency-Key -> the reservation's public id (201)
        self.refused: list[tuple[int, str]] = []  # a 4xx: nothing booked (no GPU free in the window)
        self.unanswered: list[str] = []  # keys that never got an answer: would be "lost" bookings
        self.retries = 0
        self.errors: list[str] = []

    def run(self, stop: threading.Event) -> None:
        """Book every BOOK_EVERY_S until ``stop``."""
        session = self.session()
        while not stop.is_set():
            self.book(session)
            stop.wait(BOOK_EVERY_S)
        session.close()

    def session(self) -> requests.Session:
        session = requests.Session()
        session.headers.update(self.headers)
        return session

    def book(self, session: requests.Session) -> None:
        try:
            self._book(session)
        except Exception as exc:  # kept for the test to fail on, with what happened
            self.errors.append(f"crashed: {exc!r}")
            self.unanswered.append("(the client crashed)")

    def _book(self, session: requests.Session) -> None:
        start = timezone.now() + timedelta(seconds=OPENS_IN_S)
        body: dict[str, Any] = {
            "project": self.project.slug,
            "name": "two-hosts",
            "spec": {"gpu_model": self.model, "gpu_count": 1},
            "window": {"start": start.isoformat(), "end": (start + timedelta(seconds=WINDOW_S)).isoformat()},
            "container": {"image": DEFAULT_TAG, "command": JOB},
        }
        key = uuid.uuid4().hex
        deadline = time.monotonic() + 30
        while True:
            response: requests.Response | None
            try:
                response = session.post(self.url, json=body, headers={"Idempotency-Key": key}, timeout=15)
                error = f"HTTP {response.status_code}"
            except requests.RequestException as exc:
                response, error = None, f"{type(exc).__name__}"
            if response is not None and response.status_code == 201:
                self.booked[key] = response.json()["id"]
                return
            if response is not None and 400 <= response.status_code < 500 and response.status_code != 409:
                self.refused.append((response.status_code, response.text[:300]))
                return
            if response is not None and response.status_code == 409:
                code = response.json().get("error", {}).get("code", "")
                if code != "idempotency_request_in_progress":
                    self.refused.append((409, code))
                    return
            if time.monotonic() > deadline:
                self.unanswered.append(key)
                self.errors.append(error)
                return
            self.retries += 1
            time.sleep(0.3)


@pytest.fixture
def two_hosts(transactional_db, docker_client, tmp_path: Path) -> Iterator[dict[str, Any]]:  # type: ignore[no-untyped-def]
    ensure_busybox_image(docker_client, DEFAULT_TAG)
    redis = FaultRedis(tmp_path, persist=False)
    redis.start()
    receiver = Receiver().start()
    env = host_env(
        database_url=database_url(),
        redis_url=redis.url,
        extra={name: as_env(value) for name, value in SETTINGS.items()},
    )
    hosts = [Host(name, var_dir=tmp_path / name, env=env) for name in ("host-a", "host-b")]
    balancer: BalancerProcess | None = None
    agents: list[FleetAgent] = []
    settings = override_settings(**SETTINGS)
    settings.enable()
    try:
        for host in hosts:
            host.start()
        for host in hosts:
            host.wait_ready()
        balancer = BalancerProcess([("127.0.0.1", host.port) for host in hosts], log_path=tmp_path / "lb.log")
        for _ in range(2):
            hostname = f"two-{uuid.uuid4().hex[:8]}"
            _, token = fleet.join_token_create(actor=None, note="two hosts")
            agents.append(
                FleetAgent(
                    url=balancer.url,
                    state=tmp_path / hostname,
                    hostname=hostname,
                    join_token=token,
                    spec="8xH100-80GB",
                )
            )
        names = [a.hostname for a in agents]
        wait_for(
            lambda: Gpu.objects.filter(server__hostname__in=names).count() == 16,
            timeout=60,
            what="both agents enrolled with their GPUs",
        )
        Server.objects.filter(hostname__in=names).update(state=ServerState.READY)
        # A price, so that every reservation's charge is an amount to count.
        GpuModel.objects.filter(gpus__server__hostname__in=names).update(price_per_gpu_hour=Decimal("3.6"))
        yield {"hosts": hosts, "balancer": balancer, "agents": agents, "receiver": receiver}
    finally:
        for agent in agents:
            agent.stop()
            for container in docker_client.containers.list(
                all=True, filters={"label": f"{LABEL_NODE}={agent.hostname}"}
            ):
                container.remove(force=True)
        for host in hosts:
            host.stop()
        if balancer is not None:
            balancer.stop()
        receiver.stop()
        redis.stop()
        settings.disable()


def test_one_host_lost_under_load_loses_and_duplicates_nothing(two_hosts, docker_client):
    hosts, receiver, agents = two_hosts["hosts"], two_hosts["receiver"], two_hosts["agents"]
    model = Gpu.objects.filter(server__hostname=agents[0].hostname).values_list("model__name", flat=True).first()
    assert model is not None
    docker_starts = ContainerStarts(docker_client, [a.hostname for a in agents])
    clients = [Client(two_hosts["balancer"].url, receiver, model) for _ in range(CLIENTS)]
    stop = threading.Event()
    threads = [threading.Thread(target=c.run, args=(stop,), daemon=True) for c in clients]
    for thread in threads:
        thread.start()
        time.sleep(BOOK_EVERY_S / CLIENTS)  # spread over the period, not in step
    time.sleep(max(0.0, BEFORE_KILL_S - BOOK_EVERY_S))
    # The kill lands on requests in flight: every client books at once (half of them reach host A through the
    # balancer), and host A dies while they are being served.
    burst = [threading.Thread(target=c.book, args=(c.session(),), daemon=True) for c in clients]
    for thread in burst:
        thread.start()
    time.sleep(0.15)
    hosts[0].kill()
    killed_at = timezone.now()
    for thread in burst:
        thread.join(timeout=60)
    time.sleep(AFTER_KILL_S)
    stop.set()
    for thread in threads:
        thread.join(timeout=60)

    public_ids = [public_id for c in clients for public_id in c.booked.values()]
    booked = set(Reservation.objects.filter(public_id__in=public_ids).values_list("pk", flat=True))
    assert len(booked) == len(public_ids)
    summary = (
        f"{len(booked)} booked, refused: {Counter(code for c in clients for _, code in c.refused)}, "
        f"{sum(c.retries for c in clients)} retries, "
        f"agents fenced {sum(a.log().count('; stopping this node') for a in agents)} times"
    )
    assert [c.unanswered for c in clients if c.unanswered] == [], summary
    assert len(booked) >= CLIENTS * 3, summary
    # Each key booked once: a retry after the kill replayed its booking, or ran it for the first time.
    for c in clients:
        assert Reservation.objects.filter(project=c.project).count() == len(c.booked), summary

    wait_for(
        lambda: (
            not Reservation.objects.filter(pk__in=booked)
            .exclude(state__in=[ReservationState.COMPLETED, ReservationState.FAILED, ReservationState.CANCELLED])
            .exists()
        ),
        timeout=90,
        what="every booked reservation to run and end",
    )
    states = Counter(Reservation.objects.filter(pk__in=booked).values_list("state", flat=True))
    why = list(
        ReservationEvent.objects.filter(reservation_id__in=booked, to_state=ReservationState.FAILED).values_list(
            "reason", flat=True
        )
    )
    assert states == {ReservationState.COMPLETED: len(booked)}, (states, why)  # none lost (failed: never started)
    opened_after_kill = Reservation.objects.filter(pk__in=booked, starts_at__gt=killed_at).count()
    assert opened_after_kill >= CLIENTS, "windows must open after the kill too"

    # Launches: one per reservation, and one container start each, as Docker saw it.
    launches = dict(Launch.objects.filter(reservation_id__in=booked).values_list("launch_id", "reservation_id"))
    per_reservation = Counter(launches.values())
    assert set(per_reservation) == booked and set(per_reservation.values()) == {1}, per_reservation
    starts = docker_starts.stop()
    assert {launch: starts.get(launch, 0) for launch in launches} == {launch: 1 for launch in launches}
    assert set(starts) <= set(launches)

    # Charges: each reservation held once, charged once, released once.
    def entries() -> dict[int, Counter[str]]:
        found: dict[int, Counter[str]] = defaultdict(Counter)
        for reservation_id, kind in LedgerEntry.objects.filter(reservation_id__in=booked).values_list(
            "reservation_id", "kind"
        ):
            found[reservation_id][kind] += 1
        return found

    want = Counter({EntryKind.HOLD: 1, EntryKind.CHARGE: 1, EntryKind.RELEASE: 1})
    wait_for(lambda: all(entries()[pk] == want for pk in booked), timeout=30, what="one hold, charge, release each")

    # Notifications: one event per state change in each reservation's audit trail (booked, starting, and running
    # unless the container's start and exit came in one report), each in the owner's list once.
    changes = Counter(
        ReservationEvent.objects.filter(
            reservation_id__in=booked,
            to_state__in=[ReservationState.SCHEDULED, ReservationState.STARTING, ReservationState.RUNNING],
        )
        # Notes in the trail (an image pulled ahead, docs/images.md) change no state.
        .exclude(from_state=F("to_state"))
        .values_list("reservation_id", "to_state")
    )
    assert set(changes.values()) == {1}, "each state entered once"
    to_type: dict[str, str] = {
        ReservationState.SCHEDULED: EventType.BOOKED.value,
        ReservationState.STARTING: EventType.STARTING.value,
        ReservationState.RUNNING: EventType.RUNNING.value,
    }
    wanted = Counter({(pk, to_type[state]): 1 for pk, state in changes})
    assert {pk for pk, kind in wanted if kind == EventType.STARTING.value} == booked
    kinds = Counter(
        Event.objects.filter(reservation_id__in=booked, type__in=EVENTS).values_list("reservation_id", "type")
    )
    assert kinds == wanted, (kinds - wanted, wanted - kinds)
    events = Event.objects.filter(reservation_id__in=booked, type__in=EVENTS)
    wait_for(
        lambda: Notification.objects.filter(event__in=events).count() == events.count(),
        timeout=30,
        what="every event in its owner's list",
    )
    assert Notification.objects.filter(event__in=events).values("event", "user").distinct().count() == events.count()

    # Webhooks: every event delivered, each webhook-id received once.
    wait_for(
        lambda: not WebhookDelivery.objects.filter(event__in=events).exclude(state=DeliveryState.DELIVERED).exists(),
        timeout=150,
        what="every webhook delivered",
    )
    expected = {f"msg_{public_id.hex}" for public_id in events.values_list("public_id", flat=True)}
    with receiver.lock:
        received = Counter(r.msg_id for r in receiver.received if r.verified_with)
    assert set(received) >= expected
    duplicates = {msg_id: n for msg_id, n in received.items() if n > 1}
    assert duplicates == {}, f"webhook-ids received more than once: {duplicates}"
    print(
        f"\ntwo hosts: {summary}; {len(launches)} launches, {sum(starts.values())} container starts, "
        f"{opened_after_kill} windows opened after the kill, {len(expected)} webhooks, each received once"
    )


# A host's process that holds locks in a transaction and waits on another lock when it is SIGKILLed.
_HOLD_AND_WAIT = """
import sys, psycopg
conn = psycopg.connect(sys.argv[1], options=sys.argv[2])
conn.execute("BEGIN")
conn.execute("SELECT pg_advisory_xact_lock(424242, 1)")
print("holding", flush=True)
conn.execute("SELECT pg_advisory_xact_lock(424242, 2)")  # waits: the test holds it
"""


@pytest.mark.django_db(transaction=True)
def test_a_lost_hosts_backend_waiting_on_a_lock_releases_what_it_held():
    """The control plane's connections ask PostgreSQL to check a running query's client (settings.py):
    without it, the backend of a SIGKILLed host's request that waits on a lock keeps every lock it took for as
    long as that wait lasts, and the other host queues behind them (one run of the test above, before the
    setting, saw the surviving host's bookings and heartbeats stall for about 35 s after the kill)."""
    import subprocess
    import sys

    import psycopg
    from django.conf import settings

    options = settings.DATABASES["default"]["OPTIONS"]["options"]
    assert "client_connection_check_interval" in options
    with (
        psycopg.connect(database_url(), autocommit=True) as blocker,
        psycopg.connect(database_url(), autocommit=True) as other,
    ):
        blocker.execute("SELECT pg_advisory_lock(424242, 2)")
        holder = subprocess.Popen(
            [sys.executable, "-c", _HOLD_AND_WAIT, database_url(), options], stdout=subprocess.PIPE, text=True
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
            wait_for(
                lambda: (
                    blocker.execute(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 424242 AND NOT granted"
                    ).fetchone()
                    == (1,)
                ),
                timeout=10,
                what="the holder waiting on the second lock",
            )
            holder.kill()
            holder.wait(timeout=10)
            started = time.monotonic()
            wait_for(
                lambda: other.execute("SELECT pg_try_advisory_lock(424242, 1)").fetchone() == (True,),
                timeout=10,
                what="the dead client's lock released while the second lock is still held",
            )
            assert time.monotonic() - started < 5
        finally:
            if holder.poll() is None:
                holder.kill()
