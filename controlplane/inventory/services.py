"""Writes to the inventory: the server lifecycle and its audit trail."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.utils import timezone

from controlplane.core.errors import Conflict, ValidationFailed
from controlplane.inventory import hooks
from controlplane.inventory.choices import EventKind, MigChange, ServerState
from controlplane.inventory.models import Gpu, GpuModel, GpuModelMigProfile, Server, ServerEvent

NODE_LOSS_ACTOR = "system:node-loss"

# Operator-driven transitions. OFFLINE is entered only by node-loss detection and left only by a heartbeat
# (back to where the server was) or by retiring it; RETIRED is final.
ALLOWED_TRANSITIONS: dict[str, frozenset[str]] = {
    ServerState.COMMISSIONING: frozenset({ServerState.READY, ServerState.MAINTENANCE, ServerState.RETIRED}),
    ServerState.READY: frozenset({ServerState.DRAINING, ServerState.MAINTENANCE, ServerState.RETIRED}),
    ServerState.DRAINING: frozenset({ServerState.READY, ServerState.MAINTENANCE, ServerState.RETIRED}),
    ServerState.MAINTENANCE: frozenset({ServerState.READY, ServerState.RETIRED}),
    ServerState.OFFLINE: frozenset({ServerState.RETIRED}),
    ServerState.RETIRED: frozenset(),
}


def actor_label(actor: Any) -> str:
    if actor is None:
        return "system"
    if isinstance(actor, str):
        return actor
    return actor.get_username()


def server_event(
    *,
    server: Server | int,
    kind: str,
    actor: Any = None,
    reason: str,
    gpu: Gpu | None = None,
    from_state: str = "",
    to_state: str = "",
    data: dict[str, Any] | None = None,
    at: datetime | None = None,
) -> ServerEvent:
    """An unsaved event, so hot paths can bulk_create a heartbeat's events in one statement."""
    user = None if actor is None or isinstance(actor, str) else actor
    return ServerEvent(
        server_id=server if isinstance(server, int) else server.pk,
        gpu=gpu,
        kind=kind,
        actor=user,
        actor_label=actor_label(actor),
        reason=reason,
        from_state=from_state,
        to_state=to_state,
        data=data or {},
        at=at or timezone.now(),
    )


@transaction.atomic
def server_set_state(*, server: Server, to: str, actor: Any, reason: str) -> Server:
    """Move a server along its lifecycle on an operator's word; 409 when the move is not allowed."""
    if to not in ServerState.values:
        raise ValidationFailed(f"{to!r} is not a server state.", fields={"state": [f"Unknown state {to!r}."]})
    reason = (reason or "").strip()
    if not reason:
        raise ValidationFailed(
            "A reason is required for a state change.", fields={"reason": ["This field is required."]}
        )
    current = Server.objects.filter(pk=server.pk).values_list("state", flat=True).first()
    if current is None:
        raise Conflict(f"Server {server.hostname} no longer exists.")
    if to not in ALLOWED_TRANSITIONS[ServerState(current)]:
        raise Conflict(
            f"A server cannot go from {current} to {to}.",
            code="invalid_transition",
            extra={"from": current, "to": to},
        )
    # Conditional on the state we checked: a heartbeat or node-loss detection may have moved it meanwhile.
    if Server.objects.filter(pk=server.pk, state=current).update(state=to, state_before_offline="") != 1:
        raise Conflict(f"Server {server.hostname} changed state meanwhile; look again and retry.", code="stale_state")
    if to == ServerState.READY:
        # Checked under the row lock the update took: a MIG request locks the server row too, so one committed
        # before is seen here and one after sees the server ready and is refused.
        waiting = Gpu.objects.filter(server_id=server.pk, mig_change=MigChange.APPLYING).values_list("index", flat=True)
        if waiting:
            raise Conflict(
                f"GPU {', '.join(map(str, sorted(waiting)))} of {server.hostname} waits for its agent to apply a MIG "
                "layout; the server returns to ready after the agent reports.",
                code="mig_pending",
            )
    server_event(
        server=server, kind=EventKind.STATE, actor=actor, reason=reason, from_state=current, to_state=to
    ).save()
    if to == ServerState.RETIRED:
        # A retired server's agent has nothing more to say: its credential goes with it (the fleet's hook).
        hooks.server_retired(server, actor, f"server retired: {reason}")
    server.refresh_from_db()
    return server


@transaction.atomic
def mig_profiles_add(*, model: GpuModel, profiles: Iterable[tuple[str, int, int, int]]) -> list[str]:
    """Add the MIG profiles ``(name, memory_mib, compute_slices, memory_slices)`` the catalog model lacks; a
    profile already there, with any weight an operator set, is left as it is. Returns the names added."""
    have = set(model.mig_profiles.values_list("name", flat=True))
    new = [
        GpuModelMigProfile(
            gpu_model=model, name=name, memory_mib=memory_mib, compute_slices=compute, memory_slices=memory
        )
        for name, memory_mib, compute, memory in profiles
        if name not in have
    ]
    for profile in new:
        profile.full_clean()
    GpuModelMigProfile.objects.bulk_create(new)
    return [p.name for p in new]


@transaction.atomic
def mig_profile_set_weight(*, profile: GpuModelMigProfile, billing_weight: Decimal | None) -> GpuModelMigProfile:
    """Set a catalog MIG profile's billing weight (credits per slice-hour); None returns it to the default, the
    profile's share of its GPU model's weight. Bookings, extensions and charges from now on price by it."""
    if billing_weight is not None and billing_weight < 0:
        raise ValidationFailed(
            "A billing weight cannot be negative.", fields={"billing_weight": ["Must be 0 or more."]}
        )
    GpuModelMigProfile.objects.filter(pk=profile.pk).update(billing_weight=billing_weight)
    return GpuModelMigProfile.objects.select_related("gpu_model").get(pk=profile.pk)
