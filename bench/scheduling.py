"""The queue under a saturating workload, beside book-or-refuse on the same workload.

    .venv/bin/python bench/scheduling.py [--hours 4] [--load 1.3] [--pass-every 120] [--seed 1]

DATABASE_URL (default postgres://postgres@127.0.0.1:5432/bench_scheduling) must be PostgreSQL; the database is
dropped and created afresh on every run.

A synthetic workload on a 64 x 8 GPU fleet: requests of 1, 2, 4 or 8 GPUs arriving as a Poisson stream whose
GPU-hours are ``--load`` times what the fleet can run, with heavy-tailed durations (Pareto, 10 minutes to 4
hours), in three classes (high, normal, and the preemptible class when the database has one, else a low class
the bench creates); one arrival in ten is an advance reservation 1 to 4 hours ahead. Time is compressed:
nothing sleeps, and ``now`` is driven through the services explicitly (submit at the arrival, a pass every
``--pass-every`` simulated seconds: the beat's 5 s, compressed by the factor printed).

Printed for the queue: GPU utilization after the first two hours (the longest job's length: the queue has filled),
wait p50 / p95 per class, advance reservations delayed (goal 0), preemptions (ReservationEvents whose reason
mentions it), the cost of one pass (ms and queries). Beside it, book-or-refuse on a second, identical fleet: each
request tried once at its arrival through reservation_create, the GPU-hours refused, and the utilization left.
Goals: utilization >= 90% under saturation; high-class p95 wait <= one pass + the preemption notice.
"""

from __future__ import annotations

import argparse
import heapq
import random
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from _common import django_on_fresh_database, pct, server_gpus

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/bench_scheduling"
SERVERS, GPUS = 64, 8
QUEUE_MODEL, BASELINE_MODEL = "H100-80GB", "H100-80GB-B"
SIZES, SIZE_WEIGHTS = (1, 2, 4, 8), (4, 3, 2, 1)
CLASS_WEIGHTS = (("high", 1), ("normal", 6), ("third", 3))
MIN_S, MAX_S, PARETO_ALPHA = 600, 4 * 3600, 1.3


@dataclass(frozen=True)
class Arrival:
    at: datetime
    gpus: int
    seconds: int
    klass: str
    project: int
    advance_in: int | None  # an advance reservation this many seconds after its arrival


def workload(*, start: datetime, hours: float, load: float, seed: int, projects: int) -> list[Arrival]:
    rng = random.Random(seed)
    mean_s = sum(min(MAX_S, MIN_S * rng.paretovariate(PARETO_ALPHA)) for _ in range(20000)) / 20000
    mean_gpus = sum(s * w for s, w in zip(SIZES, SIZE_WEIGHTS, strict=True)) / sum(SIZE_WEIGHTS)
    rate = load * SERVERS * GPUS / (mean_s * mean_gpus)  # arrivals per second
    out, t = [], 0.0
    classes, class_w = zip(*CLASS_WEIGHTS, strict=True)
    while t < hours * 3600:
        t += rng.expovariate(rate)
        seconds = int(min(MAX_S, MIN_S * rng.paretovariate(PARETO_ALPHA)))
        advance = rng.randint(3600, 4 * 3600) if rng.random() < 0.1 else None
        out.append(
            Arrival(
                at=start + timedelta(seconds=t),
                gpus=rng.choices(SIZES, SIZE_WEIGHTS)[0],
                seconds=seconds,
                klass=rng.choices(classes, class_w)[0],
                project=rng.randrange(projects),
                advance_in=advance,
            )
        )
    return out


def build_fleet(model_name: str, prefix: str) -> Any:
    from controlplane.inventory.choices import ServerState
    from controlplane.inventory.models import Gpu, GpuModel, Server

    model = GpuModel.objects.create(
        name=model_name, product_name=f"NVIDIA {model_name}", memory_mib=81920, billing_weight=1
    )
    rows = Server.objects.bulk_create(
        Server(hostname=f"{prefix}-{i:03d}", state=ServerState.READY) for i in range(SERVERS)
    )
    gpus = [gpu for srv in rows for gpu in server_gpus(srv, model, count=GPUS)]
    Gpu.objects.bulk_create(gpus)
    return model


def utilization(model: Any, *, start: datetime, end: datetime) -> float:
    from controlplane.reservations.models import Allocation

    held = 0.0
    for a_start, a_end in Allocation.objects.filter(
        gpu__model=model, active=True, starts_at__lt=end, ends_at__gt=start
    ).values_list("starts_at", "ends_at"):
        held += (min(a_end, end) - max(a_start, start)).total_seconds()
    return held / (SERVERS * GPUS * (end - start).total_seconds())


def book_advance(arrival: Arrival, *, project: Any, model: Any, name: str) -> Any:
    from controlplane.core.errors import Conflict
    from controlplane.reservations.services import reservation_create
    from controlplane.reservations.specs import ContainerSpec, GpuSpec, Window

    assert arrival.advance_in is not None
    starts = arrival.at + timedelta(seconds=arrival.advance_in)
    try:
        return reservation_create(
            project=project,
            name=name,
            spec=GpuSpec(gpu_model_id=model.pk, gpu_count=arrival.gpus),
            window=Window(starts, starts + timedelta(seconds=arrival.seconds)),
            container=ContainerSpec(image="bench/job:1"),
            actor=None,
            now=arrival.at,
        )
    except Conflict:
        return None


def run_queue(arrivals: list[Arrival], *, projects: list[Any], model: Any, classes: dict[str, Any], every: int) -> dict:
    from django.db import connection, reset_queries
    from django.test.utils import CaptureQueriesContext

    from controlplane.core.errors import Conflict, QuotaExceeded
    from controlplane.reservations.specs import ContainerSpec, GpuSpec
    from controlplane.scheduling import services

    # The bench drives every pass itself, at simulated times: no worker is asked for one after a submit.
    services.trigger_pass = lambda: None  # type: ignore[assignment]
    start, end = arrivals[0].at, arrivals[-1].at
    events: list[tuple[datetime, int, int]] = [(a.at, 0, i) for i, a in enumerate(arrivals)]
    t = start
    while t <= end:
        events.append((t, 1, -1))
        t += timedelta(seconds=every)
    heapq.heapify(events)
    advance: dict[int, tuple[datetime, datetime]] = {}
    pass_ms: list[float] = []
    pass_queries: list[int] = []
    tried: list[int] = []
    refused_at_submit = 0
    while events:
        at, kind, i = heapq.heappop(events)
        if kind == 1:
            reset_queries()  # the query log is a bounded deque: counted from empty, a pass is counted in full
            with CaptureQueriesContext(connection) as q:
                t0 = time.perf_counter()
                report = services.run_pass(now=at)
                pass_ms.append((time.perf_counter() - t0) * 1000)
            pass_queries.append(len(q))
            tried.append(report.tried)
            continue
        a = arrivals[i]
        if a.advance_in is not None:
            res = book_advance(a, project=projects[a.project], model=model, name=f"advance-{i}")
            if res is not None:
                advance[res.pk] = (res.starts_at, res.ends_at)
            continue
        try:
            services.request_submit(
                project=projects[a.project],
                name=f"job-{i}",
                spec=GpuSpec(gpu_model_id=model.pk, gpu_count=a.gpus),
                container=ContainerSpec(image="bench/job:1"),
                duration=timedelta(seconds=a.seconds),
                start_by=None,
                priority_class=classes[a.klass],
                actor=None,
                now=a.at,
            )
        except (Conflict, QuotaExceeded):
            refused_at_submit += 1
    return {
        "advance": advance,
        "pass_ms": pass_ms,
        "pass_queries": pass_queries,
        "tried": tried,
        "refused_at_submit": refused_at_submit,
    }


def run_book_or_refuse(arrivals: list[Arrival], *, projects: list[Any], model: Any) -> dict:
    from controlplane.core.errors import Conflict, QuotaExceeded
    from controlplane.reservations.services import reservation_create
    from controlplane.reservations.specs import ContainerSpec, GpuSpec, Window

    refused_gpu_h = 0.0
    refused = booked = 0
    for i, a in enumerate(arrivals):
        if a.advance_in is not None:
            book_advance(a, project=projects[a.project], model=model, name=f"advance-{i}")
            continue
        try:
            reservation_create(
                project=projects[a.project],
                name=f"job-{i}",
                spec=GpuSpec(gpu_model_id=model.pk, gpu_count=a.gpus),
                window=Window(a.at, a.at + timedelta(seconds=a.seconds)),
                container=ContainerSpec(image="bench/job:1"),
                actor=None,
                now=a.at,
            )
            booked += 1
        except (Conflict, QuotaExceeded):
            refused += 1
            refused_gpu_h += a.gpus * a.seconds / 3600
    return {"refused": refused, "booked": booked, "refused_gpu_h": refused_gpu_h}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hours", type=float, default=4.0, help="simulated hours of arrivals")
    parser.add_argument("--load", type=float, default=1.3, help="offered GPU-hours over what the fleet can run")
    parser.add_argument("--pass-every", type=int, default=120, help="simulated seconds between passes")
    parser.add_argument("--projects", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    django_on_fresh_database("scheduling", DEFAULT_URL)
    from django.core.management import call_command
    from django.db.models import Q

    from controlplane.accounts.models import Project
    from controlplane.ledger.services import ledger_grant, quota_policy_set
    from controlplane.reservations.models import Reservation, ReservationEvent
    from controlplane.scheduling.choices import RequestState
    from controlplane.scheduling.models import PriorityClass, QueuedRequest

    t_setup = time.monotonic()
    call_command("migrate", verbosity=0)
    queue_model = build_fleet(QUEUE_MODEL, "queue")
    baseline_model = build_fleet(BASELINE_MODEL, "refuse")
    projects = [Project.objects.create(name=f"Bench {i}", slug=f"bench-{i}") for i in range(args.projects)]
    high = PriorityClass.objects.get(name="high")
    for p in projects:
        quota_policy_set(project=p, actor=None, credits_per_period=0)
        ledger_grant(project=p, amount=10**9, actor=None, reason="bench credits")
        high.allowed_policies.add(p.quota_policy)
    third = PriorityClass.objects.filter(preemptible=True).order_by("rank").first()
    if third is None:
        third, _ = PriorityClass.objects.get_or_create(name="low", defaults={"rank": 10})
    classes = {"high": high, "normal": PriorityClass.objects.get(name="normal"), "third": third}
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=5)
    arrivals = workload(start=start, hours=args.hours, load=args.load, seed=args.seed, projects=args.projects)
    offered = sum(a.gpus * a.seconds for a in arrivals if a.advance_in is None) / 3600
    print(
        f"setup {time.monotonic() - t_setup:.1f} s: 2 fleets of {SERVERS} x {GPUS} GPUs; {len(arrivals)} arrivals "
        f"over {args.hours:g} simulated h ({offered:,.0f} GPU-h queued, load {args.load:g}); classes high / normal "
        f"/ {third.name}{' (preemptible)' if third.preemptible else ''}; a pass every {args.pass_every} simulated s "
        f"(the beat's 5 s compressed {args.pass_every / 5:g}x)",
        flush=True,
    )

    t_run = time.monotonic()
    q = run_queue(arrivals, projects=projects, model=queue_model, classes=classes, every=args.pass_every)
    queue_s = time.monotonic() - t_run
    t_run = time.monotonic()
    b = run_book_or_refuse(arrivals, projects=projects, model=baseline_model)
    baseline_s = time.monotonic() - t_run

    end = arrivals[-1].at
    measured = (start + timedelta(hours=2), end)  # after the longest job's length: the queue has filled
    delayed = sum(
        1
        for pk, (s, e) in q["advance"].items()
        if not Reservation.objects.filter(pk=pk, starts_at=s, ends_at=e).exclude(state="cancelled").exists()
    )
    preemptions = ReservationEvent.objects.filter(Q(reason__icontains="preempt")).count()
    print(f"\nqueue ({queue_s:.0f} s wall):")
    queue_util = utilization(queue_model, start=measured[0], end=measured[1])
    span = (measured[1] - measured[0]).total_seconds() / 3600
    print(f"  GPU utilization            {queue_util:6.1%}  (measured over {span:.1f} h, after the first 2 h)")
    for klass in classes.values():
        rows = QueuedRequest.objects.filter(priority_class=klass, created_at__lt=end)
        waits = [
            (s - c).total_seconds() / 60
            for c, s in rows.filter(state=RequestState.STARTED).values_list("created_at", "started_at")
        ]
        left = rows.filter(state=RequestState.QUEUED).count()
        print(
            f"  wait {klass.name:<12}          p50 {pct(waits, 0.5):7.1f} min  p95 {pct(waits, 0.95):7.1f} min  "
            f"({len(waits)} started, {left} still queued at the end)"
        )
    backfilled = QueuedRequest.objects.filter(state=RequestState.STARTED).count()
    print(f"  advance reservations       {len(q['advance'])} booked, {delayed} delayed (goal 0)")
    print(f"  preemptions                {preemptions}")
    print(
        f"  one pass                   p50 {pct(q['pass_ms'], 0.5):.0f} ms  p95 {pct(q['pass_ms'], 0.95):.0f} ms  "
        f"max {max(q['pass_ms']):.0f} ms; queries p50 {pct(q['pass_queries'], 0.5):.0f}  "
        f"max {max(q['pass_queries'])}; tries p50 {pct(q['tried'], 0.5):.0f}  max {max(q['tried'])} "
        f"({len(q['pass_ms'])} passes, {backfilled} started)"
    )
    print(f"\nbook-or-refuse, same arrivals ({baseline_s:.0f} s wall):")
    refused_util = utilization(baseline_model, start=measured[0], end=measured[1])
    span_h = (measured[1] - measured[0]).total_seconds() / 3600
    print(
        f"  GPU utilization            {refused_util:6.1%}  "
        f"({(1 - refused_util) * SERVERS * GPUS * span_h:,.0f} GPU-h left idle over the measured {span_h:.1f} h)"
    )
    print(
        f"  refused                    {b['refused']} of {b['refused'] + b['booked']} requests, "
        f"{b['refused_gpu_h']:,.0f} GPU-h ({b['refused_gpu_h'] / offered:.0%} of what was asked)"
    )


if __name__ == "__main__":
    main()
