"""Enrollment secrets and the bounded telemetry store."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from controlplane.inventory.models import Gpu, Server


class JoinToken(models.Model):
    """A one-time secret an operator hands to a new node so its agent can enroll. Only its SHA-256 is stored."""

    lookup = models.CharField(max_length=12, unique=True)
    digest = models.CharField(max_length=64)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    note = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    server = models.ForeignKey(
        Server,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        help_text="The server that enrolled with this token.",
    )
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"join token {self.lookup}"

    def status(self, now: datetime | None = None) -> str:
        now = now or timezone.now()
        if self.used_at is not None:
            return "used"
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at <= now:
            return "expired"
        return "active"


class NodeCredential(models.Model):
    """The secret a node's agent sends with every heartbeat. A server has at most one active credential."""

    server = models.ForeignKey(Server, on_delete=models.CASCADE, related_name="credentials")
    lookup = models.CharField(max_length=12, unique=True)
    digest = models.CharField(max_length=64)
    created_at = models.DateTimeField(default=timezone.now)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["server"], condition=Q(revoked_at__isnull=True), name="node_credential_one_active_per_server"
            ),
        ]

    def __str__(self) -> str:
        return f"credential {self.lookup} of {self.server_id}"


class GpuTelemetryMinute(models.Model):
    """One GPU's samples folded into one minute: the only telemetry kept beyond the latest sample.

    Sums and counts (not averages) so that two heartbeats landing in one minute add up exactly, and so that
    accounting can roll minutes into hours by adding again. ``util_samples``/``power_samples`` count the samples
    that carried the field: NVML may not support it on every GPU, and a missing value is not a zero.
    """

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="telemetry_minutes")
    minute = models.DateTimeField(help_text="Start of the minute (UTC).")
    samples = models.PositiveIntegerField(default=0)
    util_samples = models.PositiveIntegerField(default=0)
    util_sum = models.FloatField(default=0.0)
    util_max = models.FloatField(null=True, blank=True)
    fb_used_max_mib = models.FloatField(null=True, blank=True)
    power_samples = models.PositiveIntegerField(default=0)
    power_sum_w = models.FloatField(default=0.0)
    temp_max_c = models.FloatField(null=True, blank=True)
    # The driver's energy counter (mJ since driver load) at the first and last sample of the minute.
    energy_first_mj = models.FloatField(null=True, blank=True)
    energy_last_mj = models.FloatField(null=True, blank=True)
    # DCGM's profiling fields (ratios), each counted on its own: a GPU without GPM reports none of them.
    sm_active_samples = models.PositiveIntegerField(default=0)
    sm_active_sum = models.FloatField(default=0.0)
    tensor_active_samples = models.PositiveIntegerField(default=0)
    tensor_active_sum = models.FloatField(default=0.0)
    dram_active_samples = models.PositiveIntegerField(default=0)
    dram_active_sum = models.FloatField(default=0.0)

    class Meta:
        ordering = ["gpu_id", "minute"]
        constraints = [models.UniqueConstraint(fields=["gpu", "minute"], name="gpu_telemetry_minute_unique")]
        indexes = [models.Index(fields=["minute"], name="gpu_telemetry_minute_at")]

    def __str__(self) -> str:
        return f"gpu {self.gpu_id} @ {self.minute:%Y-%m-%d %H:%M}"

    @property
    def util_avg(self) -> float | None:
        return self.util_sum / self.util_samples if self.util_samples else None

    @property
    def power_avg_w(self) -> float | None:
        return self.power_sum_w / self.power_samples if self.power_samples else None

    @property
    def sm_active_avg(self) -> float | None:
        return self.sm_active_sum / self.sm_active_samples if self.sm_active_samples else None

    @property
    def tensor_active_avg(self) -> float | None:
        return self.tensor_active_sum / self.tensor_active_samples if self.tensor_active_samples else None

    @property
    def dram_active_avg(self) -> float | None:
        return self.dram_active_sum / self.dram_active_samples if self.dram_active_samples else None


class NodeLossWatch(models.Model):
    """The node-loss detector's own record: one row (pk 1), locked by every pass, so two beats judge in turn.

    ``last_pass_at`` is the detector's last successful pass. A pass that finds it further back than a few beat
    periods knows the detector, its worker, its beat or the database was away, and that the silence servers
    accrued meanwhile may be ours: it opens a grace (until ``grace_until``) in which no server is marked offline
    or lost, and from then on silence counts from ``silence_counts_from`` (the grace's start) at the earliest.
    The end of a disruption opens a grace too, without moving ``silence_counts_from``: stragglers get time to
    come back, but the silence seen during it was real for their agents as well.
    ``silent_servers``/``live_servers`` are the last pass's count, for /readyz and /metrics.
    """

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    last_pass_at = models.DateTimeField(null=True, blank=True)
    silence_counts_from = models.DateTimeField(
        null=True, blank=True, help_text="The start of the last grace after our absence: no silence before it counts."
    )
    grace_until = models.DateTimeField(null=True, blank=True)
    grace_reason = models.CharField(max_length=200, blank=True)
    silent_servers = models.PositiveIntegerField(default=0)
    live_servers = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(id=1), name="node_loss_watch_singleton")]

    def __str__(self) -> str:
        return f"node-loss watch (last pass {self.last_pass_at})"

    def in_grace(self, now: datetime) -> bool:
        return self.grace_until is not None and now < self.grace_until


class NodeLossDisruption(models.Model):
    """An incident in which more than FLEET_DISRUPTION_SHARE of the live servers (and at least
    FLEET_DISRUPTION_MIN_SERVERS) were silent together: node-loss handling was held from ``started_at`` to
    ``ended_at`` (open while null). At most one is open; the detector opens and closes them under the watch's
    row lock."""

    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    silent_servers = models.PositiveIntegerField(help_text="Silent servers when it started.")
    live_servers = models.PositiveIntegerField(help_text="Live servers (not retired, ever heard) when it started.")
    most_silent = models.PositiveIntegerField(help_text="The most servers silent at once during it.")
    hostnames = models.JSONField(default=list, blank=True, help_text="The servers silent when it started.")

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [models.Index(fields=["started_at"], condition=Q(ended_at__isnull=True), name="disruption_open")]

    def __str__(self) -> str:
        return f"disruption from {self.started_at:%Y-%m-%d %H:%M:%S}" + (
            f" to {self.ended_at:%H:%M:%S}" if self.ended_at else " (open)"
        )
