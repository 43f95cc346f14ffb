"""Project secrets and registry credentials, sealed (docs/images.md).

One table for both kinds, so that the desired state of a node reads every value its launches need in one query.
``sealed`` is the Fernet token (crypto.seal); the plaintext is never stored, and no model method shows it.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class EntryKind(models.TextChoices):
    SECRET = "secret", "Secret"
    REGISTRY = "registry", "Registry credential"


class VaultEntry(models.Model):
    project = models.ForeignKey("accounts.Project", on_delete=models.CASCADE, related_name="vault_entries")
    kind = models.CharField(max_length=16, choices=EntryKind.choices)
    # A secret's name, or a registry's host[:port] (lowercase) as an image reference names it.
    name = models.CharField(max_length=253)
    # A registry credential's user name (not secret); empty for a secret.
    username = models.CharField(max_length=256, blank=True, default="")
    sealed = models.TextField()
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "kind", "name"], name="vault_entry_unique_name"),
        ]
        ordering = ["kind", "name"]

    def __repr__(self) -> str:
        return f"<VaultEntry {self.kind} {self.name!r} of project {self.project_id}>"

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"
