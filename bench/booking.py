"""Booking cost against fleet size: bookings through the service and over HTTP, and the earliest-window
search, on fleets of 64, 1,000 and 10,000 servers, beside the raw floor and the stack's floor.

    .venv/bin/python bench/booking.py [--sweep 64,1000,10000 | --servers N | --quick] [--seconds 8]
                             [--clients 8] [--workers 2] [--threads 4] [--searches 40] [--allocations-per-gpu 1.25]

DATABASE_URL (default postgres://postgres@127.0.0.1:5432/bench_booking) must be PostgreSQL; the database is
dropped and created afresh on every run, as ledger entries cannot be deleted.

Each fleet size, smallest first, gets its own GPU model and servers of 8 GPUs, holding
``--allocations-per-gpu`` future allocations per GPU over the next 30 days (1.25: 100,000 on 10,000
servers), loaded with COPY (``copy_in``). On it, bookings of random windows over the next 30 days
(1, 2, 4 or 8 GPUs): by calling services.reservation_create (the service; one thread unless
``--service-clients``, so that its figures are a booking's cost), then from ``--clients`` threads, each
with its own project, over POST /api/v1/reservations/ (gunicorn, threaded workers, keep-alive sessions:
HTTP); then ``--searches`` earliest-window searches (1, 2, 4, 8 GPUs; 1 to 24 hours; within a week).
Goals (issue 16): at 10,000 servers the booking p50 at most 1.5x the p50 at 64, through the service and
over HTTP, and the search's p95 at most 100 ms.

The baselines, once per run: raw INSERTs into a table with the same exclusion constraint (the ceiling for a
booking at all), and GET /api/v1/me/ on the same gunicorn (DRF, token authentication, one read: what any
request costs before an endpoint does its work).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from _common import django_on_fresh_database, http_floor, pct, run_threads, server_gpus, start_gunicorn

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/bench_booking"
GPUS_PER_SERVER = 8
SIZES = (64, 1000, 10_000)


def copy_in(model: type, objs: list[Any]) -> list[int]:
    """Writes ``objs`` (unsaved instances of ``model``) with one COPY and returns their ids, in order.

    The ids are drawn from the table's sequence first, so each row's id is known without reading it back;
    every value goes through its field's own conversion, as a save would (``pre_save`` fills defaults such
    as a creation time). Triggers run as for INSERTs: the capacity summary stays exact."""
    from django.db import connection

    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    table = model._meta.db_table
    columns = ", ".join(connection.ops.quote_name(c) for c in ["id", *(f.column for f in fields)])
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence(%s, 'id')) FROM generate_series(1, %s)", [table, len(objs)]
        )
        ids = [row[0] for row in cursor.fetchall()]
        raw = cursor.cursor  # psycopg's own cursor, for its COPY
        with raw.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
            for pk, obj in zip(ids, objs, strict=True):
                copy.write_row([pk, *(f.get_db_prep_save(f.pre_save(obj, True), connection) for f in fields)])
    return ids


def build_fleet(model_name: str, servers: int, prefix: str) -> list[int]:
    """``servers`` ready servers of 8 GPUs of a model of their own, two NUMA nodes of four NVLinked GPUs."""
    from controlplane.inventory.choices import ServerState
    from controlplane.inventory.models import Gpu, GpuModel, Server

    model = GpuModel.objects.create(
        name=model_name, product_name=f"NVIDIA {model_name}", memory_mib=81920, billing_weight=1
    )
    rows = [Server(hostname=f"{prefix}-{i:05d}", state=ServerState.READY) for i in range(servers)]
    for srv, pk in zip(rows, copy_in(Server, rows), strict=True):
        srv.pk = pk
    gpu_rows = [gpu for srv in rows for gpu in server_gpus(srv, model, count=GPUS_PER_SERVER)]
    return copy_in(Gpu, gpu_rows)


def fill_allocations(project_id: int, model_name: str, gpu_ids: list[int], total: int, seed: int) -> int:
    """``total`` future allocations spread over the GPUs and the next 30 days, never overlapping on one GPU
    (1 to 12 hours each), each with its reservation, with COPY."""
    from django.db import transaction

    from controlplane.inventory.models import Gpu, GpuModel
    from controlplane.reservations.choices import ReservationState
    from controlplane.reservations.models import Allocation, Reservation

    rng = random.Random(seed)
    model = GpuModel.objects.get(name=model_name)
    now = datetime.now(UTC)
    per_gpu, extra = divmod(total, len(gpu_ids))
    spans: list[tuple[int, datetime, datetime]] = []
    for n, gpu_id in enumerate(gpu_ids):
        k = per_gpu + (1 if n < extra else 0)
        if not k:
            continue
        stride = 30 * 24 * 60 // k  # minutes of the 30 days each allocation of this GPU may use
        for j in range(k):
            start = now + timedelta(minutes=j * stride + rng.randint(0, max(0, stride - 12 * 60)))
            spans.append((gpu_id, start, start + timedelta(minutes=rng.randint(60, min(12 * 60, stride)))))
    servers = dict(Gpu.objects.filter(model=model).values_list("pk", "server_id"))
    with transaction.atomic():
        reservations = [
            Reservation(
                project_id=project_id,
                name="filler",
                gpu_model=model,
                gpu_count=1,
                starts_at=a,
                ends_at=b,
                image="filler",
                state=ReservationState.SCHEDULED,
            )
            for _, a, b in spans
        ]
        reservation_ids = copy_in(Reservation, reservations)
        copy_in(
            Allocation,
            [
                Allocation(reservation_id=r, gpu_id=g, server_id=servers[g], starts_at=a, ends_at=b)
                for r, (g, a, b) in zip(reservation_ids, spans, strict=True)
            ],
        )
    return len(spans)


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def _window(rng: random.Random) -> tuple[datetime, datetime]:
    start = datetime.now(UTC) + timedelta(minutes=rng.randint(5, 30 * 24 * 60))
    return start, start + timedelta(minutes=rng.randint(60, 240))


def _summary(latencies: list[float], counts: dict[str, int], elapsed: float) -> dict[str, float]:
    return {
        **counts,
        "seconds": elapsed,
        "rate": counts["created"] / elapsed,
        "p50": 1000 * pct(latencies, 0.50),
        "p95": 1000 * pct(latencies, 0.95),
        "p99": 1000 * pct(latencies, 0.99),
    }


def phase_service(args: argparse.Namespace, model_name: str, project_ids: list[int], user_id: int) -> dict[str, float]:
    """Bookings by calling the service, one thread (and database connection) per project."""
    from django.contrib.auth import get_user_model
    from django.db import connection

    from controlplane.accounts.models import Project
    from controlplane.core.errors import Conflict
    from controlplane.inventory.models import GpuModel
    from controlplane.reservations import selectors
    from controlplane.reservations.services import reservation_create
    from controlplane.reservations.specs import ContainerSpec, GpuSpec, Window

    model_id = GpuModel.objects.get(name=model_name).pk
    user = get_user_model().objects.get(pk=user_id)
    summary_read = selectors._fitting_from_summary

    def no_summary(*args: Any) -> None:
        return None

    ab: dict[str, Any] | None = {"summary": False, "with": [], "without": []} if args.ab else None
    latencies: list[float] = []
    counts = {"created": 0, "conflict": 0, "errors": 0}
    lock = threading.Lock()
    deadline = time.monotonic() + args.seconds

    def client(seed: int) -> None:
        rng = random.Random(seed)
        project = Project.objects.get(pk=project_ids[seed % len(project_ids)])
        container = ContainerSpec(image="bench:1", command=["sleep", "1"])
        mine: list[float] = []
        mine_counts = {"created": 0, "conflict": 0, "errors": 0}
        try:
            while time.monotonic() < deadline:
                if ab is not None:
                    # A/B in one run: every other booking reads the GPUs rather than the capacity summary.
                    ab["summary"] = not ab["summary"]
                    selectors._fitting_from_summary = summary_read if ab["summary"] else no_summary
                start, end = _window(rng)
                spec = GpuSpec(gpu_model_id=model_id, gpu_count=rng.choice([1, 2, 4, 8]))
                t0 = time.perf_counter()
                try:
                    reservation_create(
                        project=project,
                        name="bench",
                        spec=spec,
                        window=Window(start, end),
                        container=container,
                        actor=user,
                    )
                    mine_counts["created"] += 1
                except Conflict:
                    mine_counts["conflict"] += 1
                except Exception as exc:
                    mine_counts["errors"] += 1
                    if mine_counts["errors"] <= 2:
                        print("error", type(exc).__name__, str(exc)[:300], file=sys.stderr)
                mine.append(time.perf_counter() - t0)
                if ab is not None:
                    ab["with" if ab["summary"] else "without"].append(mine[-1])
        finally:
            connection.close()
        with lock:
            latencies.extend(mine)
            for key, value in mine_counts.items():
                counts[key] += value

    elapsed = run_threads(client, [(i,) for i in range(args.service_clients)])
    selectors._fitting_from_summary = summary_read
    out = _summary(latencies, counts, elapsed)
    if ab is not None:
        out["ab_with"], out["ab_without"] = (1000 * pct(ab[k], 0.5) for k in ("with", "without"))
    return out


def phase_http(
    args: argparse.Namespace, env: dict[str, str], token: str, slugs: list[str], model_name: str
) -> dict[str, float]:
    import requests

    proc, port = start_gunicorn(env, workers=args.workers, threads=args.threads)
    latencies: list[float] = []
    counts = {"created": 0, "conflict": 0, "errors": 0}
    lock = threading.Lock()
    try:
        url = f"http://127.0.0.1:{port}/api/v1/reservations/"
        deadline = time.monotonic() + args.seconds

        def client(seed: int) -> None:
            rng = random.Random(1000 + seed)
            session = requests.Session()
            session.headers["Authorization"] = f"Bearer {token}"
            while time.monotonic() < deadline:
                start, end = _window(rng)
                body = {
                    "project": slugs[seed % len(slugs)],
                    "name": "bench",
                    "spec": {"gpu_model": model_name, "gpu_count": rng.choice([1, 2, 4, 8])},
                    "window": {"start": start.isoformat(), "end": end.isoformat()},
                    "container": {"image": "bench:1", "command": ["sleep", "1"]},
                }
                t0 = time.perf_counter()
                r = session.post(url, json=body, timeout=60)
                elapsed = time.perf_counter() - t0
                with lock:
                    latencies.append(elapsed)
                    if r.status_code == 201:
                        counts["created"] += 1
                    elif r.status_code == 409:
                        counts["conflict"] += 1
                    else:
                        counts["errors"] += 1
                        if counts["errors"] <= 3:
                            print("error", r.status_code, r.text[:300], file=sys.stderr)

        elapsed = run_threads(client, [(i,) for i in range(args.clients)])
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return _summary(latencies, counts, elapsed)


def phase_floor(args: argparse.Namespace, env: dict[str, str], token: str) -> dict[str, float]:
    """GET /api/v1/me/ on the same kind of web server: what a request costs before an endpoint does any work."""
    proc, port = start_gunicorn(env, workers=args.workers, threads=args.threads)
    try:
        return http_floor(
            port,
            path="/api/v1/me/",
            clients=args.clients,
            seconds=args.seconds,
            headers={"Authorization": f"Bearer {token}"},
        )
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def phase_raw(url: str, args: argparse.Namespace) -> dict[str, float]:
    import psycopg

    conninfo = url.replace("postgres://", "postgresql://", 1)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_raw_allocation")
        conn.execute(
            "CREATE TABLE bench_raw_allocation (id bigserial PRIMARY KEY, gpu_id int NOT NULL, "
            "period tstzrange NOT NULL, EXCLUDE USING gist (gpu_id WITH =, period WITH &&))"
        )
    latencies: list[float] = []
    lock = threading.Lock()
    deadline = time.monotonic() + args.seconds

    def writer(n: int) -> None:
        mine: list[float] = []
        base = datetime.now(UTC)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            i = 0
            while time.monotonic() < deadline:
                i += 1
                gpu = n * 512 + i % 512  # a pool of GPUs per writer, windows one after the other on each
                start = base + timedelta(hours=i // 512)
                t0 = time.perf_counter()
                conn.execute(
                    "INSERT INTO bench_raw_allocation (gpu_id, period) VALUES (%s, tstzrange(%s, %s, '[)'))",
                    (gpu, start, start + timedelta(hours=1)),
                )
                mine.append(time.perf_counter() - t0)
        with lock:
            latencies.extend(mine)

    elapsed = run_threads(writer, [(i,) for i in range(args.clients)])
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("DROP TABLE bench_raw_allocation")
    return _summary(latencies, {"created": len(latencies)}, elapsed)


def phase_search(args: argparse.Namespace, model_name: str) -> dict[str, float]:
    from django.db import connection
    from django.utils import timezone

    from controlplane.inventory.models import GpuModel
    from controlplane.reservations.specs import GpuSpec
    from controlplane.reservations.windows import earliest_window

    model = GpuModel.objects.get(name=model_name)
    rng = random.Random(7)
    times: list[float] = []
    found = 0
    for i in range(args.searches):
        spec = GpuSpec(gpu_model_id=model.pk, gpu_count=[1, 2, 4, 8][i % 4])
        t0 = time.perf_counter()
        result = earliest_window(
            spec, duration=timedelta(hours=rng.choice([1, 4, 12, 24])), within=timedelta(days=7), now=timezone.now()
        )
        times.append(time.perf_counter() - t0)
        found += result is not None
    connection.close()
    return {
        "n": len(times),
        "found": found,
        "p50": 1000 * pct(times, 0.5),
        "p95": 1000 * pct(times, 0.95),
        "max": 1000 * max(times),
        "mean": 1000 * statistics.fmean(times),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", default=",".join(str(n) for n in SIZES), help="fleet sizes, in servers")
    parser.add_argument("--servers", type=int, help="one fleet size instead of the sweep")
    parser.add_argument("--quick", action="store_true", help="the sweep without 10,000 servers, 3 s phases")
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each booking, raw and floor phase")
    parser.add_argument("--clients", type=int, default=8, help="concurrent HTTP clients / raw writers")
    parser.add_argument(
        "--service-clients",
        type=int,
        default=1,
        help="threads calling the service (one: a booking's own cost, not the wait for the GIL)",
    )
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers (2 to 4 on 2 cores)")
    parser.add_argument("--threads", type=int, default=4, help="threads per gunicorn worker")
    parser.add_argument("--searches", type=int, default=40)
    parser.add_argument(
        "--ab",
        action="store_true",
        help="service bookings alternate between the capacity summary's read and the GPUs' (one thread only)",
    )
    parser.add_argument("--allocations-per-gpu", type=float, default=1.25, help="future allocations per GPU")
    args = parser.parse_args()
    if args.servers is not None:
        sizes = [args.servers]
    elif args.quick:
        sizes, args.seconds = [64, 1000], min(args.seconds, 3.0)
    else:
        try:
            sizes = sorted(int(n) for n in args.sweep.split(",") if n.strip())
        except ValueError:
            parser.error("--sweep: comma-separated numbers of servers, e.g. 64,1000,10000")
    if not sizes or min(sizes) < 1:
        parser.error("fleet sizes must be at least 1 server")
    if args.ab and args.service_clients != 1:
        parser.error("--ab alternates the read for the whole process: one service thread (--service-clients 1)")

    url, env = django_on_fresh_database("booking", DEFAULT_URL, API_THROTTLE_USER="10000000/min")
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection

    from controlplane.accounts.choices import Role
    from controlplane.accounts.models import ApiToken, Membership, Project
    from controlplane.core import tokens
    from controlplane.ledger.services import ledger_grant

    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user(username="bench", password="bench-only")
    # One project per client, as tenants book: bookings of one project are serialised by its row lock.
    projects = [Project.objects.create(name=f"Bench {i}", slug=f"bench-{i}") for i in range(args.clients)]
    for project in projects:
        Membership.objects.create(project=project, user=user, role=Role.OWNER)
        ledger_grant(project=project, amount=10**10, actor=None, reason="bench credits")
    filler = Project.objects.create(name="Filler", slug="filler")
    issued = tokens.issue(tokens.USER_TOKEN)
    ApiToken.objects.create(user=user, name="bench", lookup=issued.lookup, digest=issued.digest)
    slugs, project_ids = [p.slug for p in projects], [p.pk for p in projects]
    print(
        f"{args.clients} clients (one project each), {args.workers} gunicorn workers x {args.threads} threads, "
        f"{args.seconds:g} s per phase, {args.allocations_per_gpu:g} future allocations per GPU; {load()}",
        flush=True,
    )

    results: list[tuple[int, int, float, dict[str, float], dict[str, float], dict[str, float]]] = []
    for n in sizes:
        t0 = time.monotonic()
        model_name = f"SWEEP-{n}"
        gpu_ids = build_fleet(model_name, n, f"s{n}")
        filled = fill_allocations(filler.pk, model_name, gpu_ids, round(args.allocations_per_gpu * len(gpu_ids)), n)
        with connection.cursor() as cursor:
            # What autovacuum would have done by now on a live database: statistics and the visibility map.
            cursor.execute("VACUUM ANALYZE")
        connection.close()
        loaded = time.monotonic() - t0
        print(f"{n:,} servers x {GPUS_PER_SERVER}: {filled:,} future allocations loaded in {loaded:.1f} s", flush=True)
        service = phase_service(args, model_name, project_ids, user.pk)
        http = phase_http(args, env, issued.plaintext, slugs, model_name)
        search = phase_search(args, model_name)
        print(f"  measured; {load()}", flush=True)
        results.append((n, filled, loaded, service, http, search))
    floor = phase_floor(args, env, issued.plaintext)
    raw = phase_raw(url, args)

    print()
    head = f"{'servers':>8} {'allocations':>11} | {'service p50':>11} {'p95':>6} {'per s':>6} | "
    head += f"{'HTTP p50':>8} {'p95':>6} {'per s':>6} | {'search p50':>10} {'p95':>6}"
    print(head)
    for n, filled, _, service, http, search in results:
        print(
            f"{n:>8,} {filled:>11,} | {service['p50']:>11.1f} {service['p95']:>6.1f} {service['rate']:>6.0f} | "
            f"{http['p50']:>8.1f} {http['p95']:>6.1f} {http['rate']:>6.0f} | {search['p50']:>10.1f} "
            f"{search['p95']:>6.1f}"
        )
    print(
        f"{'raw INSERT, exclusion-constrained (floor)':<46} p50 {raw['p50']:.2f} ms, p95 {raw['p95']:.2f} ms, "
        f"{raw['rate']:,.0f}/s"
    )
    print(
        f"{'GET /api/v1/me/ on the same gunicorn (stack)':<46} p50 {floor['p50']:.1f} ms, "
        f"p99 {floor['p99']:.1f} ms, {floor['rate']:,.0f}/s"
    )
    first = results[0]
    for n, _, _, service, http, search in results[1:]:
        print(
            f"{n:,} servers against {first[0]:,}: p50 x{service['p50'] / first[3]['p50']:.2f} through the service, "
            f"x{http['p50'] / first[4]['p50']:.2f} over HTTP (goal <= 1.5); search p95 {search['p95']:.1f} ms "
            "(goal <= 100)"
        )
    for n, _, _, service, http, _ in results:
        print(
            f"{n:,} servers: service 409s {service['conflict']:,.0f}, errors {service['errors']:,.0f}; "
            f"HTTP 409s {http['conflict']:,.0f}, errors {http['errors']:,.0f}"
        )
    if args.ab:
        for n, _, _, service, _, _ in results:
            print(
                f"{n:,} servers, service p50 interleaved: with the summary {service['ab_with']:.1f} ms, reading the "
                f"GPUs {service['ab_without']:.1f} ms (x{service['ab_with'] / service['ab_without']:.2f})"
            )
    print(f"machine: {os.cpu_count()} CPUs, {load()}")


if __name__ == "__main__":
    main()
