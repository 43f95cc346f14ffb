from django.db import models


class LaunchState(models.TextChoices):
    PENDING = "pending", "Pending"  # asked for; the agent has not reported it running yet
    RUNNING = "running", "Running"
    STOPPING = "stopping", "Stopping"  # SIGTERM sent, waiting for the exit or the kill after the grace
    EXITED = "exited", "Exited"  # the container's process ended; exit_code says how
    FAILED = "failed", "Failed"  # never ran or could not be kept running: image missing, launch refused
    LOST = "lost", "Lost"  # its server stopped sending heartbeats
    CANCELLED = "cancelled", "Cancelled"  # the reservation was cancelled before the container started


LIVE_LAUNCH_STATES = frozenset({LaunchState.PENDING, LaunchState.RUNNING, LaunchState.STOPPING})
FINAL_LAUNCH_STATES = frozenset({LaunchState.EXITED, LaunchState.FAILED, LaunchState.LOST, LaunchState.CANCELLED})
