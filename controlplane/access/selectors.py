"""Reads of SSH keys, and the keys a node's gateway accepts."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from django.db.models import QuerySet

from controlplane.access.models import SshKey
from controlplane.accounts.choices import BOOKING_ROLES
from nodeagent.schema import AuthorizedKey


def ssh_keys_of(user: Any) -> QuerySet[SshKey]:
    """A caller's own keys only: keys are personal, so even operators see other people's only in the admin."""
    if not user or not user.is_authenticated:
        return SshKey.objects.none()
    return SshKey.objects.filter(user=user)


def authorized_keys_for_projects(project_ids: Collection[int]) -> dict[int, list[AuthorizedKey]]:
    """Per project, the keys of its owners and members: what a gateway accepts for the project's reservations.
    Viewers' keys are not among them. One query for all the projects."""
    rows = (
        SshKey.objects.filter(
            user__memberships__project_id__in=list(project_ids),
            user__memberships__role__in=sorted(BOOKING_ROLES),
            user__is_active=True,
        )
        .values_list("user__memberships__project_id", "user__username", "public_key", "fingerprint")
        .order_by("user__memberships__project_id", "user__username", "id")
    )
    out: dict[int, list[AuthorizedKey]] = {}
    for project_id, username, public_key, fingerprint in rows:
        out.setdefault(project_id, []).append(
            AuthorizedKey(user=username, public_key=public_key, fingerprint=fingerprint)
        )
    return out
