from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from controlplane.access.choices import KeyType


class SshKey(models.Model):
    """A user's SSH public key: what the agents' SSH gateways accept from that user.

    Keys are personal: only their user sees them through the API, operators included (the admin is where an
    operator removes one). ``public_key`` is the normalised key (type and base64 blob, as the library writes
    it back); the comment the user's file carried is kept apart, in ``comment``.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="ssh_keys")
    name = models.CharField(max_length=100)
    key_type = models.CharField(max_length=32, choices=KeyType.choices)
    bits = models.PositiveIntegerField()
    public_key = models.TextField()
    comment = models.TextField(blank=True)
    # OpenSSH's form, "SHA256:" and 43 characters of unpadded base64; the gateway looks keys up by it.
    fingerprint = models.CharField(max_length=50, db_index=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["user", "fingerprint"], name="sshkey_unique_fingerprint_per_user"),
            models.UniqueConstraint(fields=["user", "name"], name="sshkey_unique_name_per_user"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.fingerprint})"
