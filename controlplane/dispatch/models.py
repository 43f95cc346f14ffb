"""What dispatch asked the agents to run, and what they saw of it."""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q
from django.utils import timezone

from controlplane.dispatch.choices import LaunchState
from controlplane.inventory.models import Server
from controlplane.reservations.models import Reservation


def _new_launch_id() -> str:
    return str(uuid.uuid4())


class Launch(models.Model):
    """One reservation's container on one server.

    ``launch_id`` is the idempotency key the whole way down: the agent names the container after it, so a
    redelivered push or a replayed heartbeat reply can never start a second container. A requeue after a
    lost server books a follow-up reservation whose launches carry the next ``generation``.
    """

    launch_id = models.CharField(max_length=64, unique=True, default=_new_launch_id, editable=False)
    reservation = models.ForeignKey(Reservation, on_delete=models.CASCADE, related_name="launches")
    server = models.ForeignKey(Server, on_delete=models.PROTECT, related_name="launches")
    gpu_uuids = models.JSONField(default=list)
    generation = models.PositiveIntegerField(default=1)
    state = models.CharField(max_length=16, choices=LaunchState.choices, default=LaunchState.PENDING)
    container_id = models.CharField(max_length=128, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    log_tail = models.TextField(blank=True)
    pushed_at = models.DateTimeField(null=True, blank=True)
    push_attempts = models.PositiveIntegerField(default=0)
    # When the closer first saw the reservation no longer wanting it and pushed the stop.
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["reservation", "server", "generation"], name="launch_one_per_server_per_generation"
            ),
        ]
        indexes = [
            models.Index(fields=["server", "state"], name="launch_server_state"),
            models.Index(
                fields=["state"], condition=Q(state__in=["pending", "running", "stopping"]), name="launch_live"
            ),
        ]

    def __str__(self) -> str:
        return f"launch {self.launch_id} ({self.state})"


class Requeue(models.Model):
    """An interrupted reservation and the follow-up booked for the rest of its window on healthy GPUs."""

    interrupted = models.OneToOneField(Reservation, on_delete=models.CASCADE, related_name="requeued_as")
    follow_up = models.OneToOneField(Reservation, on_delete=models.CASCADE, related_name="requeued_from")
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.interrupted_id} -> {self.follow_up_id}"
