"""The production topology at one and at two web processes (and one and two Celery workers) against one
PostgreSQL: the measured gain from one to two beside the gain the figures of the one-process run predict.

    .venv/bin/python bench/topology.py [--seconds 8] [--threads 4] [--servers 64] [--tasks 400] [--repeat 1]

DATABASE_URL (default postgres://postgres@127.0.0.1:5432/bench_topology) must be PostgreSQL; the bench drops and
recreates that database, whose name must start with "bench". REDIS_URL must name the Redis (and its database)
the Celery phase may use as its broker; its queue is emptied first.

Web: gunicorn as deployed (gthread, ``--threads`` threads per process, keep-alive) with 1 and then 2 processes.
On each, three loads one after the other, each for ``--seconds``: 8 GPUs' 5 s heartbeats from ``--servers``
nodes (16 keep-alive clients), GET /api/v1/me/ (the token-authenticated floor, 8 clients) and bookings
(POST /api/v1/reservations/, 8 clients, each in its own project, as bench/booking.py books). For each: requests
per second, p50/p99, and the CPU that gunicorn, PostgreSQL and the whole machine used (from /proc).

Celery: ``--tasks`` real tasks (``record_usage`` of the booked reservations: a locked read of the reservation
and its usage) published first, then drained by 1 and then 2 worker processes (prefork, concurrency 1 each);
tasks per second from the first to the last.

CPU per request: each request kind sent in-process (Django's test client, one thread, no HTTP) ``--cost``
times; the CPU the Python process and its PostgreSQL backend used per request. CPU time, unlike a rate, is
hardly moved by what else the machine runs, so the sizing table (docs/operations.md, "Sizing") is built
from it, and printed at the end for 100, 1,000 and 10,000 servers.

The prediction: a web process is one Python interpreter, so it uses at most about one core; a second one adds
what the machine had idle during the one-process run, up to one more process's worth:
``predicted gain = min(2, 1 + idle cores / gunicorn's cores)``, and PostgreSQL's share of the machine grows with
the rate. On a 2-core machine that also runs the load generator and PostgreSQL the gain is bounded well below 2;
the figures say by how much.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _common import ROOT, django_on_fresh_database, http_floor, pct, process_tree_cpu, run_threads, start_gunicorn

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/bench_topology"
GPUS = 8
MODEL = "A100-80GB"


def machine_cpu() -> tuple[float, float]:
    """(busy, idle) CPU seconds of the whole machine so far, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    clock = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / clock, idle / clock


def postgres_cpu(url: str) -> dict[int, float]:
    """CPU seconds so far of each PostgreSQL backend serving the bench's database (none when PostgreSQL runs
    on another machine): other databases' backends on a shared server are not the bench's."""
    import psycopg

    clock = os.sysconf("SC_CLK_TCK")
    with psycopg.connect(url.replace("postgres://", "postgresql://", 1), autocommit=True) as conn:
        pids = [row[0] for row in conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")]
        own = conn.info.backend_pid
    out = {}
    for pid in pids:
        if pid == own:
            continue
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[pid] = (int(fields[11]) + int(fields[12])) / clock
    return out


def measured(web_pid: int, url: str, load: Callable[[], dict[str, float]]) -> dict[str, float]:
    """Run ``load`` and add the cores gunicorn, PostgreSQL and the machine used, and the machine's idle cores."""
    web0, pg0, (busy0, idle0), t0 = process_tree_cpu(web_pid), postgres_cpu(url), machine_cpu(), time.monotonic()
    result = load()
    seconds = time.monotonic() - t0
    busy1, idle1 = machine_cpu()
    pg1 = postgres_cpu(url)  # a backend that started during the load started from 0
    return {
        **result,
        "web_cores": (process_tree_cpu(web_pid) - web0) / seconds,
        "pg_cores": sum(cpu - pg0.get(pid, 0.0) for pid, cpu in pg1.items()) / seconds,
        "busy_cores": (busy1 - busy0) / seconds,
        "idle_cores": (idle1 - idle0) / seconds,
    }


def heartbeats(port: int, credentials: dict[str, str], clock: dict[str, datetime], seconds: float) -> dict[str, float]:
    sys.path.insert(0, str(ROOT / "bench"))
    from ingest import heartbeat_body, sample_rows

    hosts = sorted(credentials)
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def client(mine: list[str]) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        done: list[float] = []
        while time.monotonic() < deadline:
            for host in mine:
                start = clock[host]
                clock[host] = start + timedelta(seconds=5)
                beat = int(start.timestamp())
                body = heartbeat_body(host, beat, GPUS, sample_rows(host, GPUS, 5, start, beat))
                headers = {"Authorization": f"Bearer {credentials[host]}", "Content-Type": "application/json"}
                t0 = time.perf_counter()
                conn.request("POST", "/api/v1/agent/heartbeat", body=body, headers=headers)
                response = conn.getresponse()
                response.read()
                if response.status == 200:
                    done.append(time.perf_counter() - t0)
                else:
                    with lock:
                        errors[0] += 1
                if time.monotonic() >= deadline:
                    break
        conn.close()
        with lock:
            latencies.extend(done)

    elapsed = run_threads(client, [(hosts[i::16],) for i in range(16) if hosts[i::16]])
    return {
        "rate": len(latencies) / elapsed,
        "p50": 1000 * pct(latencies, 0.5),
        "p99": 1000 * pct(latencies, 0.99),
        "failures": errors[0],
    }


def bookings(port: int, token: str, slugs: list[str], seconds: float) -> dict[str, float]:
    latencies: list[float] = []
    counts = {"created": 0, "other": 0}
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def client(n: int) -> None:
        rng = random.Random(f"{n}-{time.monotonic()}")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        while time.monotonic() < deadline:
            start = datetime.now(UTC) + timedelta(minutes=rng.randint(5, 30 * 24 * 60))
            body = {
                "project": slugs[n],
                "name": "bench",
                "spec": {"gpu_model": MODEL, "gpu_count": rng.choice([1, 2, 4, 8])},
                "window": {
                    "start": start.isoformat(),
                    "end": (start + timedelta(minutes=rng.randint(60, 240))).isoformat(),
                },
                "container": {"image": "bench:1", "command": ["sleep", "1"]},
            }
            t0 = time.perf_counter()
            conn.request("POST", "/api/v1/reservations/", body=json.dumps(body), headers=headers)
            response = conn.getresponse()
            response.read()
            elapsed = time.perf_counter() - t0
            with lock:
                if response.status == 201:
                    counts["created"] += 1
                    latencies.append(elapsed)
                else:
                    counts["other"] += 1
        conn.close()

    elapsed = run_threads(client, [(i,) for i in range(len(slugs))])
    return {
        "rate": counts["created"] / elapsed,
        "p50": 1000 * pct(latencies, 0.5),
        "p99": 1000 * pct(latencies, 0.99),
        "failures": counts["other"],
    }


def phase_web(
    env: dict[str, str], processes: int, args: argparse.Namespace, fixture: dict[str, Any]
) -> dict[str, dict[str, float]]:
    proc, port = start_gunicorn(env, workers=processes, threads=args.threads)
    try:
        me = {"Authorization": f"Bearer {fixture['token']}"}
        url, seconds = env["DATABASE_URL"], args.seconds
        return {
            "heartbeat": measured(
                proc.pid, url, lambda: heartbeats(port, fixture["credentials"], fixture["clock"], seconds)
            ),
            "me": measured(
                proc.pid, url, lambda: http_floor(port, path="/api/v1/me/", clients=8, seconds=seconds, headers=me)
            ),
            "booking": measured(
                proc.pid,
                env["DATABASE_URL"],
                lambda: bookings(port, fixture["token"], fixture["slugs"], args.seconds),
            ),
        }
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def phase_celery(env: dict[str, str], processes: int, reservation_ids: list[int]) -> dict[str, float]:
    """Publish one ``record_usage`` per reservation, then time ``processes`` workers draining them."""
    import redis

    from controlplane.accounting.tasks import record_usage

    client = redis.Redis.from_url(env["REDIS_URL"])
    client.delete("celery", "unacked", "unacked_index")
    for rid in reservation_ids:
        record_usage.delay(rid)
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--pool", "prefork", "--concurrency", "1",
             "--without-heartbeat", "--without-gossip", "--without-mingle", "--loglevel", "WARNING",
             "--hostname", f"bench{n}@%h"],
            cwd=ROOT,
            env=env,
        )
        for n in range(processes)
    ]  # fmt: skip
    try:
        # The clock starts at the first task taken, so the workers' start-up is not what is measured.
        total = len(reservation_ids)
        deadline = time.monotonic() + 300
        while client.llen("celery") >= total and time.monotonic() < deadline:
            time.sleep(0.01)
        t0 = time.monotonic()
        cpu0 = sum(process_tree_cpu(w.pid) for w in workers)
        while (client.llen("celery") or client.hlen("unacked")) and time.monotonic() < deadline:
            time.sleep(0.01)
        seconds = time.monotonic() - t0
        cores = (sum(process_tree_cpu(w.pid) for w in workers) - cpu0) / seconds
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait(timeout=60)
    return {"rate": total / seconds, "seconds": seconds, "worker_cores": cores}


def setup(args: argparse.Namespace) -> tuple[dict[str, str], dict[str, Any]]:
    _, env = django_on_fresh_database("topology", DEFAULT_URL, API_THROTTLE_USER="10000000/min")
    if not env.get("REDIS_URL"):
        raise SystemExit("bench/topology.py needs REDIS_URL (Celery's broker, as in production)")
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection

    from controlplane.accounts.choices import Role
    from controlplane.accounts.models import ApiToken, Membership, Project
    from controlplane.core import tokens
    from controlplane.fleet import services
    from controlplane.ledger.services import ledger_grant

    sys.path.insert(0, str(ROOT / "bench"))
    from booking import build_fleet

    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user(username="bench", password="bench-only")
    projects = [Project.objects.create(name=f"Bench {i}", slug=f"bench-{i}") for i in range(8)]
    for project in projects:
        Membership.objects.create(project=project, user=user, role=Role.OWNER)
        ledger_grant(project=project, amount=10**9, actor=None, reason="bench credits")
    issued = tokens.issue(tokens.USER_TOKEN)
    ApiToken.objects.create(user=user, name="bench", lookup=issued.lookup, digest=issued.digest)
    build_fleet(MODEL, 64, GPUS, "api")
    credentials = {}
    for i in range(args.servers):
        _, join = services.join_token_create(actor=None, note="bench")
        server, credential = services.agent_enroll(join_token=join, hostname=f"node-{i:03d}", simulated=True)
        credentials[server.hostname] = credential
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    connection.close()
    now = datetime.now(UTC).replace(microsecond=0)
    return env, {
        "token": issued.plaintext,
        "slugs": [p.slug for p in projects],
        "credentials": credentials,
        "clock": {host: now for host in credentials},
    }


def backend_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def phase_cost(fixture: dict[str, Any], n: int) -> dict[str, tuple[float, float]]:
    """(web ms, PostgreSQL ms) of CPU per request of each kind, in-process, one request at a time."""
    from django.db import connection
    from django.test import Client
    from ingest import heartbeat_body, sample_rows

    host = sorted(fixture["credentials"])[0]
    agent = Client(HTTP_AUTHORIZATION=f"Bearer {fixture['credentials'][host]}")
    user = Client(HTTP_AUTHORIZATION=f"Bearer {fixture['token']}")
    clock = fixture["clock"]
    rng = random.Random(5)

    def heartbeat() -> None:
        start = clock[host]
        clock[host] = start + timedelta(seconds=5)
        beat = int(start.timestamp())
        body = heartbeat_body(host, beat, GPUS, sample_rows(host, GPUS, 5, start, beat))
        assert agent.post("/api/v1/agent/heartbeat", body, content_type="application/json").status_code == 200

    def me() -> None:
        assert user.get("/api/v1/me/").status_code == 200

    def booking() -> None:
        start = datetime.now(UTC) + timedelta(minutes=rng.randint(5, 30 * 24 * 60))
        body = {
            "project": fixture["slugs"][0],
            "name": "bench",
            "spec": {"gpu_model": MODEL, "gpu_count": rng.choice([1, 2, 4, 8])},
            "window": {"start": start.isoformat(), "end": (start + timedelta(hours=rng.randint(1, 4))).isoformat()},
            "container": {"image": "bench:1", "command": ["sleep", "1"]},
        }
        assert user.post("/api/v1/reservations/", body, content_type="application/json").status_code in (201, 409)

    out = {}
    for name, call in (("heartbeat", heartbeat), ("me", me), ("booking", booking)):
        for _ in range(20):  # connection, prepared statements, caches
            call()
        pid = connection.connection.info.backend_pid
        web0, pg0 = time.process_time(), backend_cpu(pid)
        for _ in range(n):
            call()
        out[name] = (1000 * (time.process_time() - web0) / n, 1000 * (backend_cpu(pid) - pg0) / n)
    connection.close()
    return out


def sizing(cost: dict[str, tuple[float, float]], celery_rate: float) -> None:
    """Cores for 100, 1,000 and 10,000 servers of 8 GPUs at the agent's 5 s cadence, at 60% utilisation."""
    web_ms, pg_ms = cost["heartbeat"]
    book_web, book_pg = cost["booking"]
    print()
    print("sizing at 60% utilisation, 8 GPUs a server, heartbeats every 5 s, one booking a second per 1,000 servers:")
    print(f"{'servers':>8} {'beats/s':>8} {'web cores':>9} {'PG cores':>8} {'minute rows/day':>15}")
    for servers in (100, 1_000, 10_000):
        beats = servers / 5
        bookings = servers / 1000
        web = (beats * web_ms + bookings * book_web) / 1000 / 0.6
        pg = (beats * pg_ms + bookings * book_pg) / 1000 / 0.6
        print(f"{servers:>8,} {beats:>8,.0f} {web:>9.1f} {pg:>8.1f} {servers * 8 * 1440:>15,}")
    print(f"Celery: {celery_rate:,.0f} record_usage tasks/s per worker process measured here")


def predicted(one: dict[str, float]) -> float:
    return min(2.0, 1.0 + one["idle_cores"] / one["web_cores"]) if one["web_cores"] else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each load")
    parser.add_argument("--threads", type=int, default=4, help="threads per gunicorn process (gthread)")
    parser.add_argument("--servers", type=int, default=64, help="enrolled nodes sending heartbeats")
    parser.add_argument("--tasks", type=int, default=400, help="Celery tasks per Celery run")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each configuration (medians reported)")
    parser.add_argument("--cost", type=int, default=300, help="in-process requests of each kind for CPU per request")
    parser.add_argument("--cost-only", action="store_true", help="only the CPU per request and the sizing table")
    args = parser.parse_args()

    env, fixture = setup(args)
    cost = phase_cost(fixture, args.cost)
    if args.cost_only:
        for name, (web_ms, pg_ms) in cost.items():
            print(f"  {name:<10} web {web_ms:5.2f} ms, PostgreSQL backend {pg_ms:5.2f} ms")
        sizing(cost, float("nan"))
        return
    print(
        f"{os.cpu_count()} CPUs; gunicorn gthread x {args.threads} threads; {args.servers} nodes x {GPUS} GPUs; "
        f"{args.seconds:g} s per load; {args.repeat} run(s) of each; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    web: dict[int, list[dict[str, dict[str, float]]]] = {1: [], 2: []}
    for _ in range(args.repeat):
        for processes in (1, 2):  # alternated, so a change in the machine's other load falls on both
            web[processes].append(phase_web(env, processes, args, fixture))
            print(f"web, {processes} process(es): done; load average {os.getloadavg()[0]:.2f}", flush=True)

    from controlplane.reservations.models import Reservation

    ids = list(Reservation.objects.order_by("id").values_list("id", flat=True)[: 2 * args.tasks * args.repeat])
    celery: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    chunks = iter([ids[i : i + args.tasks] for i in range(0, len(ids), args.tasks)])
    for _ in range(args.repeat):
        for processes in (1, 2):
            chunk = next(chunks, ids[: args.tasks])
            celery[processes].append(phase_celery(env, processes, chunk))
            print(f"celery, {processes} worker(s): done", flush=True)

    def median(values: list[float]) -> float:
        ordered = sorted(values)
        return ordered[len(ordered) // 2] if len(ordered) % 2 else sum(ordered[len(ordered) // 2 - 1 :][:2]) / 2

    def med(processes: int, load: str, key: str) -> float:
        return median([run[load][key] for run in web[processes]])

    print()
    print(
        f"{'load':<34} {'procs':>5} {'per s':>8} {'p50 ms':>7} {'p99 ms':>7} {'web cores':>9} {'PG cores':>8} "
        f"{'busy':>5} {'idle':>5} {'per web core':>12} {'gain':>6} {'predicted':>9}"
    )
    labels = {
        "heartbeat": "POST heartbeat (8 GPUs x 5 s)",
        "me": "GET /api/v1/me/ (token floor)",
        "booking": "POST /api/v1/reservations/",
    }
    for load, label in labels.items():
        one = {k: med(1, load, k) for k in web[1][0][load]}
        for processes in (1, 2):
            row = {k: med(processes, load, k) for k in web[processes][0][load]}
            gain = f"{row['rate'] / one['rate']:.2f}x" if processes == 2 and one["rate"] else ""
            guess = f"{predicted(one):.2f}x" if processes == 2 else ""
            print(
                f"{label:<34} {processes:>5} {row['rate']:>8,.1f} {row['p50']:>7.1f} {row['p99']:>7.1f} "
                f"{row['web_cores']:>9.2f} {row['pg_cores']:>8.2f} {row['busy_cores']:>5.2f} "
                f"{row['idle_cores']:>5.2f} {row['rate'] / row['web_cores'] if row['web_cores'] else 0:>12,.1f} "
                f"{gain:>6} {guess:>9}"
            )
    for processes in (1, 2):
        hb = {k: med(processes, "heartbeat", k) for k in web[processes][0]["heartbeat"]}
        bk = {k: med(processes, "booking", k) for k in web[processes][0]["booking"]}
        print(
            f"  {processes} process(es): {hb['rate'] * 5 / hb['web_cores']:,.0f} nodes per web core at 5 s, "
            f"{hb['rate'] * 5 / hb['pg_cores'] if hb['pg_cores'] else float('nan'):,.0f} per PostgreSQL core; "
            f"{bk['rate'] / bk['web_cores']:,.1f} bookings/s per web core, "
            f"{bk['rate'] / bk['pg_cores'] if bk['pg_cores'] else float('nan'):,.1f} per PostgreSQL core"
        )
    print()
    one_c = median([r["rate"] for r in celery[1]])
    for processes in (1, 2):
        rate = median([r["rate"] for r in celery[processes]])
        cores = median([r["worker_cores"] for r in celery[processes]])
        gain = f"gain {rate / one_c:.2f}x" if processes == 2 else ""
        print(f"Celery, {processes} worker process(es): {rate:,.0f} record_usage tasks/s, {cores:.2f} cores {gain}")
    print()
    print("CPU per request, in-process, one at a time (ms of a core):")
    for load, label in labels.items():
        web_ms, pg_ms = cost[load]
        print(f"  {label:<34} web {web_ms:5.2f} ms, PostgreSQL backend {pg_ms:5.2f} ms")
    sizing(cost, median([r["rate"] for r in celery[1]]))
    print()
    print(
        "gain: the 2-process rate over the 1-process rate (medians); predicted: min(2, 1 + idle cores / web cores) "
        "from the 1-process run. busy/idle: the whole machine's cores during the load, the load generator and "
        "other work on the machine included; PG cores: the backends serving this database. On a machine whose "
        "cores are all busy, a second process also takes CPU from the machine's other work: read the gain with "
        "the web cores beside it, and the per-core rate as what a dedicated core serves."
    )


if __name__ == "__main__":
    main()
