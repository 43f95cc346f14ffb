from django.db import models


class ReservationState(models.TextChoices):
    PENDING = "pending", "Pending"  # accepted, not yet placed
    SCHEDULED = "scheduled", "Scheduled"  # GPUs allocated for the window
    STARTING = "starting", "Starting"  # dispatch asked the agent to launch
    RUNNING = "running", "Running"  # the agent reports the container running
    ENDING = "ending", "Ending"  # the window closed or was cut short; the container is being stopped
    COMPLETED = "completed", "Completed"
    CANCELLED = "cancelled", "Cancelled"
    FAILED = "failed", "Failed"
    INTERRUPTED = "interrupted", "Interrupted"  # the server or a GPU was lost during the window


# States in which a reservation holds GPUs.
HOLDING_STATES = frozenset(
    {
        ReservationState.PENDING,
        ReservationState.SCHEDULED,
        ReservationState.STARTING,
        ReservationState.RUNNING,
        ReservationState.ENDING,
    }
)
FINAL_STATES = frozenset(
    {ReservationState.COMPLETED, ReservationState.CANCELLED, ReservationState.FAILED, ReservationState.INTERRUPTED}
)
# Cancel, release and extend act on these.
CHANGEABLE_STATES = frozenset({ReservationState.SCHEDULED, ReservationState.STARTING, ReservationState.RUNNING})


class NetworkMode(models.TextChoices):
    """A container's network: loopback only, or the Docker network an operator allows the project's egress on."""

    NONE = "none", "None (loopback only)"
    EGRESS = "egress", "Egress"
