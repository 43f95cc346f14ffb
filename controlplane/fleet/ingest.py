"""The heartbeat: the hot path of the control plane.

One heartbeat costs a constant number of statements whatever the number of GPUs and samples: lock the server,
read its GPUs, update the GPUs that changed (one bulk UPDATE), upsert the minute rollups (one statement), write
the events (one bulk INSERT), update the server. Discovery adds a few statements only when the set of GPUs
changes.

Replays: the agent's ``seq`` restarts at 0 when the agent restarts, so a heartbeat is never refused for its seq.
Samples are de-duplicated by time instead: a GPU's ``telemetry_at`` is a watermark, and a sample at or before it
was already folded in (a retransmitted heartbeat, or a buffer sent twice) and is skipped.
"""

from __future__ import annotations

import copy
import functools
import re
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from controlplane.core.errors import PermissionDenied, ValidationFailed
from controlplane.fleet import desired, health
from controlplane.fleet.bulk import bulk_set, update_row
from controlplane.fleet.rollup import MinuteFold, minute_of, write_minutes
from controlplane.inventory.choices import EventKind, GpuHealth, ServerState
from controlplane.inventory.models import Gpu, GpuModel, Server, ServerEvent
from controlplane.inventory.services import server_event
from nodeagent import schema

ONE_MINUTE = timedelta(minutes=1)


def _aware(ts: datetime) -> datetime:
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts


def _catalog_name(product_name: str) -> str:
    name = re.sub(r"^NVIDIA\s+", "", product_name.strip())
    return re.sub(r"[^A-Za-z0-9.]+", "-", name).strip("-")[:56] or "unknown"


def _catalog_for(names: dict[str, int], server: Server, events: list[ServerEvent], actor: str) -> dict[str, GpuModel]:
    """Map NVML product names to catalog entries, adding unknown ones at price 0 and weight 1."""
    found = {m.product_name: m for m in GpuModel.objects.filter(product_name__in=list(names))}
    for product_name, memory_mib in names.items():
        if product_name in found:
            continue
        base = _catalog_name(product_name)
        name, n = base, 1
        while GpuModel.objects.filter(name=name).exists():
            n += 1
            name = f"{base}-{n}"
        model, created = GpuModel.objects.get_or_create(
            product_name=product_name, defaults={"name": name, "memory_mib": memory_mib}
        )
        found[product_name] = model
        if created:
            events.append(
                server_event(
                    server=server,
                    kind=EventKind.GPU_MODEL_ADDED,
                    actor=actor,
                    reason=f"unknown GPU product {product_name!r} added to the catalog as {name} at price 0 and "
                    "billing weight 1; an operator should set its price",
                    data={"gpu_model": model.pk, "product_name": product_name},
                )
            )
    return found


def _apply_facts(gpu: Gpu, facts: schema.GpuFacts, dirty: set[str]) -> None:
    values = {
        "index": facts.index,
        "product_name": facts.name,
        "memory_mib": facts.memory_total_mib,
        "pci_bus_id": facts.pci_bus_id or "",
        "numa_node": facts.numa_node,
        "nvlink_peers": list(facts.nvlink_peers),
    }
    for field, value in values.items():
        if getattr(gpu, field) != value:
            setattr(gpu, field, value)
            dirty.add(field)


def _validate_references(heartbeat: schema.Heartbeat) -> None:
    """Everything that can be refused is refused before anything is written."""
    reported = {g.uuid for g in heartbeat.gpus}
    fields: dict[str, list[str]] = {}
    seen_uuid: set[str] = set()
    seen_index: set[int] = set()
    for i, g in enumerate(heartbeat.gpus):
        if g.uuid in seen_uuid:
            fields[f"gpus.{i}.uuid"] = [f"GPU {g.uuid} is reported twice."]
        if g.index in seen_index:
            fields[f"gpus.{i}.index"] = [f"Index {g.index} is reported twice."]
        seen_uuid.add(g.uuid)
        seen_index.add(g.index)
    for i, s in enumerate(heartbeat.samples):
        if s.uuid not in reported:
            fields[f"samples.{i}.uuid"] = [f"GPU {s.uuid} is not among this heartbeat's gpus."]
            break
    if fields:
        first = next(iter(fields))
        raise ValidationFailed(f"{first}: {fields[first][0]}", fields=fields)


@transaction.atomic
def heartbeat_ingest(
    *, server: Server, heartbeat: schema.Heartbeat, now: datetime | None = None
) -> schema.HeartbeatReply:
    """Take in one heartbeat of ``server``'s agent and answer with the desired state for the node."""
    now = now or timezone.now()
    if heartbeat.node.hostname.lower() != server.hostname:
        raise PermissionDenied(
            "This node credential belongs to another server.",
            code="wrong_node",
            fields={"node.hostname": [f"Expected {server.hostname}."]},
        )
    _validate_references(heartbeat)
    actor = f"agent:{server.hostname}"
    server, found = _lock_server_and_read_gpus(server)
    events: list[ServerEvent] = []

    gpus: dict[str, Gpu] = {g.uuid: g for g in found}
    previous_fields = {uuid: dict(g.telemetry) for uuid, g in gpus.items()}
    reported = {f.uuid: f for f in heartbeat.gpus}
    dirty: set[str] = set()
    changed: dict[str, Gpu] = {}

    # --- discovery: GPUs that left, GPUs that came back, GPUs never seen here ---------------------------
    for uuid, gpu in gpus.items():
        facts = reported.get(uuid)
        if facts is None:
            if gpu.present:
                gpu.present = False
                dirty.add("present")
                changed[uuid] = gpu
                events.append(
                    server_event(
                        server=server,
                        gpu=gpu,
                        kind=EventKind.GPU_MISSING,
                        actor=actor,
                        at=now,
                        reason=f"GPU {gpu.index} ({uuid}) is no longer reported",
                    )
                )
            continue
        if not gpu.present:
            gpu.present = True
            dirty.add("present")
            events.append(
                server_event(
                    server=server,
                    gpu=gpu,
                    kind=EventKind.GPU_RETURNED,
                    actor=actor,
                    at=now,
                    reason=f"GPU {facts.index} ({uuid}) is reported again",
                )
            )
        _apply_facts(gpu, facts, dirty)
        gpu.last_seen_at = now
        changed[uuid] = gpu
    dirty.add("last_seen_at")

    new_uuids = [uuid for uuid in reported if uuid not in gpus]
    created: list[Gpu] = []
    if new_uuids:
        # A card moved here from another server keeps its row (and history); it changes server.
        for gpu in Gpu.objects.filter(uuid__in=new_uuids).select_related("server"):
            events.append(
                server_event(
                    server=server,
                    gpu=gpu,
                    kind=EventKind.GPU_ADDED,
                    actor=actor,
                    at=now,
                    reason=f"GPU {gpu.uuid} moved here from {gpu.server.hostname}",
                    data={"from_server": gpu.server.hostname},
                )
            )
            gpu.server = server
            gpu.present = True
            gpu.last_seen_at = now
            _apply_facts(gpu, reported[gpu.uuid], dirty)
            dirty.update({"server", "present"})
            gpus[gpu.uuid] = changed[gpu.uuid] = gpu
            previous_fields[gpu.uuid] = dict(gpu.telemetry)
        unknown = [uuid for uuid in new_uuids if uuid not in gpus]
        if unknown:
            catalog = _catalog_for(
                {reported[u].name: reported[u].memory_total_mib for u in unknown}, server, events, actor
            )
            for uuid in unknown:
                facts = reported[uuid]
                gpu = Gpu(server=server, uuid=uuid, model=catalog[facts.name], last_seen_at=now, present=True)
                _apply_facts(gpu, facts, set())
                created.append(gpu)
                gpus[uuid] = gpu
                previous_fields[uuid] = {}

    # --- samples: latest reading per GPU, minute folds, skipping what was folded before ---------------------
    per_gpu: dict[str, list[schema.GpuSample]] = defaultdict(list)
    for sample in heartbeat.samples:
        per_gpu[sample.uuid].append(sample)
    accepted: dict[str, list[schema.GpuSample]] = {}
    for uuid, samples in per_gpu.items():
        gpu = gpus[uuid]
        watermark = gpu.telemetry_at
        fresh = sorted((s for s in samples if watermark is None or _aware(s.ts) > watermark), key=lambda s: s.ts)
        if not fresh:
            continue
        accepted[uuid] = fresh
        gpu.telemetry = {k: v for k, v in fresh[-1].fields.items() if v is not None}
        gpu.telemetry_at = _aware(fresh[-1].ts)
        dirty.update({"telemetry", "telemetry_at"})

    xids: dict[str, list[int]] = defaultdict(list)
    for event in heartbeat.events:
        if event.kind == "xid" and event.uuid in gpus and event.xid is not None:
            xids[event.uuid].append(event.xid)

    # --- health ---------------------------------------------------------------------------------------------
    limit = settings.FLEET_GPU_TEMP_LIMIT_C
    for uuid, gpu in gpus.items():
        verdict = health.evaluate(
            current_reasons=gpu.health_reasons,
            present=uuid in reported,
            previous_fields=previous_fields[uuid],
            new_samples=[s.fields for s in accepted.get(uuid, ())],
            xids=xids.get(uuid, ()),
            temp_limit_c=limit,
        )
        to_health = GpuHealth.HEALTHY if verdict.healthy else GpuHealth.UNHEALTHY
        if (
            list(verdict.reasons) == list(gpu.health_reasons)
            and verdict.needs_acknowledgement == gpu.needs_acknowledgement
            and to_health == gpu.health
        ):
            continue
        raised = [r for r in verdict.reasons if r not in gpu.health_reasons]
        cleared = [r for r in gpu.health_reasons if r not in verdict.reasons]
        if gpu.pk is not None:
            events.append(
                server_event(
                    server=server,
                    gpu=gpu,
                    kind=EventKind.GPU_HEALTH,
                    actor=actor,
                    at=now,
                    from_state=gpu.health,
                    to_state=to_health,
                    reason=_health_sentence(gpu, raised, cleared, verdict),
                    data={
                        "reasons": list(verdict.reasons),
                        "raised": raised,
                        "cleared": cleared,
                        "xids": xids.get(uuid, []),
                        "needs_acknowledgement": verdict.needs_acknowledgement,
                    },
                )
            )
        gpu.health, gpu.health_reasons = to_health, list(verdict.reasons)
        gpu.needs_acknowledgement = verdict.needs_acknowledgement
        dirty.update({"health", "health_reasons", "needs_acknowledgement"})
        if gpu.pk is not None:
            changed[uuid] = gpu

    # --- writes: updates before inserts, so a replacement card can take a missing card's index -----------
    if changed:
        bulk_set(list(changed.values()), sorted(dirty))
    if created:
        Gpu.objects.bulk_create(created)
        for gpu in created:
            events.append(
                server_event(
                    server=server,
                    gpu=gpu,
                    kind=EventKind.GPU_ADDED,
                    actor=actor,
                    at=now,
                    reason=f"GPU {gpu.index} ({gpu.uuid}, {gpu.product_name}) discovered",
                    data={"gpu_model": gpu.model_id},
                )
            )
            if gpu.health != GpuHealth.HEALTHY:
                events.append(
                    server_event(
                        server=server,
                        gpu=gpu,
                        kind=EventKind.GPU_HEALTH,
                        actor=actor,
                        at=now,
                        from_state=GpuHealth.HEALTHY,
                        to_state=gpu.health,
                        reason=f"GPU {gpu.index} discovered unhealthy: " + ", ".join(gpu.health_reasons),
                        data={"reasons": gpu.health_reasons},
                    )
                )

    folds: dict[tuple[int, datetime], MinuteFold] = {}
    for uuid, samples in accepted.items():
        gpu_id = gpus[uuid].pk
        # Samples are in time order: split them into runs of one minute, then fold each run at once.
        run: list[dict[str, float | None]] = []
        minute = ends = None
        for sample in samples:
            if ends is None or _aware(sample.ts) >= ends:
                if run:
                    folds.setdefault((gpu_id, minute), MinuteFold()).add_all(run)  # type: ignore[arg-type]
                minute = minute_of(sample.ts)
                ends = minute + ONE_MINUTE
                run = []
            run.append(sample.fields)
        if run:
            folds.setdefault((gpu_id, minute), MinuteFold()).add_all(run)  # type: ignore[arg-type]
    write_minutes(folds)

    updates: dict[str, Any] = {
        "last_heartbeat_at": now,
        "last_heartbeat_seq": heartbeat.seq,
        "agent_version": heartbeat.node.agent_version,
        "facts": heartbeat.node.model_dump(mode="json"),
        "simulated": heartbeat.node.simulated,
    }
    if server.state == ServerState.OFFLINE:
        back_to = server.state_before_offline or ServerState.COMMISSIONING
        updates.update(state=back_to, state_before_offline="")
        events.append(
            server_event(
                server=server,
                kind=EventKind.STATE,
                actor=actor,
                at=now,
                from_state=ServerState.OFFLINE,
                to_state=back_to,
                reason="heartbeats resumed",
                data={"seq": heartbeat.seq},
            )
        )
    update_row(server, updates)
    for field, value in updates.items():
        setattr(server, field, value)
    if events:
        ServerEvent.objects.bulk_create(events)

    if heartbeat.containers:
        desired.containers_reported(server, heartbeat.containers, now)
    wanted, stop = desired.desired_state_for(server)
    return schema.HeartbeatReply(
        server=server.hostname,
        server_state=server.state,
        heartbeat_interval_s=server.heartbeat_interval_s,
        desired=wanted,
        stop=stop,
    )


_SERVER_FIELDS = ("state", "state_before_offline", "heartbeat_interval_s")


@functools.cache
def _server_and_gpus_sql() -> str:
    qn = connection.ops.quote_name
    server_columns = ", ".join(f"s.{qn(name)} AS server_{name}" for name in _SERVER_FIELDS)
    # PostgreSQL refuses FOR UPDATE on the nullable side of an outer join: only the server row is locked.
    # SQLite has no row locks; its IMMEDIATE transactions already serialise writers.
    lock = " FOR UPDATE OF s" if connection.features.has_select_for_update_of else ""
    return (
        f"SELECT g.*, {server_columns} FROM {qn(Server._meta.db_table)} s "  # noqa: S608 - identifiers only
        f"LEFT JOIN {qn(Gpu._meta.db_table)} g ON g.server_id = s.id WHERE s.id = %s{lock}"
    )


def _lock_server_and_read_gpus(server: Server) -> tuple[Server, list[Gpu]]:
    """Lock the server row and read its GPUs in one statement; the server comes back with its state re-read.

    The row lock serialises heartbeats of one server (an agent retrying while the first is still in flight),
    and the state read under it is the one the heartbeat acts on (node-loss detection may have just moved it).
    """
    rows = list(Gpu.objects.raw(_server_and_gpus_sql(), [server.pk]))
    if not rows:
        raise Server.DoesNotExist(f"server {server.pk} no longer exists")
    locked = copy.copy(server)
    for name in _SERVER_FIELDS:
        setattr(locked, name, rows[0].__dict__[f"server_{name}"])
    gpus = [gpu for gpu in rows if gpu.pk is not None]  # a server without GPUs comes back as one empty row
    for gpu in gpus:
        gpu.server = locked
    return locked, gpus


def _health_sentence(gpu: Gpu, raised: list[str], cleared: list[str], verdict: health.Health) -> str:
    parts = []
    if raised:
        parts.append("raised " + ", ".join(raised))
    if cleared:
        parts.append("cleared " + ", ".join(cleared))
    state = "healthy" if verdict.healthy else "unhealthy"
    tail = "; needs an operator's acknowledgement" if verdict.needs_acknowledgement else ""
    return f"GPU {gpu.index} ({gpu.uuid}) {state}: {'; '.join(parts)}{tail}"
