"""A project's monthly usage report on a year of hourly rollups, beside the raw SQL aggregate of the same figures.

    .venv/bin/python bench/report.py [--gpus 1000] [--days 365] [--projects 200] [--share 0.05] [--runs 20]

DATABASE_URL (default postgres://postgres@127.0.0.1:5432/bench_report) must be PostgreSQL. The database is
created and migrated if missing and filled once, server-side, with ``INSERT ... SELECT FROM generate_series``
straight into the real tables (one statement per table per month), with the tables' secondary indexes dropped
during the load and built afterwards, then ``VACUUM ANALYZE``. A marker table records the parameters of a
finished load: a database holding a finished load of the same size is reused as it is; one holding an
unfinished or different load of this benchmark is dropped and filled again; any other non-empty database is
refused, never touched.

The fleet is ``--gpus`` GPUs on 8-GPU servers (one in four an A100, the rest H100). Every server-week, with a
probability of 80 %, one reservation holds the whole server for most of the week (it starts up to a day late
and ends up to a day and a half early), so about 65 % of GPU-hours are held. A held week goes to the
benchmarked project (``bench-000``) with probability ``--share`` and otherwise to one of the other
``--projects - 1`` projects. So:

* ``GpuUsageHour``: one row per GPU per hour, held or not (8.76 million for 1,000 GPUs over a year), written
  hour by hour as the rollup writes them; utilization varies by reservation and hour, with idle hours.
* ``UsageSlice``: one row per held GPU-hour (about 5.7 million), written reservation by reservation as
  settlement writes them; the first and last hour of a run are partly used.

It then times ``project_report`` (the service behind /api/v1/usage/report) for the benchmarked project over
March, ``--runs`` times for each ``group_by``, each run beside the raw ``GROUP BY`` of the same figures over the
same rows, checks both give the same totals, and prints p50, p95 and their ratio.
Goal: report p95 < 500 ms and at most twice the raw aggregate's p95.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/bench_report"
START = datetime(2025, 1, 1, tzinfo=UTC)
MARKER = "bench_report_marker"
# Bump when the generated data changes shape, so an old load is not reused.
DATA_VERSION = 2
HOURS_PER_WEEK = 168
GPUS_PER_SERVER = 8
HELD_WEEK_PROBABILITY = 0.8
BIG_TABLES = ("accounting_gpuusagehour", "accounting_usageslice")
GROUP_BYS = ("user", "gpu_model", "day", "reservation")


def prepare_database(url: str, params: dict[str, int | float]) -> bool:
    """Make sure the database exists; True when it already holds a finished load with these parameters."""
    import psycopg

    parsed = urlparse(url)
    name = parsed.path.lstrip("/")
    admin = parsed._replace(path="/postgres", scheme="postgresql").geturl()
    target = parsed._replace(scheme="postgresql").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
            return False
    with psycopg.connect(target, autocommit=True) as conn:
        has_marker = conn.execute("SELECT to_regclass(%s) IS NOT NULL", [MARKER]).fetchone()[0]
        if has_marker:
            row = conn.execute(f"SELECT params, finished_at FROM {MARKER}").fetchone()
            if row and row[0] == params and row[1] is not None:
                return True
        else:
            tables = conn.execute(
                "SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'django_migrations'"
            ).fetchone()[0]
            if tables:
                raise SystemExit(f"database {name!r} has tables but no benchmark marker: give an empty database")
            return False
    print(f"database {name!r} holds another or an unfinished load: dropping it")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return False


def _drop_secondary_indexes(cur, table: str) -> list[str]:
    """Drop every index of ``table`` but its primary key; return the statements that make them again."""
    cur.execute(
        "SELECT i.relname, pg_get_indexdef(i.oid), c.conname, pg_get_constraintdef(c.oid) "
        "FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
        "LEFT JOIN pg_constraint c ON c.conindid = x.indexrelid AND c.conrelid = x.indrelid "
        "WHERE x.indrelid = %s::regclass AND NOT x.indisprimary",
        [table],
    )
    restore = []
    for index, index_def, constraint, constraint_def in cur.fetchall():
        if constraint:
            cur.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{constraint}"')
            restore.append(f'ALTER TABLE {table} ADD CONSTRAINT "{constraint}" {constraint_def}')
        else:
            cur.execute(f'DROP INDEX "{index}"')
            restore.append(index_def)
    return restore


def populate(*, gpus: int, days: int, projects: int, share: float, params: dict[str, int | float]) -> None:
    from django.contrib.auth import get_user_model
    from django.db import connection

    from controlplane.accounts.models import Membership, Project
    from controlplane.inventory.models import Gpu, GpuModel, Server
    from controlplane.reservations.models import Reservation

    t0 = time.monotonic()
    hours = days * 24
    rng = random.Random(20250301)
    with connection.cursor() as cur:
        cur.execute(f"CREATE TABLE {MARKER} (params jsonb NOT NULL, finished_at timestamptz)")
        cur.execute(f"INSERT INTO {MARKER} (params) VALUES (%s::jsonb)", [json.dumps(params)])

    h100 = GpuModel.objects.create(
        name="H100-80GB", product_name="NVIDIA H100 80GB HBM3", memory_mib=81920, price_per_gpu_hour="2.5"
    )
    a100 = GpuModel.objects.create(
        name="A100-80GB", product_name="NVIDIA A100-SXM4-80GB", memory_mib=81920, price_per_gpu_hour="1.5"
    )
    servers = Server.objects.bulk_create(
        [Server(hostname=f"bench-{n:04d}", state="ready") for n in range((gpus + 7) // GPUS_PER_SERVER)]
    )
    server_model = [a100 if n % 4 == 3 else h100 for n in range(len(servers))]
    Gpu.objects.bulk_create(
        [
            Gpu(
                server=servers[i // GPUS_PER_SERVER],
                uuid=f"GPU-bench-{i:05d}",
                index=i % GPUS_PER_SERVER,
                model=server_model[i // GPUS_PER_SERVER],
                product_name=server_model[i // GPUS_PER_SERVER].product_name,
                memory_mib=81920,
            )
            for i in range(gpus)
        ],
        batch_size=2000,
    )
    users = get_user_model().objects.bulk_create(
        [get_user_model()(username=f"bench-user-{i:04d}") for i in range(projects * 3)]
    )
    projs = Project.objects.bulk_create(
        [Project(name=f"Bench {i:03d}", slug=f"bench-{i:03d}") for i in range(projects)]
    )
    Membership.objects.bulk_create(
        [Membership(project=p, user=users[i * 3 + k]) for i, p in enumerate(projs) for k in range(3)]
    )

    # One reservation per held server-week, hour-aligned.
    blocks = []  # (server index, project index, user index, start hour, end hour)
    for s in range(len(servers)):
        for week in range((hours + HOURS_PER_WEEK - 1) // HOURS_PER_WEEK):
            if rng.random() >= HELD_WEEK_PROBABILITY:
                continue
            p = 0 if rng.random() < share else rng.randrange(1, projects)
            lo = week * HOURS_PER_WEEK + rng.randrange(0, 24)
            hi = min((week + 1) * HOURS_PER_WEEK - rng.randrange(0, 36), hours)
            if hi - lo >= 2:
                blocks.append((s, p, p * 3 + rng.randrange(3), lo, hi))
    reservations = Reservation.objects.bulk_create(
        [
            Reservation(
                project=projs[p],
                created_by=users[u],
                name=f"week-{lo // HOURS_PER_WEEK}",
                gpu_model=server_model[s],
                gpu_count=GPUS_PER_SERVER,
                starts_at=START + timedelta(hours=lo),
                ends_at=START + timedelta(hours=hi),
                image="bench",
                state="completed",
            )
            for s, p, u, lo, hi in blocks
        ],
        batch_size=2000,
    )
    print(f"  {len(reservations):,} reservations over {len(servers)} servers in {time.monotonic() - t0:.0f} s")

    with connection.cursor() as cur:
        # The rows are consistent by construction; checking ~70 million foreign keys would be most of the load.
        cur.execute("SET session_replication_role = replica")
        cur.execute("SET maintenance_work_mem = '512MB'")
        cur.execute("SET work_mem = '256MB'")
        cur.execute(
            "CREATE TEMP TABLE bench_block AS SELECT * FROM unnest("
            "%s::bigint[], %s::int[], %s::bigint[], %s::bigint[], %s::bigint[], %s::int[], %s::int[]) "
            "AS t(reservation_id, server_idx, project_id, user_id, gpu_model_id, start_h, end_h)",
            [
                [r.pk for r in reservations],
                [b[0] for b in blocks],
                [projs[b[1]].pk for b in blocks],
                [users[b[2]].pk for b in blocks],
                [server_model[b[0]].pk for b in blocks],
                [b[3] for b in blocks],
                [b[4] for b in blocks],
            ],
        )
        cur.execute(
            "CREATE TEMP TABLE bench_gpu AS SELECT g.id AS gpu_id, g.model_id AS gpu_model_id,"
            " (row_number() OVER (ORDER BY g.id) - 1) / %s AS server_idx FROM inventory_gpu g",
            [GPUS_PER_SERVER],
        )
        cur.execute("ALTER TABLE bench_block ADD COLUMN week int")
        cur.execute("UPDATE bench_block SET week = start_h / %s", [HOURS_PER_WEEK])
        cur.execute("ANALYZE bench_block; ANALYZE bench_gpu")

        # Usage records: one per reservation x GPU; used seconds and money are summed from the slices below.
        cur.execute(
            "INSERT INTO accounting_usagerecord (reservation_id, gpu_id, project_id, user_id, gpu_model_id,"
            " booked_start, booked_end, started_at, finished_at, measured, booked_s, gpu_seconds, credits, cost,"
            " currency, created_at) "
            "SELECT b.reservation_id, g.gpu_id, b.project_id, b.user_id, b.gpu_model_id,"
            " %(t0)s::timestamptz + b.start_h * interval '1 hour', %(t0)s::timestamptz + b.end_h * interval '1 hour',"
            " %(t0)s::timestamptz + b.start_h * interval '1 hour', %(t0)s::timestamptz + b.end_h * interval '1 hour',"
            " true, (b.end_h - b.start_h) * 3600, 0, 0, 0, 'USD', %(t0)s::timestamptz + b.end_h * interval '1 hour' "
            "FROM bench_block b JOIN bench_gpu g ON g.server_idx = b.server_idx ORDER BY b.end_h, b.reservation_id",
            {"t0": START},
        )

        restore = {table: _drop_secondary_indexes(cur, table) for table in BIG_TABLES}
        months = [(m * hours // 12, (m + 1) * hours // 12) for m in range(12)] if days >= 60 else [(0, hours)]
        t1 = time.monotonic()
        for lo, hi in months:
            # Rollups are written hour by hour for every GPU, held or not. Utilization follows the reservation
            # with some noise; one held hour in 23 is idle; an unheld GPU draws idle power.
            cur.execute(
                "INSERT INTO accounting_gpuusagehour (gpu_id, hour, gpu_model_id, project_id, reservation_id,"
                " user_id, minutes, util_minutes, util_mean, util_max, fb_used_max_mib, power_mean_w, energy_wh,"
                " energy_from_counter, held_s, idle_s) "
                "SELECT gpu_id, %s::timestamptz + h * interval '1 hour', gpu_model_id, project_id, reservation_id,"
                " user_id, 60, 60, util, LEAST(util + 9, 100), CASE WHEN held THEN 30000 + util * 400 ELSE 0 END,"
                " 60 + util * 6, 60 + util * 6, true, CASE WHEN held THEN 3600 ELSE 0 END,"
                " CASE WHEN held AND util < 5 THEN 3600 ELSE 0 END "
                "FROM (SELECT g.gpu_id, g.gpu_model_id, h, b.project_id, b.reservation_id, b.user_id,"
                "  b.reservation_id IS NOT NULL AS held,"
                "  CASE WHEN b.reservation_id IS NULL THEN 0"
                "   WHEN (h * 31 + g.gpu_id * 17) %% 23 = 0 THEN 1"
                "   ELSE LEAST(GREATEST(25 + b.reservation_id * 37 %% 70 + (g.gpu_id * 7 + h * 13) %% 21 - 10, 0), 100)"
                "  END AS util"
                " FROM generate_series(%s::int, %s::int - 1) AS h CROSS JOIN bench_gpu g"
                " LEFT JOIN bench_block b ON b.server_idx = g.server_idx AND b.week = h / %s"
                "  AND h >= b.start_h AND h < b.end_h"
                " ORDER BY h, g.gpu_id) AS t",
                [START, lo, hi, HOURS_PER_WEEK],
            )
            # Slices are written when a reservation is settled, all its hours at once. A container starts a
            # few minutes into its first hour and stops a little before the end of its last.
            cur.execute(
                "INSERT INTO accounting_usageslice (record_id, hour, project_id, reservation_id, user_id,"
                " gpu_model_id, booked_s, used_s, credits, cost, currency) "
                "SELECT record_id, %s::timestamptz + h * interval '1 hour', project_id, reservation_id, user_id,"
                " gpu_model_id, 3600, used, round(used / 3600.0, 4), round(used / 3600.0 * price, 4), 'USD' "
                "FROM (SELECT r.id AS record_id, h, b.project_id, b.reservation_id, b.user_id, b.gpu_model_id,"
                "  m.price_per_gpu_hour AS price,"
                "  CASE WHEN h = b.start_h THEN 3600 - 60 - (r.id * 37) %% 600"
                "   WHEN h = b.end_h - 1 THEN 3600 - 120 - (r.id * 53) %% 900 ELSE 3600 END AS used"
                " FROM bench_block b JOIN accounting_usagerecord r ON r.reservation_id = b.reservation_id"
                " JOIN inventory_gpumodel m ON m.id = b.gpu_model_id"
                " CROSS JOIN LATERAL generate_series(b.start_h, b.end_h - 1) AS h"
                " WHERE b.end_h > %s AND b.end_h <= %s"
                " ORDER BY b.end_h, r.id, h) AS t",
                [START, lo, hi],
            )
            print(f"  hours {lo:>5}-{hi:<5} written, {time.monotonic() - t1:4.0f} s", flush=True)
        t1 = time.monotonic()
        for statements in restore.values():
            for sql in statements:
                cur.execute(sql)
        print(f"  indexes built in {time.monotonic() - t1:.0f} s")
        cur.execute(
            "UPDATE accounting_usagerecord r SET gpu_seconds = s.used, credits = s.credits, cost = s.cost "
            "FROM (SELECT record_id, SUM(used_s) AS used, SUM(credits) AS credits, SUM(cost) AS cost"
            " FROM accounting_usageslice GROUP BY record_id) AS s WHERE s.record_id = r.id"
        )
        cur.execute("SET session_replication_role = DEFAULT")
        t1 = time.monotonic()
        for table in (*BIG_TABLES, "accounting_usagerecord", "reservations_reservation"):
            cur.execute(f"VACUUM ANALYZE {table}")
        print(f"  vacuumed and analyzed in {time.monotonic() - t1:.0f} s")
        cur.execute(f"UPDATE {MARKER} SET finished_at = now()")
    print(f"populated {gpus} GPUs x {days} days in {time.monotonic() - t0:.0f} s")


# The same figures as the report, straight from the tables: {group} is the grouping expression.
RAW_SQL = (
    "SELECT {group} AS g, currency, SUM(booked_s), SUM(used_s), SUM(credits), SUM(cost) FROM accounting_usageslice "
    "WHERE project_id = %(project)s AND hour >= %(start)s AND hour < %(end)s GROUP BY 1, currency",
    "SELECT {group} AS g, SUM(held_s), SUM(idle_s), SUM(energy_wh), SUM(util_minutes),"
    " SUM(util_mean * util_minutes::double precision) "
    "FROM accounting_gpuusagehour WHERE project_id = %(project)s AND hour >= %(start)s AND hour < %(end)s GROUP BY 1",
)
RAW_GROUP = {
    "user": "user_id",
    "gpu_model": "gpu_model_id",
    "reservation": "reservation_id",
    "day": "date_trunc('day', hour AT TIME ZONE 'UTC')",
}


def p95(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=20)[-1] if len(samples) >= 2 else samples[0]


def raw_totals(rows: list[list[tuple]]) -> tuple[float, float, Decimal, float]:
    slices, hours = rows
    return (
        round(sum(r[3] for r in slices) / 3600, 6),
        round(sum(r[1] for r in hours) / 3600, 6),
        sum((r[4] for r in slices), Decimal(0)).quantize(Decimal("0.0001")),
        float(sum(r[4] for r in hours)),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--projects", type=int, default=200)
    parser.add_argument("--share", type=float, default=0.05, help="share of held weeks the benchmarked project has")
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    if args.projects < 2 or not 0 < args.share < 1 or args.days < 1 or args.gpus < 1:
        raise SystemExit("need --projects >= 2, 0 < --share < 1, and at least one GPU and one day")
    params = {
        "version": DATA_VERSION,
        "gpus": args.gpus,
        "days": args.days,
        "projects": args.projects,
        "share": args.share,
    }

    url = os.environ.setdefault("DATABASE_URL", DEFAULT_URL)
    if not url.startswith(("postgres://", "postgresql://")):
        raise SystemExit("bench/report.py measures PostgreSQL: DATABASE_URL must point at one")
    t0 = time.monotonic()
    ready = prepare_database(url, params)
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from controlplane.accounting.models import GpuUsageHour, UsageSlice
    from controlplane.accounting.selectors import project_report
    from controlplane.accounts.models import Project

    call_command("migrate", verbosity=0)
    if ready:
        print("reusing the populated database")
    else:
        populate(gpus=args.gpus, days=args.days, projects=args.projects, share=args.share, params=params)
    with connection.cursor() as cur:
        for table in BIG_TABLES:
            cur.execute(
                "SELECT reltuples::bigint, pg_total_relation_size(oid) FROM pg_class WHERE oid = %s::regclass", [table]
            )
            count, size = cur.fetchone()
            print(f"  {table}: about {count:,} rows, {size / 2**30:.2f} GiB with indexes")

    project = Project.objects.get(slug="bench-000")
    # March when the data covers it, else the first month (or what there is of it).
    start = datetime(2025, 3, 1, tzinfo=UTC) if args.days >= 90 else START
    end = datetime(2025, 4, 1, tzinfo=UTC) if args.days >= 90 else START + timedelta(days=min(args.days, 31))
    in_range = {"project_id": project.pk, "hour__gte": start, "hour__lt": end}
    print(
        f"project {project.slug}, {start:%Y-%m-%d} to {end:%Y-%m-%d}: "
        f"{GpuUsageHour.objects.filter(**in_range).count():,} hourly rollups, "
        f"{UsageSlice.objects.filter(**in_range).count():,} usage slices"
    )

    results = []
    failed = False
    for group_by in GROUP_BYS:
        sqls = [sql.format(group=RAW_GROUP[group_by]) for sql in RAW_SQL]
        report_ms, raw_ms = [], []
        for i in range(args.runs + 2):  # two warm-up rounds, not counted
            t = time.perf_counter()
            report = project_report(project=project, start=start, end=end, group_by=group_by)
            took = (time.perf_counter() - t) * 1000
            t = time.perf_counter()
            raw_rows = []
            with connection.cursor() as cur:
                for sql in sqls:
                    cur.execute(sql, {"project": project.pk, "start": start, "end": end})
                    raw_rows.append(cur.fetchall())
            raw = (time.perf_counter() - t) * 1000
            if i >= 2:
                report_ms.append(took)
                raw_ms.append(raw)
        total = report.total.as_dict()
        mine = (total["used_gpu_hours"], total["held_gpu_hours"], total["credits"], float(report.total.util_minutes))
        if mine != raw_totals(raw_rows) or len(report.rows) != len({r[0] for part in raw_rows for r in part}):
            print(f"  {group_by}: report and raw aggregate disagree: {mine} vs {raw_totals(raw_rows)}")
            failed = True
        results.append((group_by, len(report.rows), report_ms, raw_ms))
    print(
        f"  {total['used_gpu_hours']:,.0f} used and {total['held_gpu_hours']:,.0f} held GPU-hours, "
        f"{total['credits']} credits, utilization {total['util_mean_percent']} %"
    )

    print(
        f"\n{'group_by':<12}{'rows':>5}  {'report p50':>10} {'p95':>7}  {'raw p50':>8} {'p95':>7}  {'ratio':>6}  goal"
    )
    for group_by, nrows, report_ms, raw_ms in results:
        ratio = p95(report_ms) / max(p95(raw_ms), 1e-9)
        ok = p95(report_ms) < 500 and ratio <= 2.0
        failed |= not ok
        print(
            f"{group_by:<12}{nrows:>5}  {statistics.median(report_ms):8.1f}ms {p95(report_ms):5.1f}ms  "
            f"{statistics.median(raw_ms):6.1f}ms {p95(raw_ms):5.1f}ms  {ratio:5.2f}x  {'met' if ok else 'NOT met'}"
        )
    print(
        f"\ngoal (p95 < 500 ms and <= 2x raw, every group_by): {'NOT met' if failed else 'met'}; "
        f"bench took {time.monotonic() - t0:.0f} s"
    )
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
