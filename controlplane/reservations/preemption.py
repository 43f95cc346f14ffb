"""Preemption: which preemptible reservations a non-preemptible booking cuts short to get its GPUs.

A booking that placement cannot fill (``services._place_and_allocate``) asks ``preempt_for`` before it
refuses. The rule (docs/reservations.md, "Preemption"):

* Only **preemptible** reservations are victims; an advance reservation (and any non-preemptible one) is
  never cut, and a preemptible booking never preempts.
* A victim can only be cut at an instant at least its ``notice_seconds`` from now, or before it starts (it
  then never runs). A booking whose window starts sooner cannot take its GPUs: it is placed elsewhere or
  refused, and the refusal says when the preemptible GPUs could yield (``yields_at``).
* The **fewest** victims, then the fewest GPUs they hold, then the most recently started, and only victims
  holding a GPU the winner is placed on: the victim sets are tried smallest first, each through the one
  placement rule (``placement.place``) over the GPUs that set would free.
* Each victim is cut to end at the winner's start by ``services.reservation_yield``, in the booking's
  transaction: the booking then places again, on GPUs now free, under the same locks and the same
  exclusion constraint as any booking.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from controlplane.inventory.choices import GpuHealth
from controlplane.reservations.choices import CHANGEABLE_STATES
from controlplane.reservations.models import Allocation, Reservation
from controlplane.reservations.placement import GpuSlot, ServerCandidate, place
from controlplane.reservations.selectors import _spec_q, overlapping, placeable_gpus
from controlplane.reservations.specs import GpuSpec, Window

# The victim sets tried, smallest first, before preemption gives up: enough for every set of up to three
# victims among the sixteen candidates that rank first, and bounded whatever the fleet.
MAX_VICTIMS_CONSIDERED = 16
MAX_SETS = 1500


@dataclass(frozen=True)
class Victim:
    reservation_id: int
    public_id: str
    gpu_ids: frozenset[int]
    starts_at: datetime
    notice_seconds: int

    def cuttable_at(self, at: datetime, *, now: datetime) -> bool:
        """Whether cutting it to end at ``at`` gives it its notice (or it would never have started)."""
        return at <= self.starts_at or at >= now + timedelta(seconds=self.notice_seconds)

    def earliest_cut(self, *, now: datetime) -> datetime:
        return now + timedelta(seconds=self.notice_seconds)


@dataclass(frozen=True)
class Plan:
    victims: tuple[Victim, ...]
    gpu_ids: tuple[int, ...]  # what the winner would be placed on


@dataclass(frozen=True)
class Outcome:
    preempted: tuple[Victim, ...] = ()
    # When nothing could be cut now because the notice is too short: the earliest instant the preemptible
    # reservations could yield enough GPUs for a window of this length.
    yields_at: datetime | None = None


def _victims_and_servers(
    spec: GpuSpec, window: Window, *, now: datetime, exclude: Iterable[int], honour_notice: bool
) -> tuple[list[Victim], list[tuple[int, str, int, list[Any]]], dict[int, frozenset[int]]]:
    """The candidate victims, the servers with their matching GPUs, and per GPU the victims holding it
    (a GPU held by anything that cannot be cut is left out)."""
    gpus = list(
        placeable_gpus(spec)
        .exclude(pk__in=list(exclude))
        .values_list("pk", "server_id", "server__hostname", "index", "numa_node", "nvlink_peers", "uuid")
    )
    if spec.whole_servers is not None:
        matching_gpus = placeable_gpus(spec).filter(_spec_q(spec), health=GpuHealth.HEALTHY)
        matching = set(matching_gpus.values_list("pk", flat=True))
    else:
        matching = {row[0] for row in gpus}
    held = overlapping(Allocation.objects.filter(gpu_id__in=[row[0] for row in gpus]), window.starts_at, window.ends_at)
    holders: dict[int, set[int]] = defaultdict(set)
    for gpu_id, reservation_id in held.values_list("gpu_id", "reservation_id"):
        holders[gpu_id].add(reservation_id)
    candidates = {
        r.pk: r
        for r in Reservation.objects.filter(
            pk__in={rid for rids in holders.values() for rid in rids}, preemptible=True, state__in=CHANGEABLE_STATES
        )
    }
    victims: dict[int, Victim] = {}
    for rid, r in candidates.items():
        victim = Victim(
            rid,
            str(r.public_id),
            frozenset(g for g, rids in holders.items() if rid in rids),
            r.starts_at,
            r.notice_seconds,
        )
        if not honour_notice or victim.cuttable_at(window.starts_at, now=now):
            victims[rid] = victim
    by_gpu: dict[int, frozenset[int]] = {}
    for row in gpus:
        rids = holders.get(row[0], set())
        if all(rid in victims for rid in rids):
            by_gpu[row[0]] = frozenset(rids)
    servers: dict[int, tuple[int, str, int, list[Any]]] = {}
    for row in gpus:
        sid = row[1]
        if sid not in servers:
            servers[sid] = (sid, row[2], 0, [])
        entry = servers[sid]
        servers[sid] = (sid, entry[1], entry[2] + (row[0] in matching), entry[3])
        entry[3].append(row)
    return list(victims.values()), list(servers.values()), by_gpu


def _candidates(
    servers: list[tuple[int, str, int, list[Any]]],
    by_gpu: dict[int, frozenset[int]],
    freed: frozenset[int],
    spec: GpuSpec,
) -> list[ServerCandidate]:
    """The servers as placement sees them once the victims ``freed`` are cut."""
    out = []
    for sid, hostname, matching, rows in servers:
        ids_by_uuid = {row[6]: row[0] for row in rows}
        free = []
        for gid, _sid, _host, index, numa, peers, _uuid in rows:
            if gid in by_gpu and by_gpu[gid] <= freed:
                peer_list = json.loads(peers) if isinstance(peers, str) else peers or []
                free.append(GpuSlot(gid, index, numa, frozenset(ids_by_uuid[p] for p in peer_list if p in ids_by_uuid)))
        total = matching if spec.whole_servers is None else len(rows)
        whole = spec.whole_servers is not None and matching == len(rows) and len(free) == len(rows)
        out.append(ServerCandidate(sid, hostname, total, tuple(free), whole))
    return out


def _any_preemptible(window: Window) -> bool:
    """One indexed read that spares a refusal the fleet-wide one when nothing preemptible overlaps the window
    (the usual case: every no_capacity of a non-preemptible booking asks)."""
    return Reservation.objects.filter(
        preemptible=True, state__in=CHANGEABLE_STATES, starts_at__lt=window.ends_at, ends_at__gt=window.starts_at
    ).exists()


def plan(
    spec: GpuSpec, window: Window, *, now: datetime, exclude: Iterable[int] = (), honour_notice: bool = True
) -> Plan | None:
    """The victims to cut so that ``spec`` can be placed over ``window``, or None when no set of them does."""
    if not _any_preemptible(window):
        return None
    victims, servers, by_gpu = _victims_and_servers(spec, window, now=now, exclude=exclude, honour_notice=honour_notice)
    if not victims:
        return None
    # Fewest GPUs first, then the most recently started: the cheapest loss of work to try first.
    ranked = sorted(victims, key=lambda v: (len(v.gpu_ids), -v.starts_at.timestamp(), v.reservation_id))
    ranked = ranked[:MAX_VICTIMS_CONSIDERED]
    tried = 0
    for size in range(1, len(ranked) + 1):
        best: tuple[tuple[int, float], Plan] | None = None
        for combo in itertools.combinations(ranked, size):
            tried += 1
            if tried > MAX_SETS:
                break
            freed = frozenset(v.reservation_id for v in combo)
            gpu_ids = place(
                _candidates(servers, by_gpu, freed, spec), gpu_count=spec.gpu_count, whole_servers=spec.whole_servers
            )
            if gpu_ids is None:
                continue
            chosen = set(gpu_ids)
            # Only victims holding a GPU the winner takes: a set with one that holds none is not minimal.
            if any(not (v.gpu_ids & chosen) for v in combo):
                continue
            key = (sum(len(v.gpu_ids) for v in combo), -max(v.starts_at.timestamp() for v in combo))
            if best is None or key < best[0]:
                best = (key, Plan(tuple(combo), tuple(sorted(gpu_ids))))
        if best is not None:
            return best[1]
        if tried > MAX_SETS:
            return None
    return None


def preempt_for(
    *, winner: Reservation, spec: GpuSpec, window: Window, actor: Any, now: datetime, exclude: Iterable[int] = ()
) -> Outcome:
    """Cut the victims ``plan`` chooses short, to end at the winner's start; caller is the winner's booking
    transaction. When the notice rules every set out, ``yields_at`` says from when one would do."""
    from controlplane.reservations.services import reservation_yield

    if winner.preemptible:
        return Outcome()
    chosen = plan(spec, window, now=now, exclude=exclude)
    if chosen is None:
        ignoring = plan(spec, window, now=now, exclude=exclude, honour_notice=False)
        if ignoring is None:
            return Outcome()
        return Outcome(yields_at=max(v.earliest_cut(now=now) for v in ignoring.victims))
    for victim in chosen.victims:
        reservation_yield(
            reservation=Reservation.objects.get(pk=victim.reservation_id),
            end_at=window.starts_at,
            notice_seconds=victim.notice_seconds,
            reason=f"preempted by reservation {winner.public_id}",
            by=winner,
            actor=actor,
            now=now,
        )
    return Outcome(preempted=chosen.victims)


def earliest_preempting_start(spec: GpuSpec, duration: timedelta, *, now: datetime) -> datetime | None:
    """The earliest start at which a non-preemptible booking of ``spec`` for ``duration`` could take GPUs
    from preemptible reservations (their notice counted), or None when cutting them would not make room.
    The queue's pass books a waiting higher-class request from there (docs/scheduling.md)."""
    found = plan(spec, Window(now, now + duration), now=now, honour_notice=False)
    if found is None:
        return None
    start = max(v.earliest_cut(now=now) for v in found.victims)
    return start if plan(spec, Window(start, start + duration), now=now) is not None else None
