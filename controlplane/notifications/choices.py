from django.db import models


class EventType(models.TextChoices):
    """What a notification is about. The value is the webhook payload's ``type`` (Standard Webhooks style)."""

    BOOKED = "reservation.booked", "Reservation booked"
    STARTING = "reservation.starting", "Reservation starting"
    RUNNING = "reservation.running", "Reservation running"
    ENDS_SOON = "reservation.ends_soon", "Reservation ends soon"
    EXTENDED = "reservation.extended", "Reservation extended"
    FAILED = "reservation.failed", "Reservation failed"
    INTERRUPTED = "reservation.interrupted", "Reservation interrupted"
    REQUEUED = "reservation.requeued", "Reservation requeued"
    PREEMPTED = "reservation.preempted", "Reservation preempted"
    GPU_FAULT = "reservation.gpu_fault", "GPU fault on a reservation"
    IMAGE_FAILED = "reservation.image_failed", "Image could not be pulled"
    IDLE_WARNING = "reservation.idle_warning", "Idle GPUs warning"
    BUDGET_THRESHOLD = "project.budget_threshold", "Budget threshold crossed"
    JOIN_TOKEN_USED = "fleet.join_token_used", "Join token used"
    SERVER_LOST = "fleet.server_lost", "Server lost"
    SERVER_BACK = "fleet.server_back", "Server back"
    DISRUPTION = "fleet.disruption", "Node loss held (disruption)"
    DISRUPTION_ENDED = "fleet.disruption_ended", "Disruption over"
    # Sent by "send test event" to one endpoint only; never a notification, never a preference.
    TEST = "webhook.test", "Test event"


# Events about the fleet, for operators (staff); they belong to no project, so no project webhook gets them.
OPERATOR_EVENTS = frozenset(
    {
        EventType.JOIN_TOKEN_USED,
        EventType.SERVER_LOST,
        EventType.SERVER_BACK,
        EventType.DISRUPTION,
        EventType.DISRUPTION_ENDED,
    }
)
# The events a person (preferences) or an endpoint (its event list) may choose.
SUBSCRIBABLE_EVENTS = [t for t in EventType if t != EventType.TEST]


class Channel(models.TextChoices):
    """How an event reaches a person beyond the in-portal list, which has every notification."""

    EMAIL = "email", "Email"
    # Not by email: the project's webhook endpoints carry it (they choose their own events).
    WEBHOOK = "webhook", "Webhook"
    NONE = "none", "Nothing"


# A person who set nothing gets an email for what needs them now, and only the in-portal list for the rest.
DEFAULT_CHANNELS: dict[str, str] = {
    EventType.BOOKED: Channel.NONE,
    EventType.STARTING: Channel.NONE,
    EventType.RUNNING: Channel.EMAIL,
    EventType.ENDS_SOON: Channel.EMAIL,
    EventType.EXTENDED: Channel.NONE,
    EventType.FAILED: Channel.EMAIL,
    EventType.INTERRUPTED: Channel.EMAIL,
    EventType.REQUEUED: Channel.EMAIL,
    EventType.PREEMPTED: Channel.EMAIL,
    EventType.GPU_FAULT: Channel.EMAIL,
    EventType.IMAGE_FAILED: Channel.EMAIL,
    EventType.IDLE_WARNING: Channel.EMAIL,
    EventType.BUDGET_THRESHOLD: Channel.EMAIL,
    EventType.JOIN_TOKEN_USED: Channel.NONE,
    EventType.SERVER_LOST: Channel.EMAIL,
    EventType.SERVER_BACK: Channel.EMAIL,
    EventType.DISRUPTION: Channel.EMAIL,
    EventType.DISRUPTION_ENDED: Channel.EMAIL,
}


class DeliveryState(models.TextChoices):
    PENDING = "pending", "Pending"  # not sent yet, or waiting for its next attempt
    DELIVERED = "delivered", "Delivered"  # a 2xx answer
    FAILED = "failed", "Failed"  # every attempt of the retry window failed; the endpoint was disabled


class EmailState(models.TextChoices):
    PENDING = "pending", "Pending"
    SENT = "sent", "Sent"
    FAILED = "failed", "Failed"  # every attempt failed
