"""Launch templates: a named container, GPU spec and window length to book from (docs/templates.md)."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from controlplane.accounts.models import Project

NAME_MAX = 63
NAME_PATTERN = r"^[a-z0-9][a-z0-9-]*$"
name_validator = RegexValidator(
    NAME_PATTERN, "Use lowercase letters, digits and '-', starting with a letter or digit.", code="invalid"
)
DEFAULT_DURATION_S = 3600


class LaunchTemplate(models.Model):
    """What a booking may start from. ``project`` null: operator-wide, managed by operators; else the
    project's own, managed by its owners, and shadowing an operator-wide template of the same name for that
    project. ``container``, ``spec`` and ``ports`` are stored as the API reads them (a booking's
    ``container`` and ``spec`` in request form), so a booking from the template is the request written out."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, null=True, blank=True, related_name="templates")
    name = models.CharField(max_length=NAME_MAX, validators=[name_validator])
    title = models.CharField(max_length=200, blank=True)
    description = models.TextField(blank=True)
    # {"image", "command", "env", "secrets", "volumes", "network"}: a booking's ``container``.
    container = models.JSONField(default=dict)
    # A booking's ``spec`` (gpu_model by name); null: the booking gives its own.
    spec = models.JSONField(null=True, blank=True)
    # [{"name", "port", "protocol"}]: what the container serves, by name.
    ports = models.JSONField(default=list, blank=True)
    duration_s = models.PositiveIntegerField(default=DEFAULT_DURATION_S)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name", "project_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["name"], condition=Q(project__isnull=True), name="template_unique_operator_name"
            ),
            models.UniqueConstraint(
                fields=["project", "name"], condition=Q(project__isnull=False), name="template_unique_project_name"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.project.slug if self.project_id else '*'}/{self.name}"
