"""Start-up checks: the encryption keys are usable, and they open what is stored (docs/images.md)."""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError

from controlplane.vault import crypto


@checks.register(checks.Tags.security)
def encryption_keys(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    try:
        crypto.cipher()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="vault.E001")]
    return []


@checks.register(checks.Tags.database, deploy=False)
def stored_values_open(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The newest stored value opens with the configured keys (a key replaced instead of rotated is caught at
    start, not at the next launch). Only when Django runs the database checks (migrate, check --database)."""
    if not databases:
        return []
    from controlplane.vault.models import VaultEntry

    try:
        newest = VaultEntry.objects.order_by("-updated_at").values_list("sealed", flat=True).first()
    except DatabaseError:
        return []  # not migrated yet
    if newest is None:
        return []
    try:
        crypto.unseal(newest)
    except (crypto.UndecryptableError, ImproperlyConfigured) as exc:
        return [checks.Error(str(exc), hint="Put the old key back after the new one.", id="vault.E002")]
    return []
