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
    # The repository digest of the image the container was created from, as the agent saw it: what ran.
    image_digest = models.CharField(max_length=128, blank=True)
    # The engine killed the container for going over its memory limit (``error`` says so in words).
    oom_killed = models.BooleanField(default=False)
    # While the agent pulls the image for this launch (it was not on the node at its window): the last progress
    # it reported (``nodeagent.schema.PullProgress``'s fields); None once the pull is over or when there was none.
    pull = models.JSONField(null=True, blank=True)
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


class LaunchLog(models.Model):
    """What a launch's container wrote (stdout and stderr as Docker interleaves them), as far as it reached us.

    Offsets count bytes from the start of the container's whole output. ``received`` is the offset the agent
    sends next; ``kept_from`` the first byte still stored: older output is dropped past
    ``DISPATCH_LOG_KEEP_BYTES``, and bytes the agent itself dropped show as holes between chunks.
    """

    launch = models.OneToOneField(Launch, on_delete=models.CASCADE, primary_key=True, related_name="log")
    received = models.BigIntegerField(default=0)
    kept_from = models.BigIntegerField(default=0)
    kept_bytes = models.BigIntegerField(default=0)
    # The container exited and the agent sent everything it wrote.
    eof = models.BooleanField(default=False)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(kept_from__gte=0) & Q(kept_from__lte=models.F("received")), name="launch_log_kept_in_range"
            ),
        ]

    def __str__(self) -> str:
        return f"log of {self.launch_id}: {self.kept_from}..{self.received}"


class LaunchLogChunk(models.Model):
    """Bytes ``[offset, end)`` of a launch's output. Contiguous writes are merged into one row up to a size."""

    log = models.ForeignKey(LaunchLog, on_delete=models.CASCADE, related_name="chunks")
    offset = models.BigIntegerField()
    end = models.BigIntegerField()
    data = models.BinaryField()

    class Meta:
        ordering = ["offset"]
        constraints = [
            models.UniqueConstraint(fields=["log", "offset"], name="launch_log_chunk_one_per_offset"),
            models.CheckConstraint(
                condition=Q(offset__gte=0) & Q(end__gt=models.F("offset")), name="launch_log_chunk_not_empty"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.log_id} [{self.offset}, {self.end})"


class ImagePull(models.Model):
    """What one server's agent reported of pulling a reservation's image ahead of its window (docs/images.md).

    One row per (server, reservation, image); the reservation's events carry the transitions (pulling, pulled,
    failed), this row the latest figures."""

    class State(models.TextChoices):
        PULLING = "pulling", "Pulling"
        PRESENT = "present", "Present"
        FAILED = "failed", "Failed"

    server = models.ForeignKey(Server, on_delete=models.CASCADE, related_name="image_pulls")
    reservation = models.ForeignKey(Reservation, on_delete=models.CASCADE, related_name="image_pulls")
    image = models.CharField(max_length=512)
    state = models.CharField(max_length=16, choices=State.choices)
    digest = models.CharField(max_length=128, blank=True)
    size_bytes = models.BigIntegerField(null=True, blank=True)
    # ``nodeagent.schema.PullProgress``'s fields, as last reported.
    progress = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    reported_at = models.DateTimeField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["server", "reservation", "image"], name="image_pull_one_per_server_image"),
        ]

    def __str__(self) -> str:
        return f"{self.image} on {self.server_id} for {self.reservation_id}: {self.state}"
