"""Bookings through the real HTTP API beside raw INSERTs into an exclusion-constrained table, and the
earliest-window search on a large fleet.

    .venv/bin/python bench/booking.py [--seconds 15] [--clients 8] [--workers 2] [--threads 4] [--searches 60]
                             [--phases api,raw,search]

DATABASE_URL (default postgres://postgres@127.0.0.1:5432/bench_booking) must be PostgreSQL; the database is
dropped and created afresh on every run, as ledger entries cannot be deleted.

Phase 1 starts gunicorn (threaded workers, keep-alive) on a free 127.0.0.1 port and has ``--clients`` threads,
each with its own project and keep-alive session, POST /api/v1/reservations for random windows over the next
30 days (1, 2, 4 or 8 GPUs) on their own 64 x 8 GPU pool: once without and once with an Idempotency-Key, as
automation sends. Phase 2 has the same
number of threads INSERT rows straight into a table with the same exclusion constraint (the ceiling for a
booking at all). Phase 3 times the earliest-window search on 1,000 servers x 8 GPUs holding 50,000 future
allocations. Goals: API >= 10% of the raw rate with p99 < 50 ms; search p95 < 100 ms.

With the API phases, the stack's floor on the same web server: GET /livez (Django's middleware, no database)
and GET /api/v1/me/ (DRF with token authentication and one read), as fast as they answer: the most requests per
second any endpoint could take here, read against the same raw rate.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

from _common import django_on_fresh_database, http_floor, pct, run_threads, start_gunicorn

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/bench_booking"
API_MODEL, SEARCH_MODEL = "A100-80GB", "H100-80GB"


def build_fleet(model_name: str, servers: int, gpus: int, prefix: str) -> list[int]:
    from controlplane.inventory.choices import ServerState
    from controlplane.inventory.models import Gpu, GpuModel, Server

    model, _ = GpuModel.objects.get_or_create(
        name=model_name, defaults={"product_name": f"NVIDIA {model_name}", "memory_mib": 81920, "billing_weight": 1}
    )
    rows = Server.objects.bulk_create(
        Server(hostname=f"{prefix}-{i:04d}", state=ServerState.READY) for i in range(servers)
    )
    gpu_rows = []
    for srv in rows:
        uuids = [f"GPU-{srv.hostname}-{g}" for g in range(gpus)]
        for g in range(gpus):
            half = range(0, gpus // 2) if g < gpus // 2 else range(gpus // 2, gpus)
            gpu_rows.append(
                Gpu(
                    server=srv,
                    uuid=uuids[g],
                    index=g,
                    model=model,
                    product_name=model.product_name,
                    memory_mib=81920,
                    numa_node=0 if g < gpus // 2 else 1,
                    nvlink_peers=[uuids[p] for p in half if p != g],
                )
            )
    Gpu.objects.bulk_create(gpu_rows, batch_size=2000)
    return list(Gpu.objects.filter(model=model).values_list("pk", flat=True))


def fill_allocations(project_id: int, gpu_ids: list[int], total: int, days: int, seed: int) -> int:
    """``total`` future allocations spread over the GPUs, never overlapping on one GPU (1 to 12 hours each)."""
    from controlplane.inventory.models import GpuModel
    from controlplane.reservations.choices import ReservationState
    from controlplane.reservations.models import Allocation, Reservation

    rng = random.Random(seed)
    model = GpuModel.objects.get(name=SEARCH_MODEL)
    now = datetime.now(UTC)
    per_gpu, extra = divmod(total, len(gpu_ids))
    spans: list[tuple[int, datetime, datetime]] = []
    for n, gpu_id in enumerate(gpu_ids):
        cursor = now + timedelta(minutes=rng.randint(0, 600))
        for _ in range(per_gpu + (1 if n < extra else 0)):
            start = cursor + timedelta(minutes=rng.randint(0, 18 * 60))
            end = start + timedelta(minutes=rng.randint(60, 12 * 60))
            spans.append((gpu_id, start, end))
            cursor = end
    reservations = Reservation.objects.bulk_create(
        (
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
        ),
        batch_size=5000,
    )
    Allocation.objects.bulk_create(
        (
            Allocation(reservation=r, gpu_id=g, starts_at=a, ends_at=b)
            for r, (g, a, b) in zip(reservations, spans, strict=True)
        ),
        batch_size=5000,
    )
    return len(spans)


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def phase_api(
    args: argparse.Namespace, env: dict[str, str], token: str, slugs: list[str], *, idempotency_keys: bool
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
            rng = random.Random(seed)
            session = requests.Session()
            session.headers["Authorization"] = f"Bearer {token}"
            while time.monotonic() < deadline:
                start = datetime.now(UTC) + timedelta(minutes=rng.randint(5, 30 * 24 * 60))
                body = {
                    "project": slugs[seed % len(slugs)],
                    "name": "bench",
                    "spec": {"gpu_model": API_MODEL, "gpu_count": rng.choice([1, 2, 4, 8])},
                    "window": {
                        "start": start.isoformat(),
                        "end": (start + timedelta(minutes=rng.randint(60, 240))).isoformat(),
                    },
                    "container": {"image": "bench:1", "command": ["sleep", "1"]},
                }
                # Automation sends an Idempotency-Key so that a retry after a timeout cannot book twice.
                headers = {"Idempotency-Key": f"bench-{seed}-{uuid.uuid4()}"} if idempotency_keys else {}
                t0 = time.perf_counter()
                r = session.post(url, json=body, headers=headers, timeout=30)
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
    return {
        **counts,
        "seconds": elapsed,
        "rate": counts["created"] / elapsed,
        "p50": 1000 * pct(latencies, 0.50),
        "p99": 1000 * pct(latencies, 0.99),
    }


def phase_floor(args: argparse.Namespace, env: dict[str, str], token: str) -> dict[str, dict[str, float]]:
    """The stack's floor on the same kind of web server: what a request costs before an endpoint does any work."""
    proc, port = start_gunicorn(env, workers=args.workers, threads=args.threads)
    try:
        seconds = min(args.seconds, 10.0)
        return {
            "GET /livez (Django, no database)": http_floor(port, path="/livez", clients=args.clients, seconds=seconds),
            "GET /api/v1/me/ (DRF, token auth, one read)": http_floor(
                port,
                path="/api/v1/me/",
                clients=args.clients,
                seconds=seconds,
                headers={"Authorization": f"Bearer {token}"},
            ),
        }
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
    return {
        "created": len(latencies),
        "seconds": elapsed,
        "rate": len(latencies) / elapsed,
        "p50": 1000 * pct(latencies, 0.50),
        "p99": 1000 * pct(latencies, 0.99),
    }


def phase_search(args: argparse.Namespace) -> dict[str, float]:
    from django.utils import timezone

    from controlplane.inventory.models import GpuModel
    from controlplane.reservations.specs import GpuSpec
    from controlplane.reservations.windows import earliest_window

    model = GpuModel.objects.get(name=SEARCH_MODEL)
    rng = random.Random(7)
    times: list[float] = []
    found = 0
    for i in range(args.searches):
        count = [1, 2, 4, 8][i % 4]
        spec = GpuSpec(gpu_model_id=model.pk, gpu_count=count)
        t0 = time.perf_counter()
        result = earliest_window(
            spec, duration=timedelta(hours=rng.choice([1, 4, 12, 24])), within=timedelta(days=7), now=timezone.now()
        )
        times.append(time.perf_counter() - t0)
        found += result is not None
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
    parser.add_argument("--seconds", type=float, default=15.0, help="length of the API and raw phases")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients / raw writers")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers (2 to 4 on 2 cores)")
    parser.add_argument("--threads", type=int, default=4, help="threads per gunicorn worker")
    parser.add_argument("--searches", type=int, default=60)
    parser.add_argument("--search-servers", type=int, default=1000)
    parser.add_argument("--search-allocations", type=int, default=50_000)
    parser.add_argument(
        "--phases", default="api,raw,search", help="which phases to run, of api, raw and search (comma-separated)"
    )
    args = parser.parse_args()
    phases = {p.strip() for p in args.phases.split(",") if p.strip()}
    unknown = phases - {"api", "raw", "search"}
    if unknown or not phases:
        parser.error(f"--phases: unknown phase(s) {sorted(unknown)}; choose from api, raw, search")

    url, env = django_on_fresh_database("booking", DEFAULT_URL, API_THROTTLE_USER="10000000/min")
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection

    from controlplane.accounts.choices import Role
    from controlplane.accounts.models import ApiToken, Membership, Project
    from controlplane.core import tokens
    from controlplane.ledger.services import ledger_grant

    t0 = time.monotonic()
    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user(username="bench", password="bench-only")
    # One project per client, as tenants book: bookings of one project are serialised by its row lock.
    projects = [Project.objects.create(name=f"Bench {i}", slug=f"bench-{i}") for i in range(args.clients)]
    for project in projects:
        Membership.objects.create(project=project, user=user, role=Role.OWNER)
        ledger_grant(project=project, amount=10**9, actor=None, reason="bench credits")
    issued = tokens.issue(tokens.USER_TOKEN)
    ApiToken.objects.create(user=user, name="bench", lookup=issued.lookup, digest=issued.digest)
    build_fleet(API_MODEL, 64, 8, "api")
    filled = 0
    if "search" in phases:
        search_gpus = build_fleet(SEARCH_MODEL, args.search_servers, 8, "fleet")
        filled = fill_allocations(projects[0].pk, search_gpus, args.search_allocations, 7, seed=1)
    with connection.cursor() as cursor:
        # What autovacuum would have done by now on a live database: statistics and the visibility map.
        cursor.execute("VACUUM ANALYZE")
    connection.close()
    print(
        f"setup {time.monotonic() - t0:.1f} s: API pool 64 x 8 {API_MODEL}; search fleet "
        f"{args.search_servers} x 8 {SEARCH_MODEL} with {filled:,} future allocations; {args.clients} clients "
        f"(one project each), "
        f"{args.workers} gunicorn workers x {args.threads} threads, {args.seconds:g} s per phase; {load()}",
        flush=True,
    )

    slugs = [p.slug for p in projects]
    api = keyed = raw = search = floor = None
    if "api" in phases:
        api = phase_api(args, env, issued.plaintext, slugs, idempotency_keys=False)
        print(f"API phase without Idempotency-Key done; {load()}", flush=True)
        keyed = phase_api(args, env, issued.plaintext, slugs, idempotency_keys=True)
        print(f"API phase with Idempotency-Key done; {load()}", flush=True)
        floor = phase_floor(args, env, issued.plaintext)
        print(f"floor phase done; {load()}", flush=True)
    if "raw" in phases or "api" in phases:  # the API figures mean nothing without their baseline
        raw = phase_raw(url, args)
        print(f"raw INSERT phase done; {load()}", flush=True)
    if "search" in phases:
        search = phase_search(args)
        print(f"search phase done; {load()}", flush=True)

    print()
    if raw is not None:
        print(f"{'path':<50} {'ok':>8} {'per s':>9} {'p50 ms':>8} {'p99 ms':>8}")
        rows = (("API: POST /api/v1/reservations", api), ("API: the same with an Idempotency-Key", keyed))
        for label, result in rows:
            if result is not None:
                print(
                    f"{label:<50} {result['created']:>8,.0f} {result['rate']:>9,.1f} "
                    f"{result['p50']:>8.1f} {result['p99']:>8.1f}"
                )
        print(
            f"{'raw INSERT, exclusion-constrained (baseline)':<50} {raw['created']:>8,.0f} {raw['rate']:>9,.1f} "
            f"{raw['p50']:>8.2f} {raw['p99']:>8.2f}"
        )
        print()
        for label, result in (("without key", api), ("with key", keyed)):
            if result is None:
                continue
            ratio = result["rate"] / raw["rate"] if raw["rate"] else 0.0
            print(
                f"API {label}: {ratio:.1%} of raw (goal >= 10%), p99 {result['p99']:.1f} ms (goal < 50 ms); "
                f"409s (no capacity) {result['conflict']:,.0f}, other errors {result['errors']:,.0f}"
            )
    if floor is not None and raw is not None:
        print()
        for label, result in floor.items():
            print(
                f"stack floor, {label}: {result['rate']:,.0f} requests/s = {result['rate'] / raw['rate']:.1%} of raw "
                f"(p50 {result['p50']:.1f} ms, p99 {result['p99']:.1f} ms)"
            )
        print("  (a booking does at least what GET /api/v1/me/ does: the same stack, token authentication, a read)")
    if search is not None:
        print(
            f"earliest-window search, {search['n']} queries ({search['found']} found): p50 {search['p50']:.1f} ms, "
            f"p95 {search['p95']:.1f} ms (goal < 100 ms), max {search['max']:.1f} ms"
        )
    print(f"machine: {os.cpu_count()} CPUs, {load()}")


if __name__ == "__main__":
    main()
