"""MIG slices as rentable units (issue 15): GPU-hours accepted with slices packed, beside the same requests
rounded up to whole GPUs and beside slices placed first-fit, and the booking cost of a slice beside a whole
GPU's; all in one run, on one workload.

    .venv/bin/python bench/fractional.py [--servers 20] [--requests 1200] [--fractional 0.45] [--load 1.1]
                                         [--seed 1] [--database postgres://...]

``--database`` (or DATABASE_URL; default postgres://postgres@127.0.0.1:5432/bench_fractional) must be
PostgreSQL, whose exclusion constraint the booking relies on; the database is dropped and made afresh.

**Fleet.** ``--servers`` servers of 8 GPUs, by turns H100-80GB (half), A100-80GB (three in ten) and
A100-40GB (one in five), each two NUMA nodes of four NVLinked GPUs. On every server GPUs 6 and 7, a quarter
of the fleet, are in MIG mode: enough for the slice demand below (about a tenth of the GPU-hours) with room
for its peaks, while every server still has six whole GPUs for the whole-GPU requests, and an 8-GPU request
fits a server whose MIG GPUs hold no slice (a GPU in MIG mode may be booked whole). Their layouts are
NVIDIA mig-parted's named configurations (``all-1g.10gb``, ``all-2g.20gb``, ``all-3g.40gb``,
``all-balanced``, and the A100-40GB's equivalents), placed by ``nodeagent.mig.place`` with that model's
profile table, in pairs that give each server every slice size.

**Workload** (``--seed``: the same requests every run). ``--requests`` advance bookings, made one after
the other in a random order, of windows that start on the hour within a horizon chosen so the GPU-hours
asked for are ``--load`` times the fleet's. ``--fractional`` of them (0.45) ask for slices: 1g (45 %), 2g
(30 %) or 3g (25 %) of the 80 GB or, one in five, the 40 GB family, 1, 2 or 4 of them, for 2 to 24 hours;
the rest for 1, 2, 4 or 8 whole GPUs of one model, for 2 to 24 hours. A slice's GPU-hours are its share of
its GPU's memory slices (``memory_slices / 8``, as it is billed) times its hours.

**Three placements of the same requests, each on a fleet of its own** (built alike; only the one being
measured is ready, so a profile matches that fleet's devices alone):

* *packed*: the slices as booked (``reservations.mig``, ``STRATEGY = "packed"``);
* *rounded up*: every slice request asks for as many whole GPUs, with at least the slice's memory, as it
  asks for slices: what a fleet without MIG gives those users;
* *first-fit*: the slices placed by the same code with ``STRATEGY = "first_fit"``: the first free devices
  in fleet order, whatever is cut already.

Every booking goes through ``services.reservation_create``, the service the API calls. Fragmentation (the
concern of Weng et al., "Beware of Fragmentation", USENIX ATC '23) is measured on what is booked at the end,
at every hour of the horizon: the whole GPUs and the whole 8-GPU servers still free, the 3g slices still
free, and the share of the free capacity that lies on GPUs already cut (bookable as slices only).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from _common import django_on_fresh_database, pct, server_gpus

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/bench_fractional"
GPUS_PER_SERVER = 8
MIG_GPUS = (6, 7)
MEMORY_SLICES = 8

# (model, share of the servers, memory as the simulated catalog has it, billing weight, family of profiles)
MODELS = (
    ("H100-80GB", 5, 81559, "2", "80gb"),
    ("A100-80GB", 3, 81920, "1.5", "80gb"),
    ("A100-40GB", 2, 40960, "1", "40gb"),
)
# Servers' models by turns, spread so that any few servers have each: 5 H100, 3 A100-80GB, 2 A100-40GB in ten.
SERVER_MODELS = (
    "H100-80GB", "A100-80GB", "H100-80GB", "A100-40GB", "H100-80GB",
    "H100-80GB", "A100-80GB", "H100-80GB", "A100-40GB", "A100-80GB",
)  # fmt: skip
SIZES = {
    "80gb": {"1g": "1g.10gb", "2g": "2g.20gb", "3g": "3g.40gb"},
    "40gb": {"1g": "1g.5gb", "2g": "2g.10gb", "3g": "3g.20gb"},
}
# NVIDIA mig-parted's named configurations, by size class ("all-balanced": 2 x 1g, 1 x 2g, 1 x 3g).
LAYOUTS = {
    "all-1g": ["1g"] * 7,
    "all-2g": ["2g"] * 3,
    "all-3g": ["3g"] * 2,
    "all-balanced": ["3g", "2g", "1g", "1g"],
}
# Per server, the layouts of GPUs 6 and 7, by turns.
LAYOUT_PAIRS = (("all-1g", "all-balanced"), ("all-2g", "all-3g"), ("all-balanced", "all-1g"), ("all-3g", "all-2g"))
SLICE_MIX = (("1g", 45), ("2g", 30), ("3g", 25))
SLICE_COUNTS = ((1, 60), (2, 25), (4, 15))
WHOLE_COUNTS = ((1, 40), (2, 25), (4, 20), (8, 15))
HOURS = (2, 4, 8, 12, 24)
ANALYZE_EVERY = 200
VARIANTS = (("packed", "pk"), ("rounded up", "ru"), ("first-fit", "ff"))


def weighted(rng: random.Random, table: tuple[tuple[Any, int], ...]) -> Any:
    return rng.choices([v for v, _ in table], weights=[w for _, w in table])[0]


@dataclass(frozen=True)
class Request:
    slice: bool
    model: str  # a whole-GPU request's model; a slice request's family's first model
    profile: str | None  # a slice request's profile
    memory_mib: int  # a slice's memory (what its rounded-up whole GPU must hold)
    count: int
    start_h: int
    hours: int
    gpu_hours: float  # as asked: whole GPUs, or slices at their share of a GPU


def profile_table(model: str) -> dict[str, Any]:
    from nodeagent.mig import PROFILES

    return PROFILES[model]


def workload(args: argparse.Namespace, gpus: int) -> tuple[list[Request], int]:
    """The requests, and the horizon in hours over which they ask for ``args.load`` times the fleet."""
    rng = random.Random(args.seed)
    drafts: list[tuple[bool, str, str | None, int, int, int, float]] = []
    by_family = {"80gb": "H100-80GB", "40gb": "A100-40GB"}
    for _ in range(args.requests):
        hours = rng.choice(HOURS)
        if rng.random() < args.fractional:
            family = "40gb" if rng.random() < 0.2 else "80gb"
            profile = SIZES[family][weighted(rng, SLICE_MIX)]
            count = weighted(rng, SLICE_COUNTS)
            p = profile_table(by_family[family])[profile]
            share = p.memory_slices / MEMORY_SLICES
            drafts.append((True, by_family[family], profile, p.memory_mib, count, hours, count * share * hours))
        else:
            model = weighted(rng, tuple((m[0], m[1]) for m in MODELS))
            count = weighted(rng, WHOLE_COUNTS)
            drafts.append((False, model, None, 0, count, hours, float(count * hours)))
    horizon = max(max(HOURS), math.ceil(sum(d[6] for d in drafts) / (args.load * gpus)))
    starts = random.Random(args.seed + 1)
    requests = [
        Request(s, m, prof, mem, c, starts.randint(0, horizon - h), h, gh) for s, m, prof, mem, c, h, gh in drafts
    ]
    return requests, horizon


def build_fleet(servers: int, prefix: str, models: dict[str, Any]) -> None:
    """``servers`` servers, in maintenance until their variant is measured, with GPUs 6 and 7 in MIG mode."""
    from controlplane.inventory.choices import ServerState
    from controlplane.inventory.models import Gpu, MigDevice, Server
    from nodeagent.mig import place

    rows = Server.objects.bulk_create(
        Server(hostname=f"{prefix}-{i:04d}", state=ServerState.MAINTENANCE) for i in range(servers)
    )
    gpus: list[Gpu] = []
    for i, srv in enumerate(rows):
        model = models[SERVER_MODELS[i % len(SERVER_MODELS)]]
        gpus += server_gpus(
            srv,
            model,
            count=GPUS_PER_SERVER,
            mig=lambda g: {"current": True, "pending": True, "profiles": [], "devices": []} if g in MIG_GPUS else None,
        )
    Gpu.objects.bulk_create(gpus)
    devices = []
    for gpu in gpus:
        if gpu.mig is None:
            continue
        family = next(m[4] for m in MODELS if m[0] == gpu.model.name)
        server_no = int(gpu.server.hostname.rsplit("-", 1)[1])
        layout = LAYOUTS[LAYOUT_PAIRS[server_no % len(LAYOUT_PAIRS)][MIG_GPUS.index(gpu.index)]]
        table = profile_table(gpu.model.name)
        for n, (p, start) in enumerate(place(table, [SIZES[family][size] for size in layout]), start=1):
            devices.append(
                MigDevice(
                    gpu=gpu,
                    uuid=f"MIG-{gpu.uuid}-{n}",
                    profile=p.name,
                    profile_id=p.profile_id,
                    gpu_instance_id=n,
                    compute_instance_id=0,
                    memory_mib=p.memory_mib,
                    compute_slices=p.compute_slices,
                    memory_slices=p.memory_slices,
                    placement_start=start,
                )
            )
    MigDevice.objects.bulk_create(devices)


def run_variant(
    name: str, prefix: str, requests: list[Request], base: datetime, models: dict[str, Any], project: Any, user: Any
) -> dict[str, Any]:
    from django.db import connection

    from controlplane.core.errors import Conflict
    from controlplane.inventory.choices import ServerState
    from controlplane.inventory.models import Server
    from controlplane.reservations import mig
    from controlplane.reservations.services import reservation_create
    from controlplane.reservations.specs import ContainerSpec, GpuSpec, Window

    Server.objects.update(state=ServerState.MAINTENANCE)
    Server.objects.filter(hostname__startswith=f"{prefix}-").update(state=ServerState.READY)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    mig.STRATEGY = "first_fit" if name == "first-fit" else "packed"
    container = ContainerSpec(image="bench:1", command=["sleep", "1"])
    asked = {"slice": 0.0, "whole": 0.0}
    accepted = {"slice": 0.0, "whole": 0.0}
    n_ok = {"slice": 0, "whole": 0}
    n_all = {"slice": 0, "whole": 0}
    times: dict[str, list[float]] = {"slice": [], "whole": []}
    errors = 0
    refused: dict[str, int] = defaultdict(int)
    for n, r in enumerate(requests):
        if n and n % ANALYZE_EVERY == 0:
            # What autovacuum does on a live database: without it the first variant books against statistics
            # of an empty allocation table, and its plans (and figures) lag behind the later variants'.
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE reservations_allocation")
        kind = "slice" if r.slice else "whole"
        if r.slice and name != "rounded up":
            spec = GpuSpec(mig_profile=r.profile, gpu_count=r.count)
        elif r.slice:
            spec = GpuSpec(min_memory_mib=r.memory_mib, gpu_count=r.count)
        else:
            spec = GpuSpec(gpu_model_id=models[r.model].pk, gpu_count=r.count)
        start = base + timedelta(hours=r.start_h)
        window = Window(start, start + timedelta(hours=r.hours))
        asked[kind] += r.gpu_hours
        n_all[kind] += 1
        t0 = time.perf_counter()
        try:
            reservation_create(project=project, name="bench", spec=spec, window=window, container=container, actor=user)
        except Conflict as exc:
            refused[f"{kind} {exc.code}"] += 1
            continue
        except Exception as exc:
            errors += 1
            if errors <= 2:
                print("error", type(exc).__name__, str(exc)[:300], file=sys.stderr)
            continue
        times[kind].append(time.perf_counter() - t0)
        accepted[kind] += r.gpu_hours
        n_ok[kind] += 1
    mig.STRATEGY = "packed"
    out: dict[str, Any] = {
        "asked": asked,
        "accepted": accepted,
        "n_ok": n_ok,
        "n_all": n_all,
        "times": times,
        "errors": errors,
        "refused": dict(refused),
    }
    out.update(fragmentation(prefix, base, max(r.start_h + r.hours for r in requests)))
    return out


def fragmentation(prefix: str, base: datetime, horizon: int) -> dict[str, float]:
    """At every hour of the horizon, from what is booked: GPU-hours held, whole GPUs and 8-GPU servers free,
    3g slices free, and the share of free memory slices that lie on GPUs cut already."""
    from controlplane.inventory.models import Gpu, MigDevice
    from controlplane.reservations.models import Allocation

    gpus = list(Gpu.objects.filter(server__hostname__startswith=f"{prefix}-").values_list("id", "server_id"))
    devices: dict[int, list[tuple[int, int, str]]] = defaultdict(list)
    for gpu_id, start, size, profile in MigDevice.objects.filter(gpu_id__in=[g for g, _ in gpus]).values_list(
        "gpu_id", "placement_start", "memory_slices", "profile"
    ):
        devices[gpu_id].append((int(start or 0), int(start or 0) + int(size or 0), profile))
    held: dict[int, list[tuple[int, int, float, float]]] = defaultdict(list)
    held_hours = 0.0
    for gpu_id, a, b, s, e in Allocation.objects.filter(gpu_id__in=[g for g, _ in gpus], active=True).values_list(
        "gpu_id", "slice_start", "slice_end", "starts_at", "ends_at"
    ):
        s_h, e_h = (s - base).total_seconds() / 3600, (e - base).total_seconds() / 3600
        held[gpu_id].append((a, b, s_h, e_h))
        held_hours += (b - a) / MEMORY_SLICES * (e_h - s_h)
    whole, servers8, big, stranded_share = [], [], [], []
    for h in range(horizon):
        free_gpus: dict[int, int] = defaultdict(int)
        n_whole = n_big = free_total = free_cut = 0
        for gpu_id, server_id in gpus:
            spans = [(a, b) for a, b, s, e in held[gpu_id] if s < h + 1 and h < e]
            if not spans:
                n_whole += 1
                free_gpus[server_id] += 1
                free_total += MEMORY_SLICES
                n_big += sum(1 for _, _, p in devices[gpu_id] if p.startswith("3g"))
                continue
            # A cut GPU: what is left is bookable only as its free MIG devices (nothing, without MIG).
            for a, b, p in devices[gpu_id]:
                if not any(a < y and x < b for x, y in spans):
                    free_total += b - a
                    free_cut += b - a
                    n_big += p.startswith("3g")
        whole.append(n_whole)
        servers8.append(sum(1 for n in free_gpus.values() if n == GPUS_PER_SERVER))
        big.append(n_big)
        stranded_share.append(free_cut / free_total if free_total else 0.0)
    return {
        "held": held_hours,
        "gpus": len(gpus),
        "whole_free": statistics.fmean(whole),
        "servers_free": statistics.fmean(servers8),
        "big_free": statistics.fmean(big),
        "stranded": statistics.fmean(stranded_share),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", type=int, default=20, help="servers of 8 GPUs in each fleet")
    parser.add_argument("--requests", type=int, default=1200, help="booking requests, the same for each variant")
    parser.add_argument("--fractional", type=float, default=0.45, help="share of the requests that ask for slices")
    parser.add_argument("--load", type=float, default=1.1, help="GPU-hours asked for over the fleet's")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--database", help="a postgres:// URL (default: DATABASE_URL, else bench_fractional)")
    args = parser.parse_args()
    if args.servers < 1 or args.requests < 1:
        parser.error("--servers and --requests must be at least 1")
    if not 0 <= args.fractional <= 1 or args.load <= 0:
        parser.error("--fractional is a share from 0 to 1, --load a positive factor")
    if args.database:
        os.environ["DATABASE_URL"] = args.database

    django_on_fresh_database("fractional", DEFAULT_URL)
    from decimal import Decimal

    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from controlplane.accounts.choices import Role
    from controlplane.accounts.models import Membership, Project
    from controlplane.inventory.models import GpuModel
    from controlplane.ledger.services import ledger_grant

    t0 = time.monotonic()
    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user(username="bench", password="bench-only")
    models = {
        name: GpuModel.objects.create(
            name=name,
            product_name=f"NVIDIA {name}",
            memory_mib=memory,
            billing_weight=Decimal(weight),
            price_per_gpu_hour=Decimal("2"),
        )
        for name, _, memory, weight, _ in MODELS
    }
    projects = {}
    for name, prefix in VARIANTS:
        build_fleet(args.servers, prefix, models)
        projects[name] = Project.objects.create(name=f"Bench {name}", slug=f"bench-{prefix}")
        Membership.objects.create(project=projects[name], user=user, role=Role.OWNER)
        ledger_grant(project=projects[name], amount=Decimal(10**10), actor=None, reason="bench credits")
    gpus = args.servers * GPUS_PER_SERVER
    requests, horizon = workload(args, gpus)
    base = (datetime.now(UTC) + timedelta(hours=2)).replace(minute=0, second=0, microsecond=0)
    n_slice = sum(r.slice for r in requests)
    print(
        f"{args.servers} servers x {GPUS_PER_SERVER} GPUs per fleet ({len(MIG_GPUS) * args.servers} in MIG mode), "
        f"{len(requests)} requests ({n_slice} for slices), horizon {horizon} h, load {args.load:g}, "
        f"seed {args.seed}; set up in {time.monotonic() - t0:.1f} s",
        flush=True,
    )
    results = {}
    for name, prefix in VARIANTS:
        t1 = time.monotonic()
        results[name] = run_variant(name, prefix, requests, base, models, projects[name], user)
        print(f"  {name}: {time.monotonic() - t1:.1f} s", flush=True)
    report(results, gpus, horizon)


def report(results: dict[str, dict[str, Any]], gpus: int, horizon: int) -> None:
    print()
    print(
        f"{'placement':<11} {'GPU-h asked':>11} {'accepted':>9} {'ratio':>6} {'slices':>7} {'whole':>6} | "
        f"{'GPU-h held':>10} {'used':>5} | {'whole GPUs':>10} {'8-GPU srv':>9} {'3g free':>7} {'on cut':>6}"
    )
    for name, r in results.items():
        asked, acc = sum(r["asked"].values()), sum(r["accepted"].values())
        ratio = {k: r["accepted"][k] / r["asked"][k] if r["asked"][k] else float("nan") for k in ("slice", "whole")}
        print(
            f"{name:<11} {asked:>11,.0f} {acc:>9,.0f} {acc / asked:>6.3f} {ratio['slice']:>7.3f} "
            f"{ratio['whole']:>6.3f} | {r['held']:>10,.0f} {r['held'] / (gpus * horizon):>5.2f} | "
            f"{r['whole_free']:>10.1f} {r['servers_free']:>9.2f} {r['big_free']:>7.1f} {r['stranded']:>6.3f}"
        )
    packed = results["packed"]
    for name in ("rounded up", "first-fit"):
        other = results[name]
        total = sum(packed["accepted"].values()) / max(sum(other["accepted"].values()), 1e-9)
        print(
            f"packed against {name}: GPU-h accepted x{total:.3f}, "
            f"slice GPU-h accepted x{packed['accepted']['slice'] / max(other['accepted']['slice'], 1e-9):.3f}, "
            f"whole GPUs free x{packed['whole_free'] / max(other['whole_free'], 1e-9):.3f}"
        )
    print()
    print(f"{'placement':<11} {'kind':<6} {'booked':>7} {'of':>5} | {'p50 ms':>6} {'p95 ms':>6} {'per s':>6}")
    for name, r in results.items():
        for kind in ("slice", "whole"):
            t = r["times"][kind]
            rate = len(t) / sum(t) if t else float("nan")
            label = "slice" if kind == "slice" and name != "rounded up" else ("as GPU" if kind == "slice" else "whole")
            print(
                f"{name:<11} {label:<6} {r['n_ok'][kind]:>7} {r['n_all'][kind]:>5} | {1000 * pct(t, 0.5):>6.1f} "
                f"{1000 * pct(t, 0.95):>6.1f} {rate:>6.1f}"
            )
    t = packed["times"]
    print(
        f"packed: a slice booking's p50 x{pct(t['slice'], 0.5) / pct(t['whole'], 0.5):.2f} a whole-GPU booking's "
        f"(rate x{(len(t['slice']) / sum(t['slice'])) / (len(t['whole']) / sum(t['whole'])):.2f}); "
        f"errors {sum(r['errors'] for r in results.values())}"
    )
    print(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
