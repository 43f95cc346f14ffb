"""Helpers every bench shares: a database of its own, a free port, a web server that is up, a server's GPUs."""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent


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


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank; NaN when there are none)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(port: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """Until the web server answers /healthz; a server that exits first ends the bench."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"gunicorn exited with {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit("gunicorn did not come up")


def start_gunicorn(env: dict[str, str], *, workers: int, threads: int) -> tuple[subprocess.Popen[bytes], int]:
    """The web server as deployed, on a free port: gthread workers, so keep-alive connections are kept and a
    worker waiting on the database does not leave the CPU idle. Returns once it answers /healthz."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "controlplane.wsgi:application",
            "--bind",
            f"127.0.0.1:{port}",
            "--worker-class",
            "gthread",
            "--workers",
            str(workers),
            "--threads",
            str(threads),
            "--keep-alive",
            "30",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=env,
    )
    wait_for(port, proc)
    return proc, port


def process_tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by process ``pid`` and its live children (gunicorn's master and
    its workers), from /proc; 0 where there is no /proc."""
    total = 0.0
    pids = [pid]
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        pids += [int(c) for c in children]
    except OSError:
        return 0.0
    for p in pids:
        try:
            total += stat_cpu(Path(f"/proc/{p}/stat"))
        except OSError:
            continue
    return total


def stat_cpu(stat: Path) -> float:
    """CPU seconds (user + system) in a /proc ``stat`` file: a process's (/proc/PID/stat) or one thread's
    (/proc/PID/task/TID/stat)."""
    clock = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / clock  # utime, stime


def run_threads(target: Callable[..., None], args: Iterable[tuple[Any, ...]]) -> float:
    """Run ``target`` in one thread per argument tuple, all at once; returns the seconds until the last ended."""
    import threading

    threads = [threading.Thread(target=target, args=a) for a in args]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - started


def django_on_fresh_database(script: str, default_url: str, **extra_env: str) -> tuple[str, dict[str, str]]:
    """Point this process (and the web servers it starts) at a fresh PostgreSQL database and set Django up.

    Returns the database URL and the environment for child processes."""
    url = os.environ.get("DATABASE_URL") or default_url
    if not url.startswith(("postgres://", "postgresql://")):
        raise SystemExit(f"bench/{script}.py measures PostgreSQL: set DATABASE_URL to a postgres:// URL")
    fresh_database(url)
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "CONTROLPLANE_VAR_DIR": tempfile.mkdtemp(prefix=f"bench-{script}-"),
        "LOG_LEVEL": "WARNING",
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "PYTHONPATH": str(ROOT),
        **extra_env,
    }
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    return url, env


def http_floor(
    port: int, *, path: str, clients: int, seconds: float, headers: dict[str, str] | None = None
) -> dict[str, float]:
    """The web stack's floor: ``clients`` keep-alive threads GET ``path`` for ``seconds``, as fast as it answers.

    Run on the same gunicorn as the API phase, it tells what any request costs before the endpoint does its
    work, so an endpoint's rate can be read against what the stack allows at all."""
    import threading

    latencies: list[float] = []
    failures = [0]
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def client() -> None:
        mine: list[float] = []
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while time.monotonic() < deadline:
            t0 = time.perf_counter()
            conn.request("GET", path, headers=headers or {})
            response = conn.getresponse()
            response.read()
            if response.status == 200:
                mine.append(time.perf_counter() - t0)
            else:
                with lock:
                    failures[0] += 1
        conn.close()
        with lock:
            latencies.extend(mine)

    elapsed = run_threads(client, [()] * clients)
    return {
        "requests": len(latencies),
        "failures": failures[0],
        "rate": len(latencies) / elapsed,
        "p50": 1000 * pct(latencies, 0.50),
        "p95": 1000 * pct(latencies, 0.95),
        "p99": 1000 * pct(latencies, 0.99),
    }


def server_gpus(server: Any, model: Any, *, count: int = 8, memory_mib: int | None = None, **fields: Any) -> list[Any]:
    """Unsaved GPU rows of one server, as an 8-GPU box reports them: two NUMA halves, each GPU NVLinked to
    the others of its half. ``fields``: per GPU, a function of its index giving more columns (``mig=``)."""
    from controlplane.inventory.models import Gpu

    half = count // 2
    uuids = [f"GPU-{server.hostname}-{g}" for g in range(count)]
    rows = []
    for g in range(count):
        side = range(0, half) if g < half else range(half, count)
        rows.append(
            Gpu(
                server=server,
                uuid=uuids[g],
                index=g,
                model=model,
                product_name=model.product_name,
                memory_mib=memory_mib or model.memory_mib,
                numa_node=0 if g < half else 1,
                nvlink_peers=[uuids[p] for p in side if p != g],
                **{name: value(g) for name, value in fields.items()},
            )
        )
    return rows
