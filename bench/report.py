"""A project's monthly usage report on a year of hourly rollups, beside the raw SQL aggregate of the same figures.

    .venv/bin/python bench/report.py [--gpus 1000] [--days 365] [--projects 10] [--runs 20]

DATABASE_URL (default postgres://postgres@127.0.0.1:5432/bench_report) must be PostgreSQL. The database is
created and migrated if missing, and filled once with generate_series SQL straight into the real tables:
one hourly telemetry rollup (GpuUsageHour) and one usage slice (UsageSlice) per GPU per hour, each GPU held by
one of ``--projects`` projects (about 8.8 million rows per table by default). A populated database is reused.

It then times ``project_report`` (the service behind /api/v1/usage/report) for one project's busiest month,
``--runs`` times, and the raw GROUP BY of the same figures over the same rows in the same run.
Goal: report p95 < 500 ms and at most twice the raw aggregate's p95.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/bench_report"
START = datetime(2025, 1, 1, tzinfo=UTC)


def ensure_database(url: str) -> None:
    import psycopg

    parsed = urlparse(url)
    name = parsed.path.lstrip("/")
    admin = parsed._replace(path="/postgres", scheme="postgresql").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def populate(*, gpus: int, days: int, projects: int) -> None:
    from django.contrib.auth import get_user_model
    from django.db import connection

    from controlplane.accounting.models import GpuUsageHour, UsageRecord, UsageSlice
    from controlplane.accounts.models import Project
    from controlplane.inventory.models import Gpu, GpuModel, Server
    from controlplane.reservations.models import Reservation

    if GpuUsageHour.objects.exists():
        print(f"reusing {GpuUsageHour.objects.count():,} hourly rollups and {UsageSlice.objects.count():,} slices")
        return
    t0 = time.monotonic()
    model = GpuModel.objects.create(
        name="H100-80GB",
        product_name="NVIDIA H100 80GB HBM3",
        memory_mib=81920,
        price_per_gpu_hour="2.5",
        billing_weight="1",
    )
    users = [get_user_model().objects.create(username=f"bench-user-{i}") for i in range(projects * 3)]
    projs = [Project.objects.create(name=f"Bench {i}", slug=f"bench-{i}") for i in range(projects)]
    end = START + timedelta(days=days)
    reservations = [
        Reservation.objects.create(
            project=p,
            created_by=users[i * 3],
            name="year-long",
            gpu_model=model,
            gpu_count=gpus // projects,
            starts_at=START,
            ends_at=end,
            image="bench",
            state="completed",
        )
        for i, p in enumerate(projs)
    ]
    servers = [Server.objects.create(hostname=f"bench-{n:04d}", state="ready") for n in range((gpus + 7) // 8)]
    Gpu.objects.bulk_create(
        [
            Gpu(
                server=servers[i // 8],
                uuid=f"GPU-bench-{i:05d}",
                index=i % 8,
                model=model,
                product_name=model.product_name,
                memory_mib=81920,
            )
            for i in range(gpus)
        ],
        batch_size=1000,
    )
    gpu_ids = list(Gpu.objects.order_by("pk").values_list("pk", flat=True))
    UsageRecord.objects.bulk_create(
        [
            UsageRecord(
                reservation=reservations[i % projects],
                gpu_id=gid,
                project=projs[i % projects],
                user=users[(i % projects) * 3 + i % 3],
                gpu_model=model,
                booked_start=START,
                booked_end=end,
                started_at=START,
                finished_at=end,
                booked_s=days * 86400.0,
                gpu_seconds=days * 86400.0,
            )
            for i, gid in enumerate(gpu_ids)
        ],
        batch_size=1000,
    )
    with connection.cursor() as cur:
        cur.execute(
            "CREATE TEMP TABLE bench_map AS SELECT r.id AS record_id, r.gpu_id, r.project_id, "
            "r.reservation_id, r.user_id, r.gpu_model_id FROM accounting_usagerecord r"
        )
        hours = days * 24
        # Utilization, power and idle vary by GPU and hour so the sums are not trivially constant.
        cur.execute(
            "INSERT INTO accounting_gpuusagehour (gpu_id, hour, gpu_model_id, project_id, reservation_id, user_id,"
            " minutes, util_minutes, util_mean, util_max, fb_used_max_mib, power_mean_w, energy_wh,"
            " energy_from_counter, held_s, idle_s) "
            "SELECT m.gpu_id, %s::timestamptz + h * interval '1 hour', m.gpu_model_id, m.project_id,"
            " m.reservation_id, m.user_id, 60, 60, (m.gpu_id * 7 + h * 13) %% 100, 100, 40000,"
            " 200 + (m.gpu_id + h) %% 400, 200 + (m.gpu_id + h) %% 400, true, 3600,"
            " CASE WHEN (m.gpu_id * 7 + h * 13) %% 100 < 5 THEN 3600 ELSE 0 END "
            "FROM bench_map m CROSS JOIN generate_series(0, %s) AS h",
            [START, hours - 1],
        )
        print(f"  hourly rollups written in {time.monotonic() - t0:.0f} s")
        cur.execute(
            "INSERT INTO accounting_usageslice (record_id, hour, project_id, reservation_id, user_id, gpu_model_id,"
            " booked_s, used_s, credits, cost, currency) "
            "SELECT m.record_id, %s::timestamptz + h * interval '1 hour', m.project_id, m.reservation_id, m.user_id,"
            " m.gpu_model_id, 3600, 3600, 1, 2.5, 'USD' "
            "FROM bench_map m CROSS JOIN generate_series(0, %s) AS h",
            [START, hours - 1],
        )
        cur.execute("ANALYZE accounting_gpuusagehour; ANALYZE accounting_usageslice")
    print(f"populated {gpus} GPUs x {days} days in {time.monotonic() - t0:.0f} s")


RAW_SQL = [
    "SELECT user_id, currency, SUM(booked_s), SUM(used_s), SUM(credits), SUM(cost) FROM accounting_usageslice "
    "WHERE project_id = %s AND hour >= %s AND hour < %s GROUP BY user_id, currency",
    "SELECT user_id, SUM(held_s), SUM(idle_s), SUM(energy_wh), SUM(util_minutes), SUM(util_mean * util_minutes) "
    "FROM accounting_gpuusagehour WHERE project_id = %s AND hour >= %s AND hour < %s GROUP BY user_id",
]


def p95(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=20)[-1] if len(samples) >= 2 else samples[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--projects", type=int, default=10)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()

    url = os.environ.setdefault("DATABASE_URL", DEFAULT_URL)
    if not url.startswith(("postgres://", "postgresql://")):
        raise SystemExit("bench/report.py measures PostgreSQL: DATABASE_URL must point at one")
    ensure_database(url)
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from controlplane.accounting.selectors import project_report
    from controlplane.accounts.models import Project

    call_command("migrate", verbosity=0)
    populate(gpus=args.gpus, days=args.days, projects=args.projects)
    project = Project.objects.get(slug="bench-0")
    # March when the data covers it, else the first month (or what there is of it).
    start = datetime(2025, 3, 1, tzinfo=UTC) if args.days >= 90 else START
    end = datetime(2025, 4, 1, tzinfo=UTC) if args.days >= 90 else START + timedelta(days=min(args.days, 31))

    report_ms, raw_ms = [], []
    for i in range(args.runs + 2):  # two warm-up rounds, not counted
        t = time.perf_counter()
        report = project_report(project=project, start=start, end=end, group_by="user")
        took = (time.perf_counter() - t) * 1000
        t = time.perf_counter()
        with connection.cursor() as cur:
            for sql in RAW_SQL:
                cur.execute(sql, [project.pk, start, end])
                cur.fetchall()
        raw = (time.perf_counter() - t) * 1000
        if i >= 2:
            report_ms.append(took)
            raw_ms.append(raw)
    total = report.total.as_dict()
    print(
        f"project {project.slug}, {start:%Y-%m-%d} to {end:%Y-%m-%d}: {total['used_gpu_hours']:,.0f} used GPU-hours, "
        f"{total['credits']} credits, util {total['util_mean_percent']} %"
    )
    print(f"report service: p50 {statistics.median(report_ms):7.1f} ms   p95 {p95(report_ms):7.1f} ms")
    print(f"raw aggregate:  p50 {statistics.median(raw_ms):7.1f} ms   p95 {p95(raw_ms):7.1f} ms")
    ratio = p95(report_ms) / max(p95(raw_ms), 1e-9)
    ok = p95(report_ms) < 500 and ratio <= 2.0
    print(f"ratio {ratio:.2f}x; goal p95 < 500 ms and <= 2x raw: {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
