from django.db import models


class EntryKind(models.TextChoices):
    GRANT = "grant", "Grant"  # credits for a period, by an operator or the period task
    HOLD = "hold", "Hold"  # taken when a reservation is booked or extended, for its whole window
    CHARGE = "charge", "Charge"  # what a reservation actually used, when it ends
    RELEASE = "release", "Release"  # gives a hold back, when a reservation ends or is cancelled
    REFUND = "refund", "Refund"  # an operator gives credits back for a reservation
    ADJUST = "adjust", "Adjustment"  # an operator's correction, either sign


class Period(models.TextChoices):
    MONTH = "month", "Month"


class BudgetAction(models.TextChoices):
    """What a booking that would take the period's spending past the budget gets."""

    REFUSE = "refuse", "Refuse"  # 409 budget_exceeded, nothing written
    WARN = "warn", "Warn"  # booked, with a warning in the response


# The shares of a budget at which an alert is recorded, once per project, period and threshold.
BUDGET_THRESHOLDS = (80, 95, 100)
