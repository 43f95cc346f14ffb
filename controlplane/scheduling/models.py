"""The queue beside advance reservations: requests that start when their GPUs free up (docs/scheduling.md)."""

from __future__ import annotations

import uuid
from decimal import Decimal

from django.conf import settings
from django.db import models
from django.utils import timezone

from controlplane.accounts.models import Project
from controlplane.core.models import StateChangeEvent
from controlplane.reservations.models import Reservation
from controlplane.scheduling.choices import RequestState


class PriorityClass(models.Model):
    """A queue class: a higher ``rank`` is served first; its bookings hold and are charged their GPUs' weight
    times ``credit_multiplier``. A ``preemptible`` class's reservations yield their GPUs to non-preemptible
    bookings after ``notice_seconds`` of notice (docs/scheduling.md, "Preemption")."""

    name = models.SlugField(max_length=40, unique=True)
    rank = models.IntegerField()
    credit_multiplier = models.DecimalField(max_digits=6, decimal_places=3, default=Decimal("1"))
    notice_seconds = models.PositiveIntegerField(default=0)
    preemptible = models.BooleanField(default=False)

    class Meta:
        ordering = ["-rank", "name"]
        verbose_name_plural = "priority classes"

    def __str__(self) -> str:
        return self.name


class QueuedRequest(models.Model):
    """A request for GPUs for ``duration_seconds``, from whenever they are free (and before ``start_by``)."""

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="queued_requests")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    name = models.CharField(max_length=120)
    # specs.GpuSpec's fields, and specs.ContainerSpec's (mounts as specs.MountRequest's fields).
    spec = models.JSONField()
    container = models.JSONField()
    duration_seconds = models.PositiveIntegerField()
    start_by = models.DateTimeField(null=True, blank=True)
    priority_class = models.ForeignKey(PriorityClass, on_delete=models.PROTECT, related_name="requests")
    state = models.CharField(max_length=16, choices=RequestState.choices, default=RequestState.QUEUED)
    reservation = models.OneToOneField(
        Reservation, on_delete=models.PROTECT, null=True, blank=True, related_name="queued_request"
    )
    reason = models.TextField(blank=True)
    # When its reservation is preempted, a new request with the same spec, container, duration and class
    # goes back into the queue (``requeued_from`` names the one it came from).
    requeue = models.BooleanField(default=False)
    requeued_from = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="requeued_as"
    )
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["state", "created_at"]), models.Index(fields=["project", "state"])]

    def __str__(self) -> str:
        return f"{self.name} ({self.public_id})"


class QueuedRequestEvent(StateChangeEvent):
    """The audit trail of a queued request, like ReservationEvent."""

    request = models.ForeignKey(QueuedRequest, on_delete=models.CASCADE, related_name="events")

    class Meta(StateChangeEvent.Meta):
        pass

    def __str__(self) -> str:
        return f"{self.request_id}: {self.from_state}->{self.to_state}"
