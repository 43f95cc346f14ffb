"""Window opening -> container running, through the whole control plane, beside a bare `docker run`.

    .venv/bin/python bench/dispatch.py [--rounds 7] [--per-round 8] [--gpus 2] [--gap 6]

DATABASE_URL (default postgres://postgres@127.0.0.1:5432/bench_dispatch) must be PostgreSQL; the database is
dropped and created afresh on every run, as ledger entries cannot be deleted.

The control plane runs in this process: Django's threaded WSGI server on a free 127.0.0.1 port, a "beat"
thread calling the dispatch reconcilers every second as Celery beat would, and Celery tasks run eagerly in the
thread that enqueues them (the push is the same code a worker runs). Two real agents (Agent + DockerRuntime +
8 simulated H100 each + the signed command listener) enroll with join tokens and heartbeat over HTTP.
``--rounds`` x ``--per-round`` reservations of ``--gpus`` GPUs are booked with reservation_create; every round's
windows open at the same instant, so several containers start together on both servers. A launch is sent
DISPATCH_LEAD_S before its window (by the beat or the server's own heartbeat); the agent creates the container
then and starts it at the window start on its own clock.

Latency is the container's State.StartedAt, as Docker recorded it and the agent reported it, minus the window
start. The baseline, measured in the same run: `docker run -d` of the same image (docker SDK
containers.run), in batches of the same size in parallel, StartedAt minus the moment the client was called.
Target (the issue's): p95 <= 1 s + p95 of the bare `docker run`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _common import fresh_database

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/bench_dispatch"
JOB = ["sh", "-c", 'trap "exit 0" TERM; while true; do sleep 0.1; done']


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def setup_django(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    os.environ["CELERY_TASK_ALWAYS_EAGER"] = "true"
    os.environ.setdefault("CONTROLPLANE_VAR_DIR", tempfile.mkdtemp(prefix="bench-dispatch-"))
    os.environ.setdefault("DISPATCH_WARN_BEFORE_S", "0")
    os.environ.setdefault("DISPATCH_STOP_GRACE_S", "2")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def start_web() -> tuple[Any, str]:
    from django.core.handlers.wsgi import WSGIHandler
    from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadedWSGIServer(("127.0.0.1", 0), Quiet, allow_reuse_address=False)
    httpd.set_app(WSGIHandler())
    threading.Thread(target=httpd.serve_forever, name="web", daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


def beat(stop: threading.Event) -> None:
    from django.db import connection

    from controlplane.dispatch import services

    while not stop.wait(1.0):
        try:
            services.dispatch_open_due()
            services.dispatch_close_due()
        except Exception as exc:
            print(f"beat: {exc}", file=sys.stderr)
    connection.close()


def start_agent(client: Any, url: str, hostname: str, state: Path) -> tuple[Any, threading.Thread, Any]:
    from controlplane.fleet import services as fleet
    from nodeagent.agent import Agent, AgentState
    from nodeagent.backends.simulated import SimulatedBackend
    from nodeagent.client import ControlPlaneClient
    from nodeagent.collectors import HostCollector
    from nodeagent.commands import CommandChannel
    from nodeagent.runtime.docker import DockerRuntime

    _, token = fleet.join_token_create(actor=None, note=f"bench {hostname}")
    holder: dict[str, Agent] = {}
    channel = CommandChannel(
        credential=lambda: holder["a"].credential if holder else None,
        server_name=lambda: holder["a"].server_name if holder else None,
    ).start()
    runtime = DockerRuntime(state_dir=state / "runtime", client=client, node=hostname, nvidia_runtime=False)
    agent = Agent(
        client=ControlPlaneClient(url, timeout=10),
        backend=SimulatedBackend("8xH100-80GB", hostname=hostname, busy_source=runtime.busy_gpus),
        runtime=runtime,
        state=AgentState(state / "agent"),
        host=HostCollector(hostname=hostname),
        join_token=token,
        interval=1.0,
        commands=channel,
    )
    holder["a"] = agent
    thread = threading.Thread(target=agent.run, name=f"agent-{hostname}", daemon=True)
    thread.start()
    return agent, thread, channel


def wait_until(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {what}")


def bench_dispatch(client: Any, url: str, args: argparse.Namespace) -> tuple[list[float], dict[str, int]]:
    from decimal import Decimal

    from django.db.models import Count
    from django.utils import timezone

    from controlplane.accounts.models import Project
    from controlplane.dispatch.models import Launch
    from controlplane.inventory.choices import ServerState
    from controlplane.inventory.models import Server
    from controlplane.ledger.services import ledger_grant, quota_policy_set
    from controlplane.reservations.models import Reservation
    from controlplane.reservations.services import reservation_create
    from controlplane.reservations.specs import ContainerSpec, GpuSpec, Window
    from nodeagent.runtime.localimage import DEFAULT_TAG

    tag = uuid.uuid4().hex[:6]
    hosts = [f"bench-{tag}-a", f"bench-{tag}-b"]
    state = Path(tempfile.mkdtemp(prefix="bench-agents-"))
    agents = [start_agent(client, url, host, state / host) for host in hosts]
    wait_until(
        lambda: Server.objects.filter(hostname__in=hosts, gpus__isnull=False).distinct().count() == 2,
        60,
        "both agents to enroll and report their GPUs",
    )
    # An operator's step: enrolled servers are commissioned, then made ready for tenants.
    Server.objects.filter(hostname__in=hosts).update(state=ServerState.READY, heartbeat_interval_s=1.0)
    wait_until(
        lambda: all((s.facts or {}).get("command_url") for s in Server.objects.filter(hostname__in=hosts)),
        30,
        "the agents' command listeners",
    )

    project = Project.objects.create(name=f"Bench {tag}", slug=f"bench-{tag}")
    quota_policy_set(project=project, actor=None, credits_per_period=Decimal("0"))
    ledger_grant(project=project, amount=Decimal("1000000"), actor=None, reason="bench credits")
    first = timezone.now() + timedelta(seconds=8)
    booked: list[Reservation] = []
    for k in range(args.rounds):
        start = first + timedelta(seconds=k * args.gap)
        for i in range(args.per_round):
            booked.append(
                reservation_create(
                    project=project,
                    name=f"bench r{k} #{i}",
                    spec=GpuSpec(min_memory_mib=1024, gpu_count=args.gpus),
                    window=Window(start, start + timedelta(seconds=args.window)),
                    container=ContainerSpec(image=DEFAULT_TAG, command=JOB),
                    actor=None,
                )
            )
    last_end = max(r.ends_at for r in booked)
    print(f"booked {len(booked)} reservations in {args.rounds} rounds; the last window closes at {last_end:%H:%M:%S}")
    ids = [r.pk for r in booked]
    wait_until(
        lambda: (
            timezone.now() > last_end + timedelta(seconds=3)
            and not Reservation.objects.filter(
                pk__in=ids, state__in=["scheduled", "starting", "running", "ending"]
            ).exists()
        ),
        (last_end - timezone.now()).total_seconds() + 60,
        "every reservation to finish",
    )
    latencies = []
    for launch in Launch.objects.filter(reservation_id__in=ids).select_related("reservation"):
        if launch.started_at is not None:
            latencies.append((launch.started_at - launch.reservation.starts_at).total_seconds())
    outcome = dict(
        Reservation.objects.filter(pk__in=ids).values_list("state").annotate(n=Count("id")).values_list("state", "n")
    )
    for agent, thread, channel in agents:
        agent.stop()
        thread.join(timeout=10)
        channel.close()
    return latencies, outcome


def bench_bare(client: Any, *, count: int, parallel: int) -> list[float]:
    from nodeagent.runtime.containers import parse_docker_time
    from nodeagent.runtime.localimage import DEFAULT_TAG

    def one(_: int) -> float:
        called = datetime.now(UTC)
        c = client.containers.run(DEFAULT_TAG, JOB, detach=True, network_mode="none", labels={"gpucp.bench": "bare"})
        c.reload()
        took = (parse_docker_time(c.attrs["State"]["StartedAt"]) - called).total_seconds()
        return took

    latencies: list[float] = []
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        for done in range(0, count, parallel):
            latencies.extend(pool.map(one, range(min(parallel, count - done))))
    for c in client.containers.list(all=True, filters={"label": "gpucp.bench=bare"}):
        c.remove(force=True)
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7, help="windows opening one after another")
    parser.add_argument("--per-round", type=int, default=8, help="reservations whose windows open together")
    parser.add_argument("--gpus", type=int, default=2, help="GPUs per reservation (16 in the fleet)")
    parser.add_argument("--window", type=float, default=3.0, help="seconds each window lasts")
    parser.add_argument("--gap", type=float, default=6.0, help="seconds between the rounds' window starts")
    args = parser.parse_args()
    if args.per_round * args.gpus > 16:
        parser.error("--per-round x --gpus must fit the 16 simulated GPUs")
    url = os.environ.get("DATABASE_URL") or DEFAULT_URL
    if not url.startswith(("postgres://", "postgresql://")):
        parser.error("DATABASE_URL must be PostgreSQL")
    fresh_database(url)
    setup_django(url)

    import docker

    from nodeagent.runtime.localimage import DEFAULT_TAG, ensure_busybox_image

    client = docker.from_env(timeout=60)
    ensure_busybox_image(client, DEFAULT_TAG)
    httpd, web = start_web()
    stop = threading.Event()
    threading.Thread(target=beat, args=(stop,), name="beat", daemon=True).start()
    began = time.monotonic()
    try:
        dispatched, outcome = bench_dispatch(client, web, args)
    finally:
        stop.set()
        httpd.shutdown()
    bare = bench_bare(client, count=len(dispatched) or 1, parallel=args.per_round)
    print(f"reservations: {outcome}; {time.monotonic() - began:.0f} s")
    print(f"{'path':<52}{'n':>5}{'p50 s':>9}{'p95 s':>9}{'max s':>9}")
    for name, values in (
        ("window start -> running (control plane + agent)", dispatched),
        (f"bare docker run -d ({args.per_round} in parallel)", bare),
    ):
        if values:
            print(
                f"{name:<52}{len(values):>5}{statistics.median(values):>9.3f}{pct(values, 0.95):>9.3f}"
                f"{max(values):>9.3f}"
            )
    if dispatched and bare:
        target = 1.0 + pct(bare, 0.95)
        p95 = pct(dispatched, 0.95)
        print(f"ratio p95 dispatch / p95 bare: {p95 / pct(bare, 0.95):.2f}")
        print(f"target p95 <= 1 s + bare p95 = {target:.3f} s: {'met' if p95 <= target else 'MISSED'} ({p95:.3f} s)")


if __name__ == "__main__":
    main()
