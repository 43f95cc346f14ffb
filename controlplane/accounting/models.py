"""Usage accounting: what ran (usage records, split into hourly slices) and how the GPUs were used (hourly
telemetry rollups), plus the monthly statements generated from them.

Two sources, never mixed: *money and time* (booked, used, credits, cost) come from :class:`UsageSlice`, written
once when a reservation reaches a final state and split so that its credits add up exactly to the ledger's
charge; *utilization, idle time and energy* come from :class:`GpuUsageHour`, rolled up from the per-minute
telemetry and attributed to the reservation that held the GPU.
"""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from controlplane.accounting.choices import IdleState
from controlplane.accounts.models import Project
from controlplane.inventory.models import Gpu, GpuModel
from controlplane.reservations.models import Reservation

MONEY_PLACES = Decimal("0.0001")


class UsageRecord(models.Model):
    """One GPU of one finished reservation: what was booked, what ran, and what it was charged.

    ``credits`` is this GPU's share of the reservation's ledger charge (the shares of a reservation add up to
    its charge exactly); ``cost`` is the GPU model's price for the same share.
    """

    reservation = models.ForeignKey(Reservation, on_delete=models.CASCADE, related_name="usage_records")
    gpu = models.ForeignKey(Gpu, on_delete=models.PROTECT, related_name="usage_records")
    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="usage_records")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="+")
    booked_start = models.DateTimeField()
    booked_end = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True, help_text="First container start the agent saw.")
    finished_at = models.DateTimeField(null=True, blank=True, help_text="Last container stop the agent saw.")
    measured = models.BooleanField(default=True, help_text="False when no launch reported and booked time was charged.")
    booked_s = models.FloatField(default=0.0)
    gpu_seconds = models.FloatField(default=0.0)
    credits = models.DecimalField(max_digits=16, decimal_places=4, default=Decimal("0"))
    cost = models.DecimalField(max_digits=16, decimal_places=4, default=Decimal("0"))
    currency = models.CharField(max_length=3, default="USD")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["reservation_id", "gpu_id"]
        constraints = [models.UniqueConstraint(fields=["reservation", "gpu"], name="usage_record_one_per_gpu")]
        indexes = [models.Index(fields=["project", "booked_start"], name="usage_record_project_start")]

    def __str__(self) -> str:
        return f"usage of gpu {self.gpu_id} by reservation {self.reservation_id}"


class UsageSlice(models.Model):
    """The part of a usage record inside one UTC hour: the unit reports add up.

    Splitting at hour boundaries is what lets a report over any hour-aligned range (a day, a week, a month)
    agree with the ledger: a reservation crossing a boundary has its charge attributed by usage time.
    """

    record = models.ForeignKey(UsageRecord, on_delete=models.CASCADE, related_name="slices")
    hour = models.DateTimeField(help_text="Start of the UTC hour.")
    # Denormalised from the record so a report is one aggregate over (project, hour) without joins.
    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="+")
    reservation = models.ForeignKey(Reservation, on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="+")
    booked_s = models.FloatField(default=0.0)
    used_s = models.FloatField(default=0.0)
    credits = models.DecimalField(max_digits=16, decimal_places=4, default=Decimal("0"))
    cost = models.DecimalField(max_digits=16, decimal_places=4, default=Decimal("0"))
    currency = models.CharField(max_length=3, default="USD")

    class Meta:
        ordering = ["hour", "record_id"]
        constraints = [models.UniqueConstraint(fields=["record", "hour"], name="usage_slice_one_per_hour")]
        indexes = [
            # Covering: a project's report (and the ledger check) is an index-only range scan on PostgreSQL,
            # never a walk over the heap nor over every project's rows of the range. The included columns are
            # exactly those the report groups and sums; keep them in step with selectors._aggregate.
            models.Index(
                fields=["project", "hour"],
                include=["user", "gpu_model", "reservation", "currency", "booked_s", "used_s", "credits", "cost"],
                name="usage_slice_project_report",
            ),
            models.Index(fields=["hour"], name="usage_slice_hour"),
        ]

    def __str__(self) -> str:
        return f"slice of record {self.record_id} @ {self.hour:%Y-%m-%d %H:00}"


class GpuUsageHour(models.Model):
    """One GPU's telemetry over one UTC hour, attributed to the reservation that held it (none: unheld).

    ``util_mean`` is over ``util_minutes`` minutes that reported utilization; ``idle_s`` is held time in
    minutes whose mean utilization was under the idle threshold. ``energy_wh`` comes from the driver's
    energy counter where the GPU has one, else from the mean power integrated over the minute.
    """

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="usage_hours")
    hour = models.DateTimeField(help_text="Start of the UTC hour.")
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="+")
    project = models.ForeignKey(Project, on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    reservation = models.ForeignKey(
        Reservation, on_delete=models.SET_NULL, null=True, blank=True, related_name="usage_hours"
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    minutes = models.PositiveSmallIntegerField(default=0, help_text="Minutes with any telemetry.")
    util_minutes = models.PositiveSmallIntegerField(default=0)
    util_mean = models.FloatField(null=True, blank=True)
    util_max = models.FloatField(null=True, blank=True)
    fb_used_max_mib = models.FloatField(null=True, blank=True)
    power_mean_w = models.FloatField(null=True, blank=True)
    energy_wh = models.FloatField(default=0.0)
    energy_from_counter = models.BooleanField(default=False)
    held_s = models.FloatField(default=0.0)
    idle_s = models.FloatField(default=0.0)
    # Means of DCGM's profiling fields (ratios) over the minutes that had them; null on a GPU without GPM.
    sm_active_mean = models.FloatField(null=True, blank=True)
    tensor_active_mean = models.FloatField(null=True, blank=True)
    dram_active_mean = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["hour", "gpu_id"]
        constraints = [
            # Two partial constraints rather than NULLS NOT DISTINCT, which SQLite does not have.
            models.UniqueConstraint(
                fields=["gpu", "hour", "reservation"],
                condition=Q(reservation__isnull=False),
                name="gpu_usage_hour_unique_held",
            ),
            models.UniqueConstraint(
                fields=["gpu", "hour"], condition=Q(reservation__isnull=True), name="gpu_usage_hour_unique_unheld"
            ),
        ]
        indexes = [
            # Covering, as for usage slices; unheld rows (a third of a typical fleet's) are in no project's
            # report, so they are left out of it.
            models.Index(
                fields=["project", "hour"],
                include=[
                    "user",
                    "gpu_model",
                    "reservation",
                    "held_s",
                    "idle_s",
                    "energy_wh",
                    "util_minutes",
                    "util_mean",
                ],
                condition=Q(project__isnull=False),
                name="gpu_usage_hour_project_report",
            ),
            models.Index(fields=["hour"], name="gpu_usage_hour_hour"),
        ]

    def __str__(self) -> str:
        return f"gpu {self.gpu_id} @ {self.hour:%Y-%m-%d %H:00}"


class RollupWatermark(models.Model):
    """How far a rollup has got: hours before ``position`` are final. Its row lock serialises rollup runs."""

    name = models.CharField(max_length=32, unique=True)
    position = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.name} @ {self.position}"


class MonthlyStatement(models.Model):
    """A project's usage report for one calendar month, generated once after the month closes and kept."""

    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="statements")
    period_key = models.CharField(max_length=7, help_text="YYYY-MM")
    period_start = models.DateTimeField()
    period_end = models.DateTimeField()
    totals = models.JSONField(default=dict)
    rows = models.JSONField(default=list)
    csv = models.TextField()
    generated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-period_start", "project_id"]
        constraints = [models.UniqueConstraint(fields=["project", "period_key"], name="statement_one_per_month")]

    def __str__(self) -> str:
        return f"statement {self.project_id} {self.period_key}"


class IdleReclamation(models.Model):
    """A running reservation found idle and cut to end after a grace (docs/efficiency.md, "Idle reclamation").

    One per reservation (the unique key makes the reclaimer idempotent): a kept reservation is never reclaimed
    again in its window. ``booked_ends_at`` is the end before the cut, what "keep it" restores; the GPU-hours
    reclaimed are ``gpu_count`` x (``booked_ends_at`` - ``cut_ends_at``) once the cut end has passed unkept.
    """

    reservation = models.OneToOneField(Reservation, on_delete=models.CASCADE, related_name="idle_reclamation")
    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="+")
    state = models.CharField(max_length=16, choices=IdleState.choices, default=IdleState.WARNED)
    warned_at = models.DateTimeField()
    util_percent = models.FloatField(help_text="The highest GPU's mean utilization over the idle span.")
    threshold_percent = models.DecimalField(max_digits=5, decimal_places=2)
    idle_minutes = models.PositiveIntegerField()
    booked_ends_at = models.DateTimeField()
    cut_ends_at = models.DateTimeField()
    gpu_count = models.PositiveIntegerField()
    kept_at = models.DateTimeField(null=True, blank=True)
    kept_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    reclaimed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["project", "state", "cut_ends_at"], name="idle_reclaim_project_state")]

    def __str__(self) -> str:
        return f"idle {self.reservation_id}: {self.state}"

    @property
    def reclaimed_gpu_hours(self) -> float:
        return self.gpu_count * max(0.0, (self.booked_ends_at - self.cut_ends_at).total_seconds()) / 3600.0
