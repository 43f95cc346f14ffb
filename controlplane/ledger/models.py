"""Quota policies and the append-only credit ledger of each project."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from controlplane.accounts.models import Project
from controlplane.ledger.choices import BudgetAction, EntryKind, Period

CREDIT_PLACES = Decimal("0.0001")
# The ledger's range: no total it shows may pass this, in either direction (each kind's total, the balance,
# what is held; see services.credit_room). 15 significant digits is the most SQLite keeps of a decimal (it
# stores a REAL, and Django reads back 15 digits), and the amount column (16 digits, 4 places) holds it with
# a digit to spare, so every sum is exact and storable on both databases. A single entry is a sum of one.
CREDIT_LIMIT = Decimal("99999999999.9999")


class QuotaPolicy(models.Model):
    """What a project may book: credits granted per period, concurrent GPUs, and one reservation's length.

    A null cap means "no cap". Credits are always enforced: a booking needs a balance to hold.
    """

    project = models.OneToOneField(Project, on_delete=models.CASCADE, related_name="quota_policy")
    credits_per_period = models.DecimalField(
        max_digits=16,
        decimal_places=4,
        default=Decimal("0"),
        validators=[MinValueValidator(Decimal("0")), MaxValueValidator(CREDIT_LIMIT)],
    )
    period = models.CharField(max_length=16, choices=Period.choices, default=Period.MONTH)
    max_concurrent_gpus = models.PositiveIntegerField(null=True, blank=True)
    max_reservation_hours = models.DecimalField(
        max_digits=10, decimal_places=2, null=True, blank=True, validators=[MinValueValidator(Decimal("0.01"))]
    )
    # The spending cap of a period (docs/ledger.md, "Budgets"): null, none. It lives on the policy, not in a
    # model of its own, because it is one more cap of the same period, read by the booking's one quota query.
    budget_credits = models.DecimalField(
        max_digits=16,
        decimal_places=4,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal("0.0001")), MaxValueValidator(CREDIT_LIMIT)],
    )
    budget_action = models.CharField(max_length=16, choices=BudgetAction.choices, default=BudgetAction.REFUSE)
    # Idle reclamation (docs/efficiency.md, "Idle reclamation"): a running reservation whose every GPU stays
    # under ``idle_util_percent`` for ``idle_minutes`` is warned and cut to end ``idle_grace_minutes`` later
    # unless kept. Any of the three null: reclamation is off for this project.
    idle_util_percent = models.DecimalField(
        max_digits=5,
        decimal_places=2,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal("0.01")), MaxValueValidator(Decimal("100"))],
    )
    idle_minutes = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(5), MaxValueValidator(1440)]
    )
    idle_grace_minutes = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(1440)]
    )
    updated_at = models.DateTimeField(default=timezone.now)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta:
        verbose_name_plural = "quota policies"

    def __str__(self) -> str:
        return f"quota of {self.project}"

    def clean(self) -> None:
        idle = (self.idle_util_percent, self.idle_minutes, self.idle_grace_minutes)
        if any(v is not None for v in idle) and any(v is None for v in idle):
            # Half a threshold would read as "on" to a person and "off" to the reclaimer: refuse it.
            raise ValidationError(
                {"idle_util_percent": ["Set idle_util_percent, idle_minutes and idle_grace_minutes together."]}
            )


class AppendOnlyError(Exception):
    """Ledger entries are facts: a correction is a new entry, never an edit."""


class LedgerEntryQuerySet(models.QuerySet["LedgerEntry"]):
    def update(self, **kwargs: Any) -> int:
        raise AppendOnlyError("Ledger entries cannot be changed; append an adjustment instead.")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise AppendOnlyError("Ledger entries cannot be deleted; append an adjustment instead.")


class LedgerEntry(models.Model):
    """One signed movement of credits. ``amount`` > 0 adds to the balance, < 0 takes from it."""

    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="ledger_entries")
    kind = models.CharField(max_length=16, choices=EntryKind.choices)
    amount = models.DecimalField(max_digits=16, decimal_places=4)
    reservation = models.ForeignKey(
        "reservations.Reservation", on_delete=models.PROTECT, null=True, blank=True, related_name="ledger_entries"
    )
    # A grant for a period carries its key ("2026-11") so the period task grants each period once.
    period_key = models.CharField(max_length=16, blank=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    actor_label = models.CharField(max_length=150)
    reason = models.TextField()
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    objects = LedgerEntryQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["project", "kind"]), models.Index(fields=["reservation", "kind"])]
        constraints = [
            models.UniqueConstraint(
                fields=["project", "period_key"],
                condition=Q(kind="grant") & ~Q(period_key=""),
                name="ledger_one_grant_per_period",
            ),
            models.CheckConstraint(
                condition=(
                    Q(kind__in=["hold", "charge"], amount__lte=0)
                    | Q(kind__in=["grant", "release", "refund"], amount__gte=0)
                    | Q(kind="adjust")
                ),
                name="ledger_amount_sign_matches_kind",
            ),
        ]
        verbose_name_plural = "ledger entries"

    def __str__(self) -> str:
        return f"{self.project} {self.kind} {self.amount}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None and not self._state.adding:
            raise AppendOnlyError("Ledger entries cannot be changed; append an adjustment instead.")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise AppendOnlyError("Ledger entries cannot be deleted; append an adjustment instead.")


class MemberCap(models.Model):
    """The most GPU-hours one member may book in a project in a period (the policy's period, a UTC month)."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="member_caps")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    gpu_hours_per_period = models.DecimalField(
        max_digits=12, decimal_places=2, validators=[MinValueValidator(Decimal("0"))]
    )
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "user"], name="ledger_one_cap_per_member")]

    def __str__(self) -> str:
        return f"{self.user} in {self.project}: {self.gpu_hours_per_period} GPU-h"


class BudgetAlert(models.Model):
    """A project's spending in a period reached a share of its budget: recorded once per threshold and period.

    The unique constraint, and the project's lock under which every crossing is found, make it exactly once
    even when two bookings cross the line at the same moment."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="budget_alerts")
    period_key = models.CharField(max_length=16)
    threshold = models.PositiveSmallIntegerField()  # percent: 80, 95 or 100
    spent = models.DecimalField(max_digits=16, decimal_places=4)
    budget = models.DecimalField(max_digits=16, decimal_places=4)
    reservation = models.ForeignKey(
        "reservations.Reservation", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["project", "period_key", "threshold"], name="ledger_one_alert_per_threshold"
            )
        ]

    def __str__(self) -> str:
        return f"{self.project} {self.period_key} {self.threshold}%"
