"""A Redis outage: the API keeps serving and a Celery worker holding ETA tasks rides it out.

The cache and the broker of this process are a private redis-server (tests/faults/redis_support.py), which each
test stops and starts again on the same port, or freezes with SIGSTOP. Requests go through the Django test
client with a real bearer token, so authentication and DRF's user throttle (the cache) run as in production,
and with ``transaction=True`` so that the booking's ``on_commit`` publish to the broker runs too.

The outages here last 10-15 s; bench/faults.py measures 60 s ones.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.core import cache as failopen
from controlplane.dispatch.models import Launch
from controlplane.inventory.choices import ServerState
from controlplane.inventory.models import Server
from controlplane.reservations.choices import ReservationState
from controlplane.reservations.models import Reservation
from tests.dispatch.support import CeleryWorker, book
from tests.factories import ApiTokenFactory
from tests.faults.redis_support import FaultRedis, redis_backed, thread_worker, timed, transport_options
from tests.fleet.helpers import enroll, gpu_facts, h100_model, heartbeat
from tests.reservations.fleet import project, server
from tests.runtime.support import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

OUTAGE_LOG = "controlplane.core.outage"
HEARTBEAT = "/api/v1/agent/heartbeat"


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[FaultRedis]:
    server = FaultRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


class Site:
    """One enrolled server with 8 GPUs that heartbeats through the API, and a tenant with a bearer token."""

    def __init__(self) -> None:
        h100_model()
        self.server, credential = enroll("node-a")
        self.agent = APIClient()
        self.agent.credentials(HTTP_AUTHORIZATION=f"Bearer {credential}")
        self.seq = 0
        assert self.heartbeat().status_code == 200  # discovery
        Server.objects.filter(pk=self.server.pk).update(state=ServerState.READY)
        self.owner = get_user_model().objects.create_user("owner", password="x")
        self.project = project(owner=self.owner)
        self.tenant = APIClient()
        self.tenant.credentials(HTTP_AUTHORIZATION=f"Bearer {ApiTokenFactory(user=self.owner).plaintext}")
        self.statuses: list[int] = []

    def heartbeat(self) -> Any:
        self.seq += 1
        body = heartbeat("node-a", seq=self.seq, gpus=gpu_facts("node-a", count=8), start=timezone.now())
        return self.agent.generic("POST", HEARTBEAT, json.dumps(body), content_type="application/json")

    def book(self) -> Any:
        start = timezone.now()
        response = self.tenant.post(
            "/api/v1/reservations/",
            {
                "project": self.project.slug,
                "name": "through-an-outage",
                "spec": {"min_memory_mib": 1024, "gpu_count": 1},
                "window": {"start": start.isoformat(), "end": (start + timedelta(minutes=10)).isoformat()},
                "container": {"image": "gpucp-busybox:test"},
            },
            format="json",
        )
        self.statuses.append(response.status_code)
        return response

    def read(self, path: str = "/api/v1/reservations/") -> Any:
        response = self.tenant.get(path)
        self.statuses.append(response.status_code)
        return response

    def throttle_keys(self, redis: FaultRedis) -> list[bytes]:
        return list(redis.client().scan_iter(match=f"*throttle_user_{self.owner.pk}"))


def metric(name: str, **labels: str) -> float:
    body = APIClient().get("/metrics").content.decode()
    selector = ",".join(f'{k}="{v}"' for k, v in labels.items())
    match = re.search(rf"^{re.escape(name)}\{{{re.escape(selector)}\}} (\S+)$", body, re.M)
    return float(match.group(1)) if match else 0.0


def outage_lines(caplog: Any, kind: str, text: str) -> list[str]:
    lines = (r.getMessage() for r in caplog.records if r.name == OUTAGE_LOG)
    return [line for line in lines if line.startswith(f"{kind} ") and text in line]


def state(reservation: Reservation) -> str:
    return str(Reservation.objects.values_list("state", flat=True).get(pk=reservation.pk))


def watch(worker: CeleryWorker, predicate: Any, *, timeout: float, what: str) -> Any:
    try:
        return wait_for(predicate, timeout=timeout, interval=0.2, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the worker's log:\n{worker.log()[-4000:]}") from None


def test_api_serves_through_a_redis_outage_and_its_cache_comes_back(redis: FaultRedis, caplog: Any) -> None:
    caplog.set_level(logging.WARNING)
    with redis_backed(redis.url):
        site = Site()
        assert site.read().status_code == 200
        assert site.throttle_keys(redis), "the user throttle keeps its history in this Redis"
        # The throttles' one call per request (controlplane/core/api/throttling.py) counts as an incr.
        errors_before = metric("gpucp_cache_errors_total", operation="incr")

        redis.stop()  # the outage: the cache and the broker are gone

        booked = []
        for _ in range(4):
            response, seconds = timed(site.book)
            assert response.status_code == 201, response.content
            booked.append((response.json()["id"], seconds))
            assert site.read().status_code == 200
            assert site.read(f"/api/v1/reservations/{response.json()['id']}/").status_code == 200
        # Each booking tried the broker once (the opening), failed fast and said so; the beat opens it later.
        assert caplog.text.count("could not enqueue the opening of reservation") == 4
        assert max(seconds for _, seconds in booked) < 1.0, booked
        print(f"redis stopped: bookings took {', '.join(f'{s * 1000:.0f}' for _, s in booked)} ms")

        # The server's own heartbeat opens the windows, with no broker: its reply carries the four launches.
        reply = site.heartbeat()
        assert reply.status_code == 200
        assert len(reply.json()["desired"]) == 4
        assert Launch.objects.count() == 4
        assert set(Reservation.objects.values_list("state", flat=True)) == {ReservationState.STARTING}

        assert APIClient().get("/livez").status_code == 200
        ready = APIClient().get("/readyz")
        assert ready.status_code == 200  # degraded, still serving: only the database is required
        body = ready.json()
        assert body["status"] == "degraded"
        assert {name: check["state"] for name, check in body["checks"].items()} == {
            "database": "ok",
            "cache": "down",
            "broker": "down",
        }
        assert metric("gpucp_cache_errors_total", operation="incr") >= errors_before + 12
        assert len(outage_lines(caplog, "cache", "unreachable")) == 1, "one warning for the outage, not one per call"
        assert len(outage_lines(caplog, "broker", "unreachable")) == 1

        redis.start()  # the same Redis back, with its data

        # Within the retry interval the cache is asked again and the throttles keep their history there again.
        for key in site.throttle_keys(redis):
            redis.client().delete(key)
        wait_for(
            lambda: site.read().status_code == 200 and site.throttle_keys(redis),
            timeout=failopen.RETRY_AFTER_S + 5,
            interval=0.2,
            what="the throttle writing to Redis again",
        )
        assert len(outage_lines(caplog, "cache", "reachable again")) == 1
        assert APIClient().get("/readyz").json()["status"] == "ok"
    assert all(status < 500 for status in site.statuses), site.statuses


def test_api_answers_in_bounded_time_while_redis_hangs(redis: FaultRedis, caplog: Any) -> None:
    """A frozen Redis accepts connections and never answers (as behind a partition): every wait is bounded by
    REDIS_TIMEOUT_S, and the cache waits once per retry interval, not once per call."""
    caplog.set_level(logging.WARNING)
    timeout = settings.REDIS_TIMEOUT_S
    with redis_backed(redis.url):
        site = Site()
        assert site.book().status_code == 201  # the broker's and the cache's connections are open and pooled
        assert site.read().status_code == 200

        redis.freeze()

        first_read, first_s = timed(site.read)
        assert first_read.status_code == 200
        assert first_s < timeout + 0.5, first_s  # one cache call waits for the socket timeout, then fails open
        later = [timed(site.read) for _ in range(5)]
        assert all(r.status_code == 200 for r, _ in later)
        assert max(s for _, s in later) < 0.3, later  # the cache is known down: no more waits

        response, booking_s = timed(site.book)
        assert response.status_code == 201, response.content
        assert booking_s < timeout + 0.5, booking_s  # the publish of its opening waits once, then gives up
        assert "could not enqueue the opening of reservation" in caplog.text

        reply, heartbeat_s = timed(site.heartbeat)
        assert reply.status_code == 200 and len(reply.json()["desired"]) == 2
        assert heartbeat_s < timeout + 0.5, heartbeat_s

        print(
            f"redis frozen: first read {first_s:.2f} s, later reads <= {max(s for _, s in later) * 1000:.0f} ms, "
            f"booking {booking_s:.2f} s, heartbeat opening 2 windows {heartbeat_s:.2f} s"
        )
        ready, ready_s = timed(lambda: APIClient().get("/readyz"))
        assert ready.status_code == 200 and ready_s < settings.HEALTH_CHECK_TIMEOUT_S + 0.5, ready_s
        states = {name: check["state"] for name, check in ready.json()["checks"].items()}
        print(f"redis frozen: /readyz {ready_s:.2f} s, {states}")
        assert states["database"] == "ok" and states["cache"] != "ok" and states["broker"] != "ok", states

        redis.thaw()
        wait_for(
            lambda: APIClient().get("/readyz").json()["status"] == "ok",
            timeout=failopen.RETRY_AFTER_S + 5,
            what="readiness back to ok",
        )
    assert all(status < 500 for status in site.statuses), site.statuses


def test_worker_holding_an_eta_task_rides_out_a_redis_outage_and_the_task_still_runs(
    redis: FaultRedis, tmp_path: Path
) -> None:
    """celery 5.7.0 died here: ``Unrecoverable error: AttributeError("'NoneType' object has no attribute
    'hostname'")`` from kombu's restore of the unacknowledged ETA message, right after "Connection to broker
    lost" (docs/dispatch.md, "When Redis goes away").

    The window opens 14 s after booking, so the worker holds its ``open_reservation`` until then, unacknowledged.
    No beat and no agent run here: only that message can open the window. The worker loses it with its
    connection; Redis kept it among the unacknowledged messages, and the worker's sweep gives it back once the
    visibility timeout (20 s here, an hour in production) has passed since it was delivered.
    """
    options = transport_options(visibility_timeout=20, unacked_restore_interval=1, unacked_restore_throttle=1)
    outage_s = 12.0
    with redis_backed(redis.url, options):
        worker = thread_worker(redis, tmp_path, options)
        try:
            worker.wait_ready()
            model = h100_model()
            server(model, gpus=2)
            proj = project()
            later = book(proj, model, start_in=14.0, seconds=120.0)

            # The booking's notification fan-out may be held beside it for a moment: pick the window's opening.
            def held_opening() -> list[str]:
                messages = [json.loads(raw)[0]["headers"] for raw in redis.client().hvals("unacked")]
                return [h["id"] for h in messages if h.get("task", "").endswith(".open_reservation")]

            [eta_task_id] = watch(worker, held_opening, timeout=10, what="the ETA task held")
            watch(worker, lambda: f"open_reservation[{eta_task_id}] received" in worker.log(), timeout=10, what="it")

            redis.stop()
            time.sleep(outage_s)
            assert worker.process.poll() is None, f"the worker died in the outage:\n{worker.log()[-4000:]}"
            redis.start()  # the same Redis, with its data: the held message is still among the unacknowledged

            # A task sent after Redis returned runs: the worker reconnected by itself.
            returned = time.monotonic()
            now = book(proj, model, start_in=0.0, seconds=120.0)
            watch(worker, lambda: state(now) == ReservationState.STARTING, timeout=45, what="the later opening")
            caught_up_s = time.monotonic() - returned
            # The ETA task runs too, once, late by what the outage and the visibility timeout cost.
            watch(worker, lambda: state(later) == ReservationState.STARTING, timeout=45, what="the ETA task")
            eta_late_s = (timezone.now() - later.starts_at).total_seconds()
            print(f"worker: new task ran {caught_up_s:.1f} s after Redis returned; ETA task {eta_late_s:.1f} s late")
            # The task's commit makes the state visible before the worker logs the task's end: wait for the line.
            done = f"open_reservation[{eta_task_id}] succeeded"
            watch(worker, lambda: done in worker.log(), timeout=10, what="the ETA task's end in the log")
            log = worker.log()
            assert log.count(done) == 1, log[-4000:]
            assert Launch.objects.filter(reservation=later).count() == 1
            assert "Unrecoverable error" not in log and worker.process.poll() is None

            # The restored message was acknowledged once it ran. Other tasks may still be held (a push to the agent
            # that does not run here retries with a countdown), so only this one is looked for.
            def eta_still_held() -> bool:
                held = [json.loads(raw)[0]["headers"]["id"] for raw in redis.client().hvals("unacked")]
                return eta_task_id in held

            watch(worker, lambda: not eta_still_held(), timeout=15, what="the ETA task acknowledged")
        finally:
            worker.stop()
