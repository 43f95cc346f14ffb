"""The heartbeat: the hot path of the control plane.

One heartbeat costs a constant number of statements whatever the number of GPUs and samples: verify the
credential, lock the server and read its GPUs (one statement); update the GPUs that changed, upsert the minute
rollups and update the server (on PostgreSQL one statement, with dispatch's probe riding along); write the
events (one bulk INSERT, only when there are any). Discovery adds a few statements only when the set of GPUs
changes.

Replays: the agent's ``seq`` restarts at 0 when the agent restarts, so a heartbeat is never refused for its seq.
Samples are de-duplicated by time instead: a GPU's ``telemetry_at`` is a watermark, and a sample at or before it
was already folded in (a retransmitted heartbeat, or a buffer sent twice) and is skipped.
"""

from __future__ import annotations

import functools
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from controlplane.core import domain_events, rows, tokens
from controlplane.core.errors import PermissionDenied, ValidationFailed
from controlplane.fleet import desired, fencing, health
from controlplane.fleet import mig as fleet_mig
from controlplane.fleet.authentication import CredentialRefused
from controlplane.fleet.bulk import Statement, bulk_set_statement, execute_together, update_row_statement
from controlplane.fleet.models import NodeCredential
from controlplane.fleet.rollup import MinuteFold, minutes_statement
from controlplane.fleet.samples import GpuColumns, columns_by_gpu, from_us, to_us
from controlplane.inventory.choices import EventKind, GpuHealth, ServerState
from controlplane.inventory.models import Gpu, GpuModel, Server, ServerEvent
from controlplane.inventory.services import server_event
from nodeagent import schema


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
            product_name=product_name,
            defaults={"name": name, "memory_mib": memory_mib, "vendor": fleet_mig.vendor_of(product_name)},
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
        **fleet_mig.reported_values(facts),
    }
    for field, value in values.items():
        if getattr(gpu, field) != value:
            setattr(gpu, field, value)
            dirty.add(field)


def _validate_references(heartbeat: schema.Heartbeat | schema.HeartbeatV1) -> None:
    """Everything that can be refused is refused before anything is written."""
    reported = {g.uuid for g in heartbeat.gpus}
    fields: dict[str, list[str]] = {}
    seen_uuid: set[str] = set()
    seen_index: set[int] = set()
    seen_mig: set[str] = set()
    for i, g in enumerate(heartbeat.gpus):
        if g.uuid in seen_uuid:
            fields[f"gpus.{i}.uuid"] = [f"GPU {g.uuid} is reported twice."]
        if g.index in seen_index:
            fields[f"gpus.{i}.index"] = [f"Index {g.index} is reported twice."]
        seen_uuid.add(g.uuid)
        seen_index.add(g.index)
        for j, d in enumerate(g.mig.devices if g.mig is not None else ()):
            if d.uuid in seen_mig:
                fields[f"gpus.{i}.mig.devices.{j}.uuid"] = [f"MIG device {d.uuid} is reported twice."]
            seen_mig.add(d.uuid)
    samples: Sequence[schema.GpuSample | schema.GpuSeries] = heartbeat.samples
    for i, s in enumerate(samples):
        if s.uuid not in reported:
            fields[f"samples.{i}.uuid"] = [f"GPU {s.uuid} is not among this heartbeat's gpus."]
            break
    if fields:
        first = next(iter(fields))
        raise ValidationFailed(f"{first}: {fields[first][0]}", fields=fields)


@transaction.atomic
def heartbeat_ingest(
    *, server: Server, heartbeat: schema.Heartbeat | schema.HeartbeatV1, now: datetime | None = None
) -> schema.HeartbeatReply:
    """Take in one heartbeat of ``server``'s agent and answer with the desired state for the node."""
    _check_node(server, heartbeat)
    _validate_references(heartbeat)
    locked, gpus = _lock_server_and_read_gpus(server)
    return _ingest(locked, gpus, heartbeat, now or timezone.now())


@transaction.atomic
def heartbeat_ingest_with_credential(
    *, credential: str, heartbeat: schema.Heartbeat | schema.HeartbeatV1, now: datetime | None = None
) -> schema.HeartbeatReply:
    """``heartbeat_ingest`` for the agent endpoint: the node credential is verified by the statement that locks
    its server and reads the GPUs, so a heartbeat costs no statement of its own for authentication. A refused
    credential raises ``CredentialRefused`` before anything is written."""
    server, gpus = _lock_server_and_read_gpus_for_credential(credential)
    _check_node(server, heartbeat)
    _validate_references(heartbeat)
    return _ingest(server, gpus, heartbeat, now or timezone.now())


def _check_node(server: Server, heartbeat: schema.Heartbeat | schema.HeartbeatV1) -> None:
    if heartbeat.node.hostname.lower() != server.hostname:
        raise PermissionDenied(
            "This node credential belongs to another server.",
            code="wrong_node",
            fields={"node.hostname": [f"Expected {server.hostname}."]},
        )


def _ingest(
    server: Server, found: list[Gpu], heartbeat: schema.Heartbeat | schema.HeartbeatV1, now: datetime
) -> schema.HeartbeatReply:
    actor = f"agent:{server.hostname}"
    events: list[ServerEvent] = []

    gpus: dict[str, Gpu] = {g.uuid: g for g in found}
    places = {g.uuid: _place(g) for g in found}
    previous_fields = {uuid: dict(g.telemetry) for uuid, g in gpus.items()}
    previous_mig = {uuid: g.mig for uuid, g in gpus.items()}
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
            places[gpu.uuid] = _place(gpu)
            previous_mig[gpu.uuid] = gpu.mig  # its devices follow what it reports here, MIG off included
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
    accepted: dict[str, GpuColumns] = {}
    for uuid, columns in columns_by_gpu(heartbeat).items():
        gpu = gpus[uuid]
        fresh = columns.after(None if gpu.telemetry_at is None else to_us(gpu.telemetry_at))
        if not fresh.ts:
            continue
        accepted[uuid] = fresh
        gpu.telemetry = {k: v for k, v in fresh.latest().items() if v is not None}
        gpu.telemetry_at = from_us(fresh.ts[-1])
        dirty.update({"telemetry", "telemetry_at"})

    xids: dict[str, list[int]] = defaultdict(list)
    for event in heartbeat.events:
        if event.kind == "xid" and event.uuid in gpus and event.xid is not None:
            xids[event.uuid].append(event.xid)

    # --- health ---------------------------------------------------------------------------------------------
    limit = settings.FLEET_GPU_TEMP_LIMIT_C
    for uuid, gpu in gpus.items():
        new = accepted.get(uuid)
        verdict = health.evaluate(
            current_reasons=gpu.health_reasons,
            present=uuid in reported,
            previous_fields=previous_fields[uuid],
            dbe_readings=new.fields.get(schema.ECC_DBE_VOL, ()) if new else (),
            latest=new.latest() if new else None,
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
    # A steady heartbeat's three writes (GPUs, minutes, server) go to the database together: one round trip.
    writes: list[Statement] = []
    if changed:
        if _vacate_places(changed, places):
            dirty.add("present")  # back for those of them reported
        writes.append(bulk_set_statement(list(changed.values()), sorted(dirty)))
    if created:
        execute_together(writes)
        writes = []
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
    for uuid, columns in accepted.items():
        columns.fold_into(folds, gpus[uuid].pk)
    minutes = minutes_statement(folds)
    if minutes is not None:
        writes.append(minutes)

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
    writes.append(update_row_statement(server, updates))
    # Dispatch's probe reads launches and reservations, which neither these writes nor the events touch: it
    # rides along with them. Reported containers change launches first, so then it runs after them, on its own.
    probe_at = timezone.now()
    probe = None if heartbeat.containers else desired.work_probe(server, probe_at)
    work = execute_together(writes, query=probe)
    for field, value in updates.items():
        setattr(server, field, value)
    fleet_mig.after_ingest(
        server=server, gpus=gpus, before=previous_mig, agent_events=heartbeat.events, events=events, actor=actor,
        now=now,
    )  # fmt: skip
    if events:
        ServerEvent.objects.bulk_create(events)
        domain_events.publish("server", events)

    sessions = [event for event in heartbeat.events if event.kind == "session" and event.session is not None]
    if sessions:
        desired.sessions_reported(server, sessions, now)
    usages = getattr(heartbeat, "volumes", None)
    if usages:
        desired.volumes_reported(server, usages, now)
    images = getattr(heartbeat, "images", None)
    if images:
        desired.images_reported(server, images, now)
    if heartbeat.containers:
        desired.containers_reported(server, heartbeat.containers, now)
        wanted, stop = desired.desired_state_for(server)
    else:
        wanted, stop = desired.desired_state_for(server, now=probe_at, has_work=work is not None)
    return schema.HeartbeatReply(
        server=server.hostname,
        server_state=server.state,
        heartbeat_interval_s=server.heartbeat_interval_s,
        desired=wanted,
        stop=stop,
        # Only to an agent that fences: an older one would refuse a reply with a field it does not know.
        lease_s=fencing.lease_s(server.heartbeat_interval_s) if heartbeat.node.fencing else None,
        outage_tolerance_s=fencing.outage_tolerance_s() if heartbeat.node.outage_tolerant else None,
        mig=fleet_mig.desired_for(gpus.values()),
        # Only to an agent that pulls: an older one would refuse a reply with a field it does not know.
        prepull=desired.prepull_for(server, probe_at) if heartbeat.node.pulls else [],
    )


# Columns of the server the heartbeat overwrites or never reads: the join repeats the server's columns on every
# GPU's row, and the driver would decode each of them once per GPU.
_SERVER_DEFERRED = frozenset({"facts", "last_heartbeat_at", "created_at"})


def _gpus_sql(where: str, credential: bool) -> str:
    qn = connection.ops.quote_name
    server, gpu = qn(Server._meta.db_table), qn(Gpu._meta.db_table)
    columns = [rows.select_list(Server, "s", "s_", _SERVER_DEFERRED), rows.select_list(Gpu, "g", "g_")]
    joins = f"{server} s LEFT JOIN {gpu} g ON g.server_id = s.id"
    if credential:
        columns.insert(0, "c.id, c.digest, c.revoked_at")
        joins = (
            f"{qn(NodeCredential._meta.db_table)} c JOIN {server} s ON s.id = c.server_id "
            f"LEFT JOIN {gpu} g ON g.server_id = s.id"
        )
    # PostgreSQL refuses FOR UPDATE on the nullable side of an outer join: only the server row is locked.
    # SQLite has no row locks; its IMMEDIATE transactions already serialise writers.
    # NO KEY UPDATE: it serialises this server's heartbeats as FOR UPDATE did, but not the FOR KEY SHARE that
    # PostgreSQL takes on the server row for every insert referencing it (a launch, an allocation). With FOR
    # UPDATE, a window opening (project lock, then a launch's key share on the server) and a heartbeat finishing
    # a reservation (server lock, then the project lock) deadlocked under load, failing heartbeats for seconds.
    lock = " FOR NO KEY UPDATE OF s" if connection.features.has_select_for_update_of else ""
    return f"SELECT {', '.join(columns)} FROM {joins} WHERE {where}{lock}"  # noqa: S608 - identifiers only


@functools.cache
def _server_and_gpus_sql(vendor: str) -> str:
    return _gpus_sql("s.id = %s", credential=False)


@functools.cache
def _credential_server_and_gpus_sql(vendor: str) -> str:
    return _gpus_sql("c.lookup = %s", credential=True)


def _server_and_gpus(found: Sequence[Sequence[Any]], offset: int) -> tuple[Server, list[Gpu]]:
    width = rows.width(Server, _SERVER_DEFERRED)
    server = rows.build(Server, found[0][offset : offset + width], _SERVER_DEFERRED)
    gpus = []
    for row in found:
        values = row[offset + width :]
        if values[0] is None:
            continue  # a server without GPUs comes back as one row of nulls on the GPU side
        gpu = rows.build(Gpu, values)
        gpu.server = server
        gpus.append(gpu)
    return server, gpus


def _lock_server_and_read_gpus(server: Server) -> tuple[Server, list[Gpu]]:
    """Lock the server row and read it and its GPUs in one statement.

    The row lock serialises heartbeats of one server (an agent retrying while the first is still in flight),
    and the state read under it is the one the heartbeat acts on (node-loss detection may have just moved it).
    """
    with connection.cursor() as cursor:
        cursor.execute(_server_and_gpus_sql(connection.vendor), [server.pk])
        found = cursor.fetchall()
    if not found:
        raise Server.DoesNotExist(f"server {server.pk} no longer exists")
    return _server_and_gpus(found, 0)


def _lock_server_and_read_gpus_for_credential(credential: str) -> tuple[Server, list[Gpu]]:
    """``_lock_server_and_read_gpus`` found by the node credential, which it verifies: unknown, forged or
    revoked is ``CredentialRefused``. The credential row is read, not locked: a revocation committed meanwhile
    refuses the next heartbeat, as it did when authentication ran before the transaction."""
    lookup = tokens.parse(credential, tokens.NODE_CREDENTIAL)
    if lookup is None:
        raise CredentialRefused("The bearer token is not a node credential.")
    with connection.cursor() as cursor:
        cursor.execute(_credential_server_and_gpus_sql(connection.vendor), [lookup])
        found = cursor.fetchall()
    if not found or not tokens.matches(credential, found[0][1]):
        raise CredentialRefused("The node credential is not valid.")
    if found[0][2] is not None:
        raise CredentialRefused("The node credential was revoked; enroll the node again.")
    return _server_and_gpus(found, 3)


def _place(gpu: Gpu) -> tuple[int, int] | None:
    """Where the GPU sits in the one-index-per-present-GPU constraint (``gpu_unique_index_per_server``)."""
    return (gpu.server_id, gpu.index) if gpu.present else None


def _vacate_places(changed: Mapping[str, Gpu], before: Mapping[str, tuple[int, int] | None]) -> bool:
    """Let GPUs take places that others give up in the same heartbeat: indexes swapped (cards reseated, the
    enumeration changed), a card moved in or back at the index of one that went missing.

    The heartbeat validated that the reported indexes are distinct, so the end state is valid; but both engines
    check a unique index row by row inside one UPDATE, so a GPU taking an index another GPU only gives up later
    in that statement fails it. When any GPU takes a new place, those leaving theirs leave first (present off,
    one statement; the GPUs' update then sets the end state). A steady heartbeat costs nothing here. True when
    they left: the update must then write ``present`` too."""
    if not any(_place(g) is not None and _place(g) != before.get(uuid) for uuid, g in changed.items()):
        return False
    leaving = [g.pk for uuid, g in changed.items() if before.get(uuid) is not None and _place(g) != before[uuid]]
    return bool(leaving) and Gpu.objects.filter(pk__in=leaving).update(present=False) > 0


def _health_sentence(gpu: Gpu, raised: list[str], cleared: list[str], verdict: health.Health) -> str:
    parts = []
    if raised:
        parts.append("raised " + ", ".join(raised))
    if cleared:
        parts.append("cleared " + ", ".join(cleared))
    state = "healthy" if verdict.healthy else "unhealthy"
    tail = "; needs an operator's acknowledgement" if verdict.needs_acknowledgement else ""
    return f"GPU {gpu.index} ({gpu.uuid}) {state}: {'; '.join(parts)}{tail}"
