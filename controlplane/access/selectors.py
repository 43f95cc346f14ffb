"""Reads of SSH keys."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from controlplane.access.models import SshKey


def ssh_keys_of(user: Any) -> QuerySet[SshKey]:
    """A caller's own keys only: keys are personal, so even operators see other people's only in the admin."""
    if not user or not user.is_authenticated:
        return SshKey.objects.none()
    return SshKey.objects.filter(user=user)
