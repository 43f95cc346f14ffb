"""Fleet workflows: enrollment, credentials, acknowledgement of GPU faults, telemetry pruning.

The heartbeat itself lives in ``controlplane.fleet.ingest`` and node loss in ``controlplane.fleet.nodeloss``
(both re-exported here).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.core import domain_events, tokens
from controlplane.core.errors import Conflict, PermissionDenied, ValidationFailed
from controlplane.fleet import health
from controlplane.fleet.ingest import heartbeat_ingest, heartbeat_ingest_with_credential
from controlplane.fleet.models import GpuTelemetryMinute, JoinToken, NodeCredential
from controlplane.fleet.nodeloss import detect_lost_servers
from controlplane.inventory.choices import EventKind, GpuHealth, ServerState
from controlplane.inventory.models import Gpu, Server
from controlplane.inventory.services import server_event

__all__ = [
    "agent_enroll",
    "credential_revoke",
    "detect_lost_servers",
    "gpu_acknowledge",
    "heartbeat_ingest",
    "heartbeat_ingest_with_credential",
    "join_token_create",
    "join_token_revoke",
    "prune_telemetry",
    "revoke_active_credentials",
]

log = logging.getLogger(__name__)


@transaction.atomic
def join_token_create(*, actor: Any, note: str = "", ttl_s: int | None = None) -> tuple[JoinToken, str]:
    """A one-time join token; the plaintext is returned here and never again."""
    ttl = settings.FLEET_JOIN_TOKEN_TTL_S if ttl_s is None else ttl_s
    if ttl < 60 or ttl > 30 * 24 * 3600:
        raise ValidationFailed(
            "A join token lives between one minute and 30 days.",
            fields={"ttl_s": ["Must be between 60 and 2592000 seconds."]},
        )
    issued = tokens.issue(tokens.JOIN_TOKEN)
    now = timezone.now()
    token = JoinToken.objects.create(
        lookup=issued.lookup,
        digest=issued.digest,
        created_by=actor,
        note=note,
        created_at=now,
        expires_at=now + timedelta(seconds=ttl),
    )
    return token, issued.plaintext


@transaction.atomic
def join_token_revoke(*, token: JoinToken, actor: Any) -> JoinToken:
    now = timezone.now()
    if JoinToken.objects.filter(pk=token.pk, used_at__isnull=True, revoked_at__isnull=True).update(revoked_at=now) != 1:
        token.refresh_from_db()
        raise Conflict(f"The join token is already {token.status(now)}.", code="join_token_not_active")
    token.refresh_from_db()
    log.info("join token %s revoked by %s", token.lookup, actor)
    return token


def _invalid_join_token(message: str) -> PermissionDenied:
    return PermissionDenied(message, code="join_token_invalid", fields={"join_token": [message]})


def _issue_credential(server: Server) -> str:
    issued = tokens.issue(tokens.NODE_CREDENTIAL)
    NodeCredential.objects.create(server=server, lookup=issued.lookup, digest=issued.digest)
    return issued.plaintext


@transaction.atomic
def agent_enroll(*, join_token: str, hostname: str, simulated: bool) -> tuple[Server, str]:
    """Trade a join token for a node credential.

    A new hostname becomes a server in ``commissioning``: its agent reports, an operator looks and makes it
    ready. A known hostname may enroll again only once its credential was revoked (a reinstalled node); it
    goes back to ``commissioning`` for the same reason. Everything, the token's use included, rolls back on
    any refusal.
    """
    hostname = hostname.strip().lower()
    if not hostname:
        raise ValidationFailed("A hostname is required.", fields={"hostname": ["This field is required."]})
    lookup = tokens.parse(join_token, tokens.JOIN_TOKEN)
    token = JoinToken.objects.filter(lookup=lookup).first() if lookup else None
    if token is None or not tokens.matches(join_token, token.digest):
        raise _invalid_join_token("The join token is not valid.")
    now = timezone.now()
    # Conditional: of two agents enrolling with one token at once, exactly one sees a count of 1.
    won = JoinToken.objects.filter(
        pk=token.pk, used_at__isnull=True, revoked_at__isnull=True, expires_at__gt=now
    ).update(used_at=now)
    if won != 1:
        token.refresh_from_db()
        raise _invalid_join_token(f"The join token is {token.status(now)}.")

    server = Server.objects.select_for_update().filter(hostname=hostname).first()
    if server is None:
        server = Server.objects.create(
            hostname=hostname,
            simulated=simulated,
            state=ServerState.COMMISSIONING,
            heartbeat_interval_s=settings.FLEET_HEARTBEAT_INTERVAL_S,
        )
        server_event(
            server=server,
            kind=EventKind.ENROLLED,
            actor=f"agent:{hostname}",
            reason=f"enrolled with join token {token.lookup}",
            to_state=server.state,
            data={"join_token": token.lookup, "note": token.note},
        ).save()
    else:
        if NodeCredential.objects.filter(server=server, revoked_at__isnull=True).exists():
            raise Conflict(
                f"Server {hostname} is enrolled and its credential is active; revoke it first.",
                code="already_enrolled",
                fields={"hostname": ["Already enrolled."]},
            )
        previous = server.state
        if previous == ServerState.RETIRED:
            raise Conflict(
                f"Server {hostname} is retired; a retired hostname cannot enroll again.",
                code="server_retired",
                fields={"hostname": ["Retired."]},
            )
        to = ServerState.COMMISSIONING
        Server.objects.filter(pk=server.pk).update(state=to, state_before_offline="", simulated=simulated)
        server_event(
            server=server,
            kind=EventKind.ENROLLED,
            actor=f"agent:{hostname}",
            reason=f"re-enrolled with join token {token.lookup}",
            from_state=previous,
            to_state=to,
            data={"join_token": token.lookup, "note": token.note, "reenrolled": True},
        ).save()
        server.refresh_from_db()
    JoinToken.objects.filter(pk=token.pk).update(server=server)
    token.server = server
    domain_events.publish("join_token_used", [token])
    return server, _issue_credential(server)


def revoke_active_credentials(*, server: Server, actor: Any, reason: str) -> int:
    now = timezone.now()
    count = NodeCredential.objects.filter(server=server, revoked_at__isnull=True).update(
        revoked_at=now, revoked_reason=reason
    )
    if count:
        server_event(server=server, kind=EventKind.CREDENTIAL_REVOKED, actor=actor, reason=reason, at=now).save()
    return count


@transaction.atomic
def credential_revoke(*, server: Server, actor: Any, reason: str) -> None:
    """Cut a node off: its agent's next heartbeat is refused (401) until it enrolls again with a new token."""
    reason = (reason or "").strip()
    if not reason:
        raise ValidationFailed("A reason is required.", fields={"reason": ["This field is required."]})
    if revoke_active_credentials(server=server, actor=actor, reason=reason) == 0:
        raise Conflict(f"Server {server.hostname} has no active credential.", code="no_active_credential")


@transaction.atomic
def gpu_acknowledge(*, gpu: Gpu, actor: Any, reason: str) -> Gpu:
    """An operator's word that a GPU's hardware fault was dealt with. A cause still present returns next beat."""
    reason = (reason or "").strip()
    if not reason:
        raise ValidationFailed("A reason is required.", fields={"reason": ["This field is required."]})
    locked = Gpu.objects.select_for_update().get(pk=gpu.pk)
    if not locked.needs_acknowledgement:
        raise Conflict(f"GPU {locked.uuid} has no fault to acknowledge.", code="nothing_to_acknowledge")
    after = health.after_acknowledgement(locked.health_reasons)
    to_health = GpuHealth.HEALTHY if after.healthy else GpuHealth.UNHEALTHY
    Gpu.objects.filter(pk=locked.pk, needs_acknowledgement=True).update(
        health=to_health, health_reasons=list(after.reasons), needs_acknowledgement=False
    )
    server_event(
        server=locked.server_id,
        gpu=locked,
        kind=EventKind.GPU_ACKNOWLEDGED,
        actor=actor,
        reason=reason,
        from_state=locked.health,
        to_state=to_health,
        data={"cleared": [r for r in locked.health_reasons if r not in after.reasons], "reasons": list(after.reasons)},
    ).save()
    locked.refresh_from_db()
    return locked


def prune_telemetry(now: datetime | None = None) -> int:
    """Delete minute rollups older than TELEMETRY_MINUTE_RETENTION_DAYS; returns how many went."""
    now = now or timezone.now()
    cutoff = now - timedelta(days=settings.TELEMETRY_MINUTE_RETENTION_DAYS)
    deleted, _ = GpuTelemetryMinute.objects.filter(minute__lt=cutoff).delete()
    return deleted
