from django.db import models


class RequestState(models.TextChoices):
    QUEUED = "queued", "Queued"  # waiting for GPUs; nothing booked, no credits held
    HELD = "held", "Held"  # held by an operator: the pass skips it until released
    STARTED = "started", "Started"  # booked from the moment the pass found the GPUs free: see its reservation
    CANCELLED = "cancelled", "Cancelled"
    FAILED = "failed", "Failed"  # e.g. not started by its start_by
