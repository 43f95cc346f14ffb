"""Heartbeat ingest through the real HTTP stack, beside a raw PostgreSQL COPY of the same sample rows.

    .venv/bin/python bench/ingest.py [--servers 32] [--gpus 8] [--seconds 15] [--workers 3] [--threads 4]
                                     [--clients 16] [--batches 5,30] [--wire 2]

DATABASE_URL (default postgres://postgres@127.0.0.1:5432/bench_ingest) must be PostgreSQL; the bench drops and
recreates that database, whose name must start with "bench".

The server is set up as in production: gunicorn with ``--workers`` processes of ``--threads`` threads each
(gthread, so HTTP keep-alive works; sync workers close every connection), Django on PostgreSQL with persistent
database connections. ``--servers`` enrolled nodes report through ``--clients`` client threads, each holding one
keep-alive connection and never sending two heartbeats of one server at once, as real agents do.

Each ``--batches`` entry is one configuration: seconds of 1 Hz samples per heartbeat. 5 is the agent's normal
cadence (8 GPUs x 5 s = 40 GPU-samples per heartbeat); 30 is what the agent sends after a short outage, when
its buffer drains. The clients build each body before the clock starts for that request, so the latency is the
server's; their CPU is reported, since on one machine it is taken from the server.

After the API runs, the stack's floors on the same web server, as fast as they answer: GET /healthz (the load
balancers' probe: Django's middleware and a check of the database, the cache and the broker) and GET /livez
(nothing but Django's middleware; no endpoint on this stack can take more requests per second). The heartbeat's
rate is read against both. The web server's own CPU (gunicorn's processes, from /proc) during each API run
gives the nodes one web core serves at the agent's 5 s cadence: heartbeats per second x 5 s / cores used.

The baseline, measured in the same run: PostgreSQL COPY of exactly the rows the API accepted, in 10,000-row
batches into an unindexed flat table, the rows encoded before the clock starts (the ceiling for storing
samples at all). The goal is API samples/s >= 10% of it.
"""

from __future__ import annotations

import argparse
import http.client
import os
import sys
import threading
import time
from datetime import UTC, datetime, timedelta

from _common import django_on_fresh_database, http_floor, pct, process_tree_cpu, run_threads, start_gunicorn

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/bench_ingest"
COPY_BATCH = 10_000
COPY_MIN_SECONDS = 3.0

Row = tuple[str, datetime, float, float, float, float, float]


def sample_rows(hostname: str, gpus: int, seconds: int, start: datetime, beat: int) -> list[Row]:
    """One heartbeat's 1 Hz samples: ``seconds`` readings of each of ``gpus`` GPUs from ``start``."""
    rows = []
    for g in range(gpus):
        for s in range(seconds):
            rows.append(
                (
                    f"GPU-{hostname}-{g}",
                    start + timedelta(seconds=s),
                    float((beat + g + s) % 100),
                    1000.0 + g,
                    40.0 + (s % 5),
                    300.0 + g,
                    1e6 + beat * 5000.0 + s * 1000.0,
                )
            )
    return rows


FIELDS = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
)  # the order of a Row's values


def heartbeat_body(hostname: str, seq: int, gpus: int, rows: list[Row], wire: int = 2) -> bytes:
    """The body the agent would send for these rows, built with the agent's wire models and serialised by them
    (``nodeagent.schema``): version 2 (one ``GpuSeries`` per GPU) as the agent sends, or 1 (one ``GpuSample``
    per reading) as older agents did."""
    from nodeagent import schema

    assert FIELDS == (schema.GPU_UTIL, schema.FB_USED, schema.GPU_TEMP, schema.POWER_USAGE, schema.TOTAL_ENERGY)
    common = {
        "seq": seq,
        "sent_at": rows[-1][1],
        "node": schema.NodeFacts(hostname=hostname, agent_version="bench", backend="simulated", simulated=True),
        "gpus": [
            schema.GpuFacts(
                uuid=f"GPU-{hostname}-{g}",
                index=g,
                name="NVIDIA H100 80GB HBM3",
                memory_total_mib=81559,
                numa_node=g // 4,
            )
            for g in range(gpus)
        ],
    }
    if wire == 1:
        samples = [schema.GpuSample(uuid=r[0], ts=r[1], fields=dict(zip(FIELDS, r[2:], strict=True))) for r in rows]
        return schema.HeartbeatV1(**common, samples=samples).model_dump_json().encode()
    per_gpu: dict[str, list[Row]] = {}
    for r in rows:
        per_gpu.setdefault(r[0], []).append(r)
    series = [
        schema.GpuSeries(
            uuid=uuid,
            ts=[r[1].timestamp() for r in readings],
            fields={name: [r[2 + i] for r in readings] for i, name in enumerate(FIELDS)},
        )
        for uuid, readings in per_gpu.items()
    ]
    return schema.Heartbeat(**common, samples=series).model_dump_json().encode()


def phase_api(
    args: argparse.Namespace, port: int, credentials: dict[str, str], batch_s: int, clock: dict[str, datetime]
) -> dict[str, object]:
    """Post heartbeats of ``batch_s`` seconds of samples for ``args.seconds``; returns figures and the rows."""
    hosts = sorted(credentials)
    lock = threading.Lock()
    latencies: list[float] = []
    accepted: list[list[Row]] = []
    errors = [0]
    deadline = time.monotonic() + args.seconds

    def client(mine: list[str]) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while time.monotonic() < deadline:
            for host in mine:
                # Each server's clock moves on by the batch it sends, so no sample is a replay of an earlier one.
                start = clock[host]
                clock[host] = start + timedelta(seconds=batch_s)
                beat = int(start.timestamp())
                rows = sample_rows(host, args.gpus, batch_s, start, beat)
                body = heartbeat_body(host, beat, args.gpus, rows, args.wire)
                headers = {"Authorization": f"Bearer {credentials[host]}", "Content-Type": "application/json"}
                started = time.perf_counter()
                conn.request("POST", "/api/v1/agent/heartbeat", body=body, headers=headers)
                response = conn.getresponse()
                text = response.read()
                elapsed = time.perf_counter() - started
                with lock:
                    if response.status == 200:
                        latencies.append(elapsed)
                        accepted.append(rows)
                    else:
                        errors[0] += 1
                        if errors[0] <= 3:
                            print("error", response.status, text[:300], file=sys.stderr)
                if time.monotonic() >= deadline:
                    break
        conn.close()

    # A client with no server would spin on an empty list and take the CPU from the server under test.
    shares = [hosts[i :: args.clients] for i in range(args.clients)]
    cpu0 = time.process_time()
    elapsed = run_threads(client, [(share,) for share in shares if share])
    client_cpu = time.process_time() - cpu0
    samples = sum(len(r) for r in accepted)
    return {
        "beats": len(latencies),
        "samples": samples,
        "errors": errors[0],
        "seconds": elapsed,
        "rate": samples / elapsed,
        "beat_rate": len(latencies) / elapsed,
        "p50_ms": 1000 * pct(latencies, 0.50),
        "p95_ms": 1000 * pct(latencies, 0.95),
        "p99_ms": 1000 * pct(latencies, 0.99),
        "client_cpu": client_cpu / elapsed,
        "rows": accepted,
    }


def warm_up(args: argparse.Namespace, port: int, credentials: dict[str, str], clock: dict[str, datetime]) -> None:
    """One heartbeat per server, so discovery (the first heartbeat's GPU inserts) is not what is measured."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for host, credential in sorted(credentials.items()):
        rows = sample_rows(host, args.gpus, 1, clock[host], 0)
        clock[host] += timedelta(seconds=1)
        headers = {"Authorization": f"Bearer {credential}", "Content-Type": "application/json"}
        body = heartbeat_body(host, 0, args.gpus, rows, args.wire)
        conn.request("POST", "/api/v1/agent/heartbeat", body=body, headers=headers)
        response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            raise SystemExit(f"warm-up heartbeat of {host} failed: {response.status} {body[:300]!r}")
    conn.close()


def _copy_text(value: object) -> str:
    return value.isoformat() if isinstance(value, datetime) else str(value)


def phase_copy(url: str, beats: list[list[Row]]) -> dict[str, float]:
    """COPY the same rows the API accepted, in 10k-row batches, repeated until the clock has a stable figure."""
    import psycopg

    rows = [row for beat in beats for row in beat]
    if not rows:
        return {"samples": 0, "seconds": 0.0, "rate": 0.0}
    # Encoded before the clock starts: the baseline is PostgreSQL storing rows, not Python formatting them.
    chunks = [
        "".join("\t".join(_copy_text(v) for v in row) + "\n" for row in rows[i : i + COPY_BATCH]).encode()
        for i in range(0, len(rows), COPY_BATCH)
    ]
    written = 0
    with psycopg.connect(url.replace("postgres://", "postgresql://", 1)) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_raw_samples")
        conn.execute(
            "CREATE TABLE bench_raw_samples (gpu_uuid text NOT NULL, ts timestamptz NOT NULL, util real, "
            "fb_used real, temp real, power real, energy double precision)"
        )
        conn.commit()
        started = time.monotonic()
        while True:
            for chunk, first in zip(chunks, range(0, len(rows), COPY_BATCH), strict=True):
                with conn.cursor() as cur, cur.copy("COPY bench_raw_samples FROM STDIN") as copy:
                    copy.write(chunk)
                conn.commit()
                written += min(COPY_BATCH, len(rows) - first)
            elapsed = time.monotonic() - started
            if elapsed >= COPY_MIN_SECONDS:
                break
        conn.execute("DROP TABLE bench_raw_samples")
        conn.commit()
    return {"samples": written, "seconds": elapsed, "rate": written / elapsed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", type=int, default=32)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--batches", default="5,30", help="seconds of 1 Hz samples per heartbeat, one run each")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of each API run")
    parser.add_argument("--workers", type=int, default=3, help="gunicorn worker processes")
    parser.add_argument("--threads", type=int, default=4, help="threads per gunicorn worker (gthread)")
    parser.add_argument("--clients", type=int, default=16, help="concurrent client threads (keep-alive each)")
    parser.add_argument(
        "--wire", type=int, choices=(1, 2), default=2, help="heartbeat wire version: 2 as the agent sends, 1 as older"
    )
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",") if b.strip()]

    url, env = django_on_fresh_database("ingest", DEFAULT_URL)
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    from controlplane.fleet import services

    credentials = {}
    for i in range(args.servers):
        _, plaintext = services.join_token_create(actor=None, note="bench")
        server, credential = services.agent_enroll(join_token=plaintext, hostname=f"bench-{i:03d}", simulated=True)
        credentials[server.hostname] = credential
    connection.close()

    print(
        f"{args.servers} servers x {args.gpus} GPUs; gunicorn gthread {args.workers} workers x {args.threads} "
        f"threads; {args.clients} keep-alive client threads; {args.seconds:g} s per API run; {os.cpu_count()} CPUs; "
        f"heartbeat wire version {args.wire}",
        flush=True,
    )
    now = datetime.now(UTC).replace(microsecond=0)
    clock = {host: now for host in credentials}
    results = []
    proc, port = start_gunicorn(env, workers=args.workers, threads=args.threads)
    try:
        # Discovery (the first heartbeat of each server) is not what is measured.
        warm_up(args, port, credentials, clock)
        for batch_s in batches:
            web0 = process_tree_cpu(proc.pid)
            api = phase_api(args, port, credentials, batch_s, clock)
            api["web_cores"] = (process_tree_cpu(proc.pid) - web0) / api["seconds"]  # type: ignore[operator]
            # Right after its API run, while the machine is in the same state; the web server is idle meanwhile.
            results.append((batch_s, api, phase_copy(url, api["rows"])))  # type: ignore[arg-type]
        # The stack's floors on the same server: the probe (/healthz) and nothing but the middleware (/livez).
        floors = {
            path: http_floor(port, path=path, clients=args.clients, seconds=min(args.seconds, 10.0))
            for path in ("/healthz", "/livez")
        }
    finally:
        proc.terminate()
        proc.wait(timeout=30)

    print()
    print(
        f"{'configuration':<60} {'samples/s':>10} {'beats/s':>8} {'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7} "
        f"{'vs COPY':>8} {'errors':>6} {'web CPU':>8} {'client CPU':>10}"
    )
    for batch_s, api, copy in results:
        per_beat = args.gpus * batch_s
        label = "normal, 5 s" if batch_s == 5 else ("after an outage" if batch_s > 5 else "short")
        name = f"API heartbeat, {batch_s} s x {args.gpus} GPUs = {per_beat} samples ({label})"
        ratio = api["rate"] / copy["rate"] if copy["rate"] else 0.0  # type: ignore[operator]
        print(
            f"{name:<60} {api['rate']:>10,.0f} {api['beat_rate']:>8,.1f} {api['p50_ms']:>7.1f} {api['p95_ms']:>7.1f} "
            f"{api['p99_ms']:>7.1f} {ratio:>8.1%} {api['errors']:>6} {api['web_cores']:>8.2f} "
            f"{api['client_cpu']:>9.0%}"
        )
        baseline = f"  raw PostgreSQL COPY of the same {api['samples']:,} rows"
        print(f"{baseline:<60} {copy['rate']:>10,.0f}")
    print()
    for path, floor in floors.items():
        print(
            f"stack floor, GET {path} on the same gunicorn: {floor['rate']:,.0f} requests/s "
            f"(p50 {floor['p50']:.1f} ms, p95 {floor['p95']:.1f} ms, p99 {floor['p99']:.1f} ms)"
        )
    for batch_s, api, _copy in results:
        shares = ", ".join(
            f"{api['beat_rate'] / floor['rate']:.0%} of GET {path}"  # type: ignore[operator]
            for path, floor in floors.items()
        )
        print(f"  heartbeats of {batch_s} s x {args.gpus} GPUs: {api['beat_rate']:,.1f}/s = {shares}")
        if batch_s == 5:
            nodes = api["beat_rate"] * 5  # type: ignore[operator]
            per_core = nodes / api["web_cores"] if api["web_cores"] else float("nan")  # type: ignore[operator]
            print(
                f"    at the agent's 5 s cadence: {nodes:,.0f} nodes on this gunicorn, which used "
                f"{api['web_cores']:.2f} cores: {per_core:,.0f} nodes per web core"
            )
    print()
    print(
        "goals: API samples/s >= 10% of raw COPY; 5 s heartbeats >= 50% of the GET /healthz floor. Web CPU is the "
        "cores gunicorn used; client CPU the share of one core the load generator used (both taken from one machine)"
    )


if __name__ == "__main__":
    main()
