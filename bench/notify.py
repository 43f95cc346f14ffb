"""Webhook fan-out: events to many endpoints, event -> delivery latency, beside a bare HTTP POST loop.

    .venv/bin/python bench/notify.py [--events 10000] [--endpoints 50] [--senders 8] [--fanouts 2] [--fanout-batch 20]

DATABASE_URL (default postgres://postgres@127.0.0.1:5432/bench_notify) must be PostgreSQL; the database is
dropped and created afresh on every run.

One project has ``--endpoints`` webhook endpoints, each a path of one local receiver (http.server, threaded,
HTTP/1.1 keep-alive) that checks every Standard Webhooks signature and records when each message arrived. A
producer writes ``--events`` events as fast as it can (the outbox rows a state change writes); ``--fanouts``
threads fan them out, ``--fanout-batch`` events per transaction (services.events_fan_out, what the beat's
reconciler runs: their notifications and one delivery per endpoint, in bulk), and
``--senders`` threads send the endpoints' queues (delivery.deliver_endpoint, the code a Celery worker runs), each
sender owning a share of the endpoints. Latency is the receiver's arrival time minus the event's time.

The baseline, in the same run against the same receiver: ``--senders`` threads POSTing the same signed body in a
bare loop (urllib3, keep-alive), as many POSTs as there were deliveries; its latency is one POST's round trip.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from _common import fresh_database, pct

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/bench_notify"


def setup_django(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    os.environ.setdefault("CONTROLPLANE_VAR_DIR", tempfile.mkdtemp(prefix="bench-notify-"))
    os.environ["NOTIFICATIONS_WEBHOOK_ALLOW_PRIVATE"] = "true"  # the receiver is on loopback
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    # No broker here: the fan-out's after-commit sends find none and leave the work to the sender threads.
    os.environ["REDIS_URL"] = "redis://127.0.0.1:1/0"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


class Receiver:
    def __init__(self, secret_of: dict[str, str]) -> None:
        self.secret_of = secret_of
        self.arrivals: dict[tuple[str, str], float] = {}
        self.bad = 0
        self.count = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                from controlplane.notifications import signing

                body = self.rfile.read(int(self.headers["content-length"]))
                now = time.time()
                secret = receiver.secret_of.get(self.path)
                msg_id = self.headers.get("webhook-id", "")
                ok = secret is None or signing.verify(
                    secret,
                    msg_id=msg_id,
                    timestamp=self.headers.get("webhook-timestamp", ""),
                    signature=self.headers.get("webhook-signature", ""),
                    body=body,
                    now=now,
                )
                with receiver.lock:
                    receiver.count += 1
                    if not ok:
                        receiver.bad += 1
                    elif secret is not None:
                        receiver.arrivals[(self.path, msg_id)] = now
                self.send_response(200 if ok else 401)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.port = self.server.server_address[1]


def run_pipeline(args: argparse.Namespace) -> None:
    from django.contrib.auth import get_user_model
    from django.db import connection, transaction

    from controlplane.accounts.choices import Role
    from controlplane.accounts.models import Membership, Project
    from controlplane.notifications import delivery, services
    from controlplane.notifications.choices import DeliveryState, EventType
    from controlplane.notifications.models import Event, WebhookDelivery

    owner = get_user_model().objects.create(username="owner", email="")
    project = Project.objects.create(name="Bench", slug="bench")
    Membership.objects.create(project=project, user=owner, role=Role.OWNER)
    secret_of: dict[str, str] = {}
    receiver = Receiver(secret_of)
    endpoints = []
    for i in range(args.endpoints):
        e = services.endpoint_create(
            project=project,
            url=f"http://127.0.0.1:{receiver.port}/e{i}",
            events=[EventType.BUDGET_THRESHOLD],
            description="",
            actor=owner,
        )
        secret_of[f"/e{i}"] = e.secret
        endpoints.append(e.pk)
    connection.close()

    occurred: dict[str, float] = {}
    produced = threading.Event()
    stop = threading.Event()

    def produce() -> None:
        batch = 100
        for start in range(0, args.events, batch):
            with transaction.atomic():
                rows = [
                    Event(type=EventType.BUDGET_THRESHOLD, project=project, payload={"n": n, "threshold_percent": 80})
                    for n in range(start, min(args.events, start + batch))
                ]
                Event.objects.bulk_create(rows)
            t = time.time()
            for row in rows:
                occurred[f"msg_{row.public_id.hex}"] = t
        produced.set()
        connection.close()

    def fan_out(k: int) -> None:
        while not stop.is_set():
            ids = list(
                Event.objects.filter(fanned_out_at__isnull=True).order_by("id").values_list("pk", flat=True)[:200]
            )
            ids = [i for i in ids if i % args.fanouts == k]
            if not ids:
                if produced.is_set() and not Event.objects.filter(fanned_out_at__isnull=True).exists():
                    break
                time.sleep(0.01)
                continue
            for start in range(0, len(ids), args.fanout_batch):
                services.events_fan_out(event_ids=ids[start : start + args.fanout_batch])
        connection.close()

    fanned = threading.Event()

    def send(k: int) -> None:
        mine = endpoints[k :: args.senders]
        while True:
            sent = sum(delivery.deliver_endpoint(endpoint_id=pk, limit=1000) for pk in mine)
            if not sent:
                if (
                    fanned.is_set()
                    and not WebhookDelivery.objects.filter(endpoint_id__in=mine, state=DeliveryState.PENDING).exists()
                ):
                    break
                time.sleep(0.01)
        connection.close()

    t0 = time.time()
    producer = threading.Thread(target=produce)
    fanners = [threading.Thread(target=fan_out, args=(k,)) for k in range(args.fanouts)]
    senders = [threading.Thread(target=send, args=(k,)) for k in range(args.senders)]
    for t in [producer, *fanners, *senders]:
        t.start()
    producer.join()
    for t in fanners:
        t.join()
    fanned.set()
    for t in senders:
        t.join()
    elapsed = time.time() - t0
    latencies = [arrived - occurred[msg] for (_path, msg), arrived in receiver.arrivals.items() if msg in occurred]
    deliveries = len(latencies)
    failed = WebhookDelivery.objects.exclude(state=DeliveryState.DELIVERED).count()
    print(
        f"webhook fan-out: {args.events} events x {args.endpoints} endpoints = {deliveries} deliveries "
        f"({failed} not delivered, {receiver.bad} bad signatures) in {elapsed:.1f} s"
    )
    print(f"  events/s {args.events / elapsed:.1f}, deliveries/s {deliveries / elapsed:.0f}")
    print(
        f"  event -> delivery: p50 {pct(latencies, 0.5) * 1000:.0f} ms, p95 {pct(latencies, 0.95) * 1000:.0f} ms, "
        f"max {max(latencies) * 1000:.0f} ms"
    )
    baseline(args, receiver, deliveries)
    receiver.server.shutdown()


def baseline(args: argparse.Namespace, receiver: Receiver, total: int) -> None:
    import urllib3

    from controlplane.notifications import signing

    body = json.dumps({"type": "project.budget_threshold", "timestamp": "x", "data": {"n": 1}}).encode()
    secret = signing.new_secret()
    per = [total // args.senders + (1 if k < total % args.senders else 0) for k in range(args.senders)]
    rtts: list[float] = []
    lock = threading.Lock()

    def loop(n: int) -> None:
        pool = urllib3.HTTPConnectionPool("127.0.0.1", receiver.port, maxsize=1, retries=False)
        mine = []
        for i in range(n):
            ts = int(time.time())
            headers = signing.headers([secret], msg_id=f"msg_{i}", timestamp=ts, body=body)
            started = time.perf_counter()
            pool.urlopen("POST", "/bare", body=body, headers=headers)
            mine.append(time.perf_counter() - started)
        with lock:
            rtts.extend(mine)

    t0 = time.time()
    threads = [threading.Thread(target=loop, args=(n,)) for n in per]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.time() - t0
    print(
        f"bare POST loop (same run, same receiver, {args.senders} threads): {total} POSTs in {elapsed:.1f} s, "
        f"{total / elapsed:.0f} POSTs/s, p50 {pct(rtts, 0.5) * 1000:.1f} ms, p95 {pct(rtts, 0.95) * 1000:.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--endpoints", type=int, default=50)
    parser.add_argument("--senders", type=int, default=8)
    parser.add_argument("--fanouts", type=int, default=2)
    parser.add_argument("--fanout-batch", type=int, default=20, help="events per fan-out transaction")
    args = parser.parse_args()
    url = os.environ.get("DATABASE_URL", DEFAULT_URL)
    if not url.startswith(("postgres://", "postgresql://")):
        raise SystemExit("DATABASE_URL must be PostgreSQL")
    fresh_database(url)
    setup_django(url)
    run_pipeline(args)


if __name__ == "__main__":
    main()
