"""MIG in the fleet: the devices agents report, kept as MigDevice rows under their GPU, and an operator's
reconfiguration of a GPU's layout, carried to its agent in the heartbeat reply until the agent reports the
outcome (docs/fractional.md).

The heartbeat's cost stays constant: the reported MIG state is a JSON column of the GPU row, compared in memory
and written with the GPU's other changed columns; the MigDevice rows are rewritten only when it changed, and
the reconfiguration's rows only when the agent reports an outcome.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from django.db import transaction

from controlplane.core.errors import Conflict, ValidationFailed
from controlplane.inventory.choices import EventKind, MigChange, ServerState, Vendor
from controlplane.inventory.models import Gpu, MigDevice, ServerEvent
from controlplane.inventory.services import server_event
from controlplane.reservations.holders import gpus_holding
from nodeagent import schema
from nodeagent.mig import PROFILES, LayoutError, place

_OUTCOME_KIND = {
    "applied": EventKind.MIG_APPLIED,
    "refused": EventKind.MIG_REFUSED,
    "reset_required": EventKind.MIG_RESET_REQUIRED,
}
_OUTCOME_CHANGE = {"applied": MigChange.NONE, "refused": MigChange.REFUSED, "reset_required": MigChange.RESET_REQUIRED}


def vendor_of(product_name: str) -> str:
    """The vendor of a product the catalog does not know yet, from the name its backend reports."""
    return Vendor.AMD if product_name.strip().upper().startswith("AMD") else Vendor.NVIDIA


def reported_values(facts: schema.GpuFacts) -> dict[str, Any]:
    """The GPU row's columns the MIG and vendor facts set (compared and written with the other facts)."""
    return {"vendor": facts.vendor, "mig": facts.mig.model_dump(mode="json") if facts.mig is not None else None}


def after_ingest(
    *,
    server: Any,
    gpus: Mapping[str, Gpu],
    before: Mapping[str, Any],
    agent_events: Sequence[schema.AgentEvent],
    events: list[ServerEvent],
    actor: str,
    now: datetime,
) -> None:
    """Follow a heartbeat's MIG facts (MigDevice rows of the GPUs whose MIG state changed) and its "mig"
    events (the outcome of a reconfiguration). Appends the server events it makes to ``events``."""
    # GPUs already here whose MIG state changed, and GPUs new here (discovered, or moved in) reporting one.
    changed = [g for uuid, g in gpus.items() if (g.mig != before[uuid] if uuid in before else bool(g.mig))]
    for gpu in changed:
        _sync_devices(gpu, server, events, actor, now)
    outcomes = [e for e in agent_events if e.kind == "mig" and e.uuid in gpus and e.generation is not None]
    for event in outcomes:
        gpu = gpus[event.uuid]  # type: ignore[index]
        if gpu.mig_change != MigChange.APPLYING or event.generation != gpu.mig_generation or event.outcome is None:
            continue  # an answer to an older request, or one already taken
        to = _OUTCOME_CHANGE[event.outcome]
        updated = Gpu.objects.filter(pk=gpu.pk, mig_generation=event.generation, mig_change=MigChange.APPLYING)
        if not updated.update(mig_change=to, mig_desired=gpu.mig_desired if to else None):
            continue
        gpu.mig_change = to
        events.append(
            server_event(
                server=server,
                gpu=gpu,
                kind=_OUTCOME_KIND[event.outcome],
                actor=actor,
                at=now,
                from_state=MigChange.APPLYING,
                to_state=to or "done",
                reason=f"GPU {gpu.index} MIG reconfiguration {event.generation}: {event.message}"[:2000],
                data={"generation": event.generation, "outcome": event.outcome, "desired": gpu.mig_desired},
            )
        )


def _sync_devices(gpu: Gpu, server: Any, events: list[ServerEvent], actor: str, now: datetime) -> None:
    """Make the GPU's MigDevice rows say what its agent reports: new uuids added, devices no longer reported
    marked gone, devices reported again under their uuid back. Never a delete: allocations of the past name
    these rows (the PROTECT foreign key), and a heartbeat that failed on them would fail on every heartbeat."""
    reported = schema.MigState.model_validate(gpu.mig).devices if gpu.mig else []
    by_uuid = {d.uuid: d for d in reported}
    existing = {d.uuid: d for d in MigDevice.objects.filter(gpu=gpu)}
    # A uuid seen under another GPU (a card moved with its MIG layout) moves here with its history.
    elsewhere = {d.uuid: d for d in MigDevice.objects.filter(uuid__in=[u for u in by_uuid if u not in existing])}
    gone = [row for uuid, row in existing.items() if row.present and uuid not in by_uuid]
    for row in gone:
        row.present, row.gone_at = False, now
    added: list[MigDevice] = []
    returned: list[MigDevice] = []
    updated: list[MigDevice] = []
    for uuid, d in by_uuid.items():
        values: dict[str, Any] = {f: getattr(d, f) for f in _REPORTED}
        values["profile"] = values["profile"] or ""
        found = existing.get(uuid) or elsewhere.get(uuid)
        if found is None:
            added.append(MigDevice(gpu=gpu, uuid=uuid, **values))
            continue
        back = not found.present or found.gpu_id != gpu.pk
        if back:
            returned.append(found)
        values.update(gpu_id=gpu.pk, present=True, gone_at=None)
        if back or any(getattr(found, f) != v for f, v in values.items()):
            for f, v in values.items():
                setattr(found, f, v)
            updated.append(found)
    if gone or updated:
        MigDevice.objects.bulk_update([*gone, *updated], [*_REPORTED, "gpu", "present", "gone_at"])
    if added:
        MigDevice.objects.bulk_create(added)
    if added or updated or gone:
        layout = " + ".join(sorted(d.profile or "?" for d in reported)) or "none"
        events.append(
            server_event(
                server=server,
                gpu=gpu,
                kind=EventKind.MIG_CHANGED,
                actor=actor,
                at=now,
                reason=f"GPU {gpu.index} MIG devices: {layout}",
                data={
                    "added": [d.uuid for d in [*added, *returned]],
                    "removed": [d.uuid for d in gone],
                    "layout": layout,
                },
            )
        )


_REPORTED = ["profile", "profile_id", "gpu_instance_id", "compute_instance_id", "memory_mib", "compute_slices",
             "memory_slices", "placement_start"]  # fmt: skip


def desired_for(gpus: Iterable[Gpu]) -> list[schema.DesiredMig]:
    """The reconfigurations the agent must apply: every GPU of its server waiting for one (no statement)."""
    out = []
    for gpu in gpus:
        if gpu.mig_change == MigChange.APPLYING and gpu.mig_desired and gpu.present:
            out.append(
                schema.DesiredMig(
                    uuid=gpu.uuid,
                    enabled=bool(gpu.mig_desired.get("enabled")),
                    layout=list(gpu.mig_desired.get("layout") or []),
                    generation=gpu.mig_generation,
                )
            )
    return out


# -- the operator's side ----------------------------------------------------------------------------------------


def validate_layout(gpu: Gpu, *, enabled: bool, layout: Sequence[str]) -> None:
    """Refuse, naming the field, a layout the GPU cannot hold: by NVIDIA's table where the catalog model has one,
    else by the profiles and counts the agent reported. NVML remains the final judge on the node."""
    if gpu.mig is None:
        raise ValidationFailed(
            f"GPU {gpu.index} of {gpu.server.hostname} cannot do MIG (its agent reports no MIG mode).",
            fields={"layout": ["This GPU does not support MIG."]},
        )
    if not enabled:
        if layout:
            raise ValidationFailed("A layout needs MIG enabled.", fields={"layout": ["Must be empty with MIG off."]})
        return
    table = PROFILES.get(gpu.model.name)
    if table is not None:
        try:
            place(table, layout)
        except LayoutError as exc:
            raise ValidationFailed(f"layout: {exc}", fields={"layout": [str(exc)]}) from exc
        return
    offered: dict[str, int] = dict(gpu.mig.get("profiles") or {})
    for name in layout:
        if name not in offered:
            message = f"{name!r} is not a MIG profile of this GPU; it offers {', '.join(offered) or 'none'}"
            raise ValidationFailed(f"layout: {message}", fields={"layout": [message]})
        if layout.count(name) > offered[name]:
            message = f"at most {offered[name]} x {name} fit on this GPU"
            raise ValidationFailed(f"layout: {message}", fields={"layout": [message]})


@transaction.atomic
def gpu_request_mig(*, gpu: Gpu, enabled: bool, layout: Sequence[str], actor: Any, reason: str) -> Gpu:
    """Ask the GPU's agent for a MIG layout. Only on a drained server (draining or maintenance, so nothing new
    is booked) and a GPU nothing holds now or later: the agent reconfigures on its next heartbeat and reports."""

    # FOR UPDATE of the GPU and its server: a server returning to ready checks for waiting MIG requests under
    # the server's row lock (inventory.services.server_set_state), so the two cannot pass each other.
    locked = Gpu.objects.select_for_update(of=("self", "server")).select_related("server", "model").get(pk=gpu.pk)
    if locked.server.state not in (ServerState.DRAINING, ServerState.MAINTENANCE):
        raise Conflict(
            f"Drain {locked.server.hostname} first: MIG is reconfigured only while the server is draining or in "
            f"maintenance (it is {locked.server.state}).",
            code="server_not_drained",
        )
    holding = gpus_holding(gpu_ids=[locked.pk])
    if holding:
        raise Conflict(
            f"GPU {locked.index} of {locked.server.hostname} is booked (reservation {holding[0]['reservation']}); "
            "MIG is reconfigured only while nothing is booked on the GPU.",
            code="gpu_booked",
        )
    validate_layout(locked, enabled=enabled, layout=layout)
    desired = {"enabled": enabled, "layout": list(layout)}
    previous = locked.mig_change
    locked.mig_desired = desired
    locked.mig_generation += 1
    locked.mig_change = MigChange.APPLYING
    locked.save(update_fields=["mig_desired", "mig_generation", "mig_change"])
    server_event(
        server=locked.server,
        gpu=locked,
        kind=EventKind.MIG_REQUESTED,
        actor=actor,
        from_state=previous or "none",
        to_state=MigChange.APPLYING,
        reason=reason or f"MIG {'on: ' + (' + '.join(layout) or 'no instances') if enabled else 'off'}",
        data={"generation": locked.mig_generation, "desired": desired},
    ).save()
    return locked
