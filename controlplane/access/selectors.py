"""Reads of SSH keys, the keys a node's gateway accepts, and what a node's containers mount."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from django.db.models import Q, QuerySet

from controlplane.access.models import GIB, ProjectNetwork, SshKey, Volume
from controlplane.access.web.portalkeys import portal_key
from controlplane.accounts.choices import BOOKING_ROLES
from controlplane.accounts.models import Membership
from nodeagent.schema import AuthorizedKey, VolumeMount


def ssh_keys_of(user: Any) -> QuerySet[SshKey]:
    """A caller's own keys only: keys are personal, so even operators see other people's only in the admin."""
    if not user or not user.is_authenticated:
        return SshKey.objects.none()
    return SshKey.objects.filter(user=user)


def authorized_keys_for_projects(project_ids: Collection[int]) -> dict[int, list[AuthorizedKey]]:
    """Per project, the keys of its owners and members: what a gateway accepts for the project's reservations.
    Each of them has their own keys and their portal key (access/web/portalkeys.py: the web proxy logs in to the
    gateway as them), whether or not they registered a key. Viewers' keys are not among them. One query for all
    the projects."""
    rows = (
        Membership.objects.filter(
            project_id__in=list(project_ids), role__in=sorted(BOOKING_ROLES), user__is_active=True
        )
        .values_list("project_id", "user__username", "user__ssh_keys__public_key", "user__ssh_keys__fingerprint")
        .order_by("project_id", "user__username", "user__ssh_keys__id")
    )
    out: dict[int, list[AuthorizedKey]] = {}
    last: tuple[int, str] | None = None
    for project_id, username, public_key, fingerprint in rows:
        keys = out.setdefault(project_id, [])
        if (project_id, username) != last:
            last = (project_id, username)
            portal = portal_key(username)
            keys.append(AuthorizedKey(user=username, public_key=portal.public_key, fingerprint=portal.fingerprint))
        if public_key is not None:
            keys.append(AuthorizedKey(user=username, public_key=public_key, fingerprint=fingerprint))
    return out


def container_mounts(reservations: Sequence[Any]) -> dict[int, tuple[list[VolumeMount], str | None]]:
    """The dispatch hook: per reservation id, its stored mounts with each volume's size limit as it is now, and
    its project's egress network (None: none, or the reservation did not ask for egress). Two queries for all.

    A volume that no longer exists (only a direct database change can remove one a live reservation mounts)
    gets a limit of 0, so the agent refuses to launch on the data left behind rather than run unmetered.
    """
    pairs = {(r.project_id, m["name"]) for r in reservations for m in r.volumes or [] if m.get("kind") == "volume"}
    limits: dict[tuple[int, str], int] = {}
    if pairs:
        match = Q()
        for project_id, name in pairs:
            match |= Q(project_id=project_id, name=name)
        for project_id, name, gib in Volume.objects.filter(match).values_list("project_id", "name", "size_limit_gib"):
            limits[(project_id, name)] = int(gib) * GIB
    egress = {r.project_id for r in reservations if r.network == "egress"}
    networks = dict(
        ProjectNetwork.objects.filter(project_id__in=egress).values_list("project_id", "network_name") if egress else []
    )
    out: dict[int, tuple[list[VolumeMount], str | None]] = {}
    for r in reservations:
        mounts = []
        for m in r.volumes or []:
            volume = m.get("kind") == "volume"
            mounts.append(
                VolumeMount(
                    kind=m["kind"],
                    name=m["name"],
                    project=r.project.slug if volume else None,
                    path=m["path"],
                    read_only=bool(m.get("read_only")),
                    limit_bytes=limits.get((r.project_id, m["name"]), 0) if volume else None,
                )
            )
        out[r.pk] = (mounts, networks.get(r.project_id) if r.network == "egress" else None)
    return out
