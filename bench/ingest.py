"""Heartbeat ingest through the real HTTP stack, beside a raw PostgreSQL COPY of the same sample rows.

    .venv/bin/python bench/ingest.py [--servers 32] [--gpus 8] [--samples 5] [--seconds 20] [--workers 4]

DATABASE_URL (default postgres://postgres@127.0.0.1:5432/bench_ingest) must be PostgreSQL; the bench drops and
recreates that database, whose name must start with "bench".
Phase 1 enrolls the servers, starts gunicorn on a free 127.0.0.1 port and posts heartbeats concurrently (one
client thread per few servers, never two heartbeats of one server at once, as real agents do). Phase 2 COPYs the
same sample rows into a flat table: once in large batches (the ceiling for storing samples at all) and once per
heartbeat-sized batch with a commit each (what a naive per-sample store per heartbeat would cost). The figure
to watch is the API's GPU-samples per second against the large-batch COPY.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/bench_ingest"


def fresh_database(url: str) -> None:
    """The bench owns its database: dropped and made again, so every run starts from the same empty schema."""
    import psycopg

    parsed = urlparse(url)
    name = parsed.path.lstrip("/")
    if not name.startswith("bench"):
        raise SystemExit(f"refusing to drop {name!r}: the bench database's name must start with 'bench'")
    admin = parsed._replace(path="/postgres", scheme="postgresql").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(port: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    import requests

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"gunicorn exited with {proc.returncode}")
        try:
            if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            time.sleep(0.2)
    raise SystemExit("gunicorn did not come up")


def sample_rows(hostname: str, gpus: int, samples: int, start: datetime, beat: int) -> list[tuple]:
    rows = []
    for g in range(gpus):
        for s in range(samples):
            ts = start + timedelta(seconds=s)
            rows.append(
                (
                    f"GPU-{hostname}-{g}",
                    ts,
                    float((beat + g + s) % 100),
                    1000.0 + g,
                    40.0 + (s % 5),
                    300.0 + g,
                    1e6 + beat * 5000.0 + s * 1000.0,
                )
            )
    return rows


def heartbeat_body(hostname: str, seq: int, gpus: int, rows: list[tuple]) -> bytes:
    from nodeagent import schema

    return json.dumps(
        {
            "schema_version": 1,
            "seq": seq,
            "sent_at": rows[-1][1].isoformat(),
            "node": {"hostname": hostname, "agent_version": "bench", "backend": "simulated", "simulated": True},
            "gpus": [
                {
                    "uuid": f"GPU-{hostname}-{g}",
                    "index": g,
                    "name": "NVIDIA H100 80GB HBM3",
                    "memory_total_mib": 81559,
                    "numa_node": g // 4,
                }
                for g in range(gpus)
            ],
            "samples": [
                {
                    "uuid": r[0],
                    "ts": r[1].isoformat(),
                    "fields": {
                        schema.GPU_UTIL: r[2],
                        schema.FB_USED: r[3],
                        schema.GPU_TEMP: r[4],
                        schema.POWER_USAGE: r[5],
                        schema.TOTAL_ENERGY: r[6],
                    },
                }
                for r in rows
            ],
        }
    ).encode()


def phase_api(args: argparse.Namespace, env: dict[str, str], credentials: dict[str, str]) -> dict[str, float]:
    import requests

    port = free_port()
    proc = subprocess.Popen(
        [
            str(ROOT / ".venv/bin/gunicorn"),
            "controlplane.wsgi:application",
            "-b",
            f"127.0.0.1:{port}",
            "-w",
            str(args.workers),
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=env,
    )
    try:
        wait_for(port, proc)
        url = f"http://127.0.0.1:{port}/api/v1/agent/heartbeat"
        hosts = sorted(credentials)
        t0 = datetime.now(UTC).replace(microsecond=0)
        lock = threading.Lock()
        totals = {"beats": 0, "samples": 0, "errors": 0, "latency": 0.0}
        deadline = time.monotonic() + args.seconds

        def client(mine: list[str]) -> None:
            session = requests.Session()
            beat = 0
            while time.monotonic() < deadline:
                beat += 1
                for host in mine:
                    rows = sample_rows(host, args.gpus, args.samples, t0 + timedelta(seconds=beat * args.samples), beat)
                    body = heartbeat_body(host, beat, args.gpus, rows)
                    started = time.perf_counter()
                    r = session.post(
                        url,
                        data=body,
                        headers={"Authorization": f"Bearer {credentials[host]}", "Content-Type": "application/json"},
                        timeout=30,
                    )
                    elapsed = time.perf_counter() - started
                    with lock:
                        if r.status_code == 200:
                            totals["beats"] += 1
                            totals["samples"] += len(rows)
                            totals["latency"] += elapsed
                        else:
                            totals["errors"] += 1
                            if totals["errors"] < 3:
                                print("error", r.status_code, r.text[:300], file=sys.stderr)
                    if time.monotonic() >= deadline:
                        return

        threads = [threading.Thread(target=client, args=(hosts[i :: args.clients],)) for i in range(args.clients)]
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - started
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    beats = max(totals["beats"], 1)
    return {
        "beats": totals["beats"],
        "samples": totals["samples"],
        "errors": totals["errors"],
        "seconds": elapsed,
        "rate": totals["samples"] / elapsed,
        "latency_ms": 1000 * totals["latency"] / beats,
    }


def phase_copy(url: str, args: argparse.Namespace, batch: int, commit_each: bool) -> dict[str, float]:
    import psycopg

    t0 = datetime.now(UTC)
    per_beat = args.gpus * args.samples
    with psycopg.connect(url.replace("postgres://", "postgresql://", 1)) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_raw_samples")
        conn.execute(
            "CREATE TABLE bench_raw_samples (gpu_uuid text NOT NULL, ts timestamptz NOT NULL, util real, "
            "fb_used real, temp real, power real, energy double precision)"
        )
        conn.commit()
        rows_written = 0
        beat = 0
        deadline = time.monotonic() + args.seconds
        started = time.monotonic()
        while time.monotonic() < deadline:
            pending: list[tuple] = []
            while len(pending) < batch:
                beat += 1
                pending.extend(
                    sample_rows(
                        f"node-{beat % args.servers}",
                        args.gpus,
                        args.samples,
                        t0 + timedelta(seconds=beat * args.samples),
                        beat,
                    )
                )
            with conn.cursor() as cur, cur.copy("COPY bench_raw_samples FROM STDIN") as copy:
                for row in pending:
                    copy.write_row(row)
            if commit_each:
                conn.commit()
            rows_written += len(pending)
        conn.commit()
        elapsed = time.monotonic() - started
        conn.execute("DROP TABLE bench_raw_samples")
        conn.commit()
    return {"samples": rows_written, "seconds": elapsed, "rate": rows_written / elapsed, "batch": batch or per_beat}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", type=int, default=32)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--samples", type=int, default=5, help="1 Hz samples per GPU per heartbeat")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    parser.add_argument("--workers", type=int, default=max(2, os.cpu_count() or 2), help="gunicorn workers")
    parser.add_argument("--clients", type=int, default=16, help="concurrent client threads")
    args = parser.parse_args()

    url = os.environ.get("DATABASE_URL") or DEFAULT_URL
    if not url.startswith(("postgres://", "postgresql://")):
        raise SystemExit("bench/ingest.py measures PostgreSQL: set DATABASE_URL to a postgres:// URL")
    fresh_database(url)
    var_dir = tempfile.mkdtemp(prefix="bench-ingest-")
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "CONTROLPLANE_VAR_DIR": var_dir,
        "LOG_LEVEL": "WARNING",
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "PYTHONPATH": str(ROOT),
    }
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))

    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from controlplane.fleet import services
    from controlplane.fleet.models import GpuTelemetryMinute

    credentials = {}
    for i in range(args.servers):
        _, plaintext = services.join_token_create(actor=None, note="bench")
        server, credential = services.agent_enroll(join_token=plaintext, hostname=f"bench-{i:03d}", simulated=True)
        credentials[server.hostname] = credential
    from django.db import connection

    connection.close()

    per_beat = args.gpus * args.samples
    print(
        f"heartbeat batch: {args.gpus} GPUs x {args.samples} samples = {per_beat} GPU-samples; "
        f"{args.servers} servers, {args.clients} client threads, {args.workers} gunicorn workers, "
        f"{args.seconds:g} s per phase",
        flush=True,
    )
    api = phase_api(args, env, credentials)
    minutes = GpuTelemetryMinute.objects.filter(gpu__server__hostname__startswith="bench-").count()
    connection.close()
    copy_big = phase_copy(url, args, batch=10_000, commit_each=False)
    copy_beat = phase_copy(url, args, batch=per_beat, commit_each=True)

    ratio = api["rate"] / copy_big["rate"] if copy_big["rate"] else 0.0
    print()
    print(f"{'path':<44} {'GPU-samples':>12} {'seconds':>8} {'samples/s':>11}")
    print(
        f"{'API: POST /agent/heartbeat (gunicorn)':<44} {api['samples']:>12,.0f} {api['seconds']:>8.1f} "
        f"{api['rate']:>11,.0f}"
    )
    print(
        f"{'raw COPY, 10k-row batches (baseline)':<44} {copy_big['samples']:>12,.0f} {copy_big['seconds']:>8.1f} "
        f"{copy_big['rate']:>11,.0f}"
    )
    print(
        f"{f'raw COPY, {per_beat}-row batch + commit each':<44} {copy_beat['samples']:>12,.0f} "
        f"{copy_beat['seconds']:>8.1f} {copy_beat['rate']:>11,.0f}"
    )
    print()
    print(
        f"heartbeats: {api['beats']:,.0f} ok, {api['errors']:,.0f} errors, mean latency {api['latency_ms']:.1f} ms; "
        f"minute rows written: {minutes:,}"
    )
    print(f"API / raw COPY = {ratio:.1%} (goal >= 10%)")
    print(f"API / per-heartbeat COPY = {api['rate'] / copy_beat['rate']:.1%}" if copy_beat["rate"] else "")


if __name__ == "__main__":
    main()
