from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from controlplane.access.choices import KeyType
from controlplane.accounts.models import Project


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


# A volume's or dataset's name is a directory name on the agents' storage (``<root>/<project>/<name>``): the
# agent's own rule (nodeagent.schema.VolumeName), repeated here as a validator for the admin and the API.
NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]*$"
NAME_MAX = 63
name_validator = RegexValidator(
    NAME_PATTERN, "Use lowercase letters, digits, '-' and '_', starting with a letter or digit.", code="invalid_name"
)
GIB = 1024**3
# 1 PiB: far above any one volume, and its bytes fit a 64-bit integer with room to spare.
SIZE_LIMIT_MAX_GIB = 1024 * 1024


class Volume(models.Model):
    """A project's persistent directory on the agents' storage root, mounted into its containers by name.

    ``size_limit_gib`` is what the project pays for (per GiB-hour, provisioned) and what a booking and a launch
    check the last measurement against; ``used_bytes``/``measured_at`` are the newest measurement an agent
    reported. ``charged_until`` is the end of the last hour charged: every hour the volume existed in, even in
    part, is charged once. A ``shared`` volume may be mounted by overlapping reservations at once.
    """

    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="volumes")
    name = models.CharField(max_length=NAME_MAX, validators=[name_validator])
    size_limit_gib = models.PositiveIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(SIZE_LIMIT_MAX_GIB)]
    )
    shared = models.BooleanField(default=False)
    used_bytes = models.BigIntegerField(null=True, blank=True)
    measured_at = models.DateTimeField(null=True, blank=True)
    charged_until = models.DateTimeField(db_index=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["project_id", "name"]
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="volume_unique_name_per_project"),
            models.CheckConstraint(condition=Q(size_limit_gib__gte=1), name="volume_size_at_least_1_gib"),
        ]

    def __str__(self) -> str:
        return f"{self.project_id}/{self.name}"

    @property
    def limit_bytes(self) -> int:
        return int(self.size_limit_gib) * GIB

    @property
    def over_limit(self) -> bool:
        return self.used_bytes is not None and self.used_bytes > self.limit_bytes

    @property
    def used_percent(self) -> float | None:
        if self.used_bytes is None:
            return None
        return round(100.0 * self.used_bytes / self.limit_bytes, 2)


class Dataset(models.Model):
    """A read-only directory an operator provides on the agents' storage (``<root>/datasets/<name>`` on the
    agent), which the projects in ``allowed_projects`` may mount."""

    name = models.CharField(max_length=NAME_MAX, unique=True, validators=[name_validator])
    description = models.TextField(blank=True)
    allowed_projects = models.ManyToManyField(Project, blank=True, related_name="datasets")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


# Docker's own network names: "host" would share the node's network namespace, "none" is no network at all.
RESERVED_NETWORKS = frozenset({"host", "none"})
network_validator = RegexValidator(
    r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", "A Docker network name: letters, digits, '_', '.' and '-'.", code="invalid"
)


class ProjectNetwork(models.Model):
    """The Docker network an operator allows a project's containers to reach the outside world on. A project
    without one may not book ``network: "egress"``."""

    project = models.OneToOneField(Project, on_delete=models.CASCADE, related_name="egress_network")
    network_name = models.CharField(max_length=128, validators=[network_validator])
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["project_id"]

    def __str__(self) -> str:
        return f"{self.project_id}: {self.network_name}"
