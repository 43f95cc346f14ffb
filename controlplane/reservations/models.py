"""Reservations of exclusive GPUs for a window, their allocations and their audit trail."""

from __future__ import annotations

import uuid
from decimal import Decimal

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from controlplane.accounts.models import Project
from controlplane.core.models import StateChangeEvent
from controlplane.inventory.models import GPU_MEMORY_SLICES, Gpu, GpuModel, MigDevice, Server
from controlplane.reservations.choices import NetworkMode, ReservationState


class Reservation(models.Model):
    """A project's request for GPUs in a window, and the container to run on them.

    The spec is a GPU model *or* a minimum memory, and a GPU count *or* a number of whole servers.
    ``starts_at``/``ends_at`` are the window the GPUs are held for now: an early release or an extension
    moves ``ends_at``, and the events keep what it was.
    """

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="reservations")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    name = models.CharField(max_length=120)
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    min_memory_mib = models.PositiveIntegerField(null=True, blank=True)
    # A slice booking (docs/fractional.md, "Booking slices"): ``gpu_count`` MIG devices of this profile.
    mig_profile = models.CharField(max_length=32, blank=True, default="")
    gpu_count = models.PositiveIntegerField(null=True, blank=True)
    whole_servers = models.PositiveIntegerField(null=True, blank=True)
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    image = models.CharField(max_length=512)
    command = models.JSONField(default=list, blank=True)
    env = models.JSONField(default=dict, blank=True)
    # The mounts as resolved at booking (docs/volumes.md): [{"kind", "name", "path", "read_only"}], a volume's
    # name in this reservation's project, a dataset's in the operators' catalog.
    volumes = models.JSONField(default=list, blank=True)
    network = models.CharField(max_length=16, choices=NetworkMode.choices, default=NetworkMode.NONE)
    # The project secrets its container gets, by name only: [{"name", "env", "file"}] (docs/images.md).
    secrets = models.JSONField(default=list, blank=True)
    # The named ports the container serves (docs/proxy.md): [{"name", "port", "protocol", "path", "auth"}].
    ports = models.JSONField(default=list, blank=True)
    # The launch template it was booked from, by name (docs/templates.md); "" when none. A name, not a key: the
    # template may change or go, the reservation keeps what it was booked with.
    template = models.CharField(max_length=63, blank=True, default="")
    state = models.CharField(max_length=16, choices=ReservationState.choices, default=ReservationState.PENDING)
    # Snapshots taken at booking from whoever booked it (the queue's class, docs/scheduling.md), so this app
    # needs nothing above it: a preemptible reservation may be cut short by a non-preemptible booking, with
    # ``notice_seconds`` of notice; every credit it holds and is charged is its GPUs' weight times
    # ``credit_multiplier``.
    preemptible = models.BooleanField(default=False)
    notice_seconds = models.PositiveIntegerField(default=0)
    credit_multiplier = models.DecimalField(max_digits=6, decimal_places=3, default=Decimal("1"))
    # Set by reservation_yield (docs/reservations.md, "Yielding"): the notice the container gets before the
    # new end, which replaces the end-of-window notice, and the reason written into its warning file.
    yield_notice_seconds = models.PositiveIntegerField(null=True, blank=True)
    yield_reason = models.CharField(max_length=200, blank=True)
    preempted_by = models.ForeignKey("self", on_delete=models.SET_NULL, null=True, blank=True, related_name="preempted")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-starts_at", "-id"]
        indexes = [
            models.Index(fields=["project", "state"]),
            models.Index(fields=["state", "starts_at"]),
            models.Index(fields=["starts_at", "ends_at"]),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(ends_at__gt=F("starts_at")), name="reservation_window_not_empty"),
            models.CheckConstraint(
                condition=(
                    Q(gpu_model__isnull=False, min_memory_mib__isnull=True, mig_profile="")
                    | Q(gpu_model__isnull=True, min_memory_mib__isnull=False, mig_profile="")
                    | (
                        Q(gpu_model__isnull=True, min_memory_mib__isnull=True, whole_servers__isnull=True)
                        & ~Q(mig_profile="")
                    )
                ),
                name="reservation_model_or_memory",
            ),
            models.CheckConstraint(
                condition=(
                    Q(gpu_count__isnull=False, whole_servers__isnull=True)
                    | Q(gpu_count__isnull=True, whole_servers__isnull=False)
                ),
                name="reservation_count_or_servers",
            ),
            models.CheckConstraint(condition=Q(credit_multiplier__gte=0), name="reservation_multiplier_not_negative"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.public_id})"

    def clean(self) -> None:
        errors: dict[str, list[str]] = {}
        if self.starts_at and self.ends_at and self.ends_at <= self.starts_at:
            errors["ends_at"] = ["The window must end after it starts."]
        if [self.gpu_model_id is not None, self.min_memory_mib is not None, bool(self.mig_profile)].count(True) != 1:
            errors["gpu_model"] = ["Give a GPU model, a minimum memory or a MIG profile: one of them."]
        if (self.gpu_count is None) == (self.whole_servers is None):
            errors["gpu_count"] = ["Give a GPU count or a number of whole servers, not both."]
        if errors:
            raise ValidationError(errors)


class Allocation(models.Model):
    """One GPU, or one MIG device of it, held by one reservation for a period.

    ``gpu`` is always the (parent) GPU; a slice booking also names its ``mig_device``. Every allocation
    covers the memory slices ``[slice_start, slice_end)`` of its GPU: ``[0, 8)`` for a whole GPU, the
    device's span for a slice. On PostgreSQL an exclusion constraint (migrations 0002, 0006) forbids two
    active allocations of one GPU whose slice spans and periods both overlap, so a whole GPU excludes its
    slices and a slice excludes its GPU; ``[starts_at, ends_at)`` is half-open so back-to-back windows are
    allowed. The span is two integers rather than a range column so the model stays portable; the
    constraint builds ``int4range`` from them as it builds ``tstzrange`` from the period.
    """

    reservation = models.ForeignKey(Reservation, on_delete=models.CASCADE, related_name="allocations")
    gpu = models.ForeignKey(Gpu, on_delete=models.PROTECT, related_name="allocations")
    # Always the GPU's server, kept by the database (migration 0007), so the busy GPUs of a window can be
    # counted per server from the allocations alone: the booking writes it from the GPU row it locks, and a
    # GPU that moves servers (a card put in another machine keeps its row) carries its allocations' along.
    # On PostgreSQL a foreign key (gpu_id, server_id) -> the GPU's (id, server_id) with ON UPDATE CASCADE;
    # on SQLite triggers do both. That key stands for the plain one to the server, hence no constraint here.
    server = models.ForeignKey(Server, on_delete=models.PROTECT, related_name="+", db_constraint=False, db_index=False)
    # PROTECT: reconfiguration refuses a GPU with any booking now or later, so a booked device is never
    # deleted under its allocation; a past allocation is released (inactive) and keeps it.
    mig_device = models.ForeignKey(
        MigDevice, on_delete=models.PROTECT, null=True, blank=True, related_name="allocations"
    )
    slice_start = models.PositiveSmallIntegerField(default=0)
    slice_end = models.PositiveSmallIntegerField(default=GPU_MEMORY_SLICES)
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    active = models.BooleanField(default=True)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        # The span too: slices of one GPU share a start and a GPU, and an answer lists them in one order.
        ordering = ["starts_at", "gpu_id", "slice_start"]
        indexes = [
            models.Index(
                fields=["gpu", "starts_at", "ends_at"], condition=Q(active=True), name="allocation_active_gpu_period"
            )
        ]
        constraints = [
            models.CheckConstraint(condition=Q(ends_at__gt=F("starts_at")), name="allocation_period_not_empty"),
            models.CheckConstraint(
                condition=Q(slice_start__lt=F("slice_end"), slice_end__lte=GPU_MEMORY_SLICES),
                name="allocation_slices_not_empty",
            ),
            # Two slices of one GPU in one reservation are two rows; their spans never share a start.
            models.UniqueConstraint(
                fields=["reservation", "gpu", "slice_start"], name="allocation_one_per_slice_per_reservation"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.gpu_id}[{self.slice_start}:{self.slice_end}) [{self.starts_at}, {self.ends_at})"

    @property
    def slice_fraction(self) -> Decimal:
        """The share of its GPU the allocation holds: 1 for a whole GPU, memory slices / 8 for a slice."""
        return Decimal(self.slice_end - self.slice_start) / GPU_MEMORY_SLICES

    @property
    def device_uuid(self) -> str:
        """The uuid the container is given: the MIG device's for a slice, else the GPU's."""
        return self.mig_device.uuid if self.mig_device is not None else self.gpu.uuid


class ReservationEvent(StateChangeEvent):
    """The audit trail: every state change (and every cancel, release, extend) with actor, time and reason."""

    reservation = models.ForeignKey(Reservation, on_delete=models.CASCADE, related_name="events")
    data = models.JSONField(default=dict, blank=True)

    class Meta(StateChangeEvent.Meta):
        pass

    def __str__(self) -> str:
        return f"{self.reservation_id}: {self.from_state}->{self.to_state}"
