from django.db import models


class GroupBy(models.TextChoices):
    """How a project's report splits its rows."""

    USER = "user", "User"
    GPU_MODEL = "gpu_model", "GPU model"
    DAY = "day", "Day"
    RESERVATION = "reservation", "Reservation"


class FleetGroupBy(models.TextChoices):
    """How the operators' fleet report splits its rows."""

    PROJECT = "project", "Project"
    GPU_MODEL = "gpu_model", "GPU model"
    DAY = "day", "Day"


class Bucket(models.TextChoices):
    HOUR = "hour", "Hour"
    DAY = "day", "Day"


class Period(models.TextChoices):
    DAY = "day", "Day"
    WEEK = "week", "Week"
    MONTH = "month", "Month"


class IdleState(models.TextChoices):
    """Where an idle reclamation stands (docs/efficiency.md, "Idle reclamation")."""

    WARNED = "warned", "Warned: cut to end after the grace unless kept"
    KEPT = "kept", "Kept: the booked end was restored"
    RECLAIMED = "reclaimed", "Reclaimed: the GPUs were released at the cut end"
