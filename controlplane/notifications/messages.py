"""What an event says: its title and text for the list and emails, and its webhook payload."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from controlplane.notifications.choices import EventType
from controlplane.notifications.models import Event


def link(event: Event) -> str:
    """The portal page to look at: the reservation's, else the fleet's (operators)."""
    base = settings.NOTIFICATIONS_PORTAL_URL.rstrip("/")
    if event.reservation is not None:
        return f"{base}/reservations/{event.reservation.public_id}"
    if event.type in (EventType.JOIN_TOKEN_USED, EventType.SERVER_LOST):
        return f"{base}/fleet"
    return f"{base}/usage"


def _minutes(seconds: float) -> str:
    minutes = round(seconds / 60)
    if minutes >= 60 and minutes % 60 == 0:
        return f"{minutes // 60} h"
    return f"{minutes} min"


def describe(event: Event, data: dict[str, Any]) -> tuple[str, str]:
    """(title, body) from the event's type and its stored payload ``data``."""
    r = data.get("reservation") or {}
    name = r.get("name", "")
    p = event.payload
    t = event.type
    if t == EventType.BOOKED:
        return f"Booked: {name}", f"{name} is booked from {r.get('starts_at')} to {r.get('ends_at')}."
    if t == EventType.STARTING:
        return f"Starting: {name}", f"The container of {name} is being launched."
    if t == EventType.RUNNING:
        connect = data.get("connect") or {}
        lines = [f"{name} is running until {r.get('ends_at')}."]
        for entry in connect.get("ssh", []):
            lines.append(f"Connect: {entry['command']}")
        if not connect.get("ssh") and connect.get("message"):
            lines.append(connect["message"])
        return f"Running: {name}", "\n".join(lines)
    if t == EventType.ENDS_SOON:
        return (
            f"Ends in {_minutes(p['lead_s'])}: {name}",
            f"{name} ends at {r.get('ends_at')}; extend it from its page if you need more time.",
        )
    if t == EventType.EXTENDED:
        return f"Extended: {name}", f"{name} now ends at {p.get('ends_at')} (was {p.get('old_ends_at')})."
    if t == EventType.FAILED:
        return f"Failed: {name}", f"{name} failed: {p.get('reason', '')}"
    if t == EventType.INTERRUPTED:
        return f"Interrupted: {name}", f"{name} was interrupted: {p.get('reason', '')}"
    if t == EventType.REQUEUED:
        return f"Requeued: {name}", f"The rest of {name} was booked again as reservation {p.get('follow_up')}."
    if t == EventType.PREEMPTED:
        return (
            f"Preempted: {name}",
            f"{name} is preempted by {p.get('by')} after {p.get('notice_s')} s notice: {p.get('reason', '')}",
        )
    if t == EventType.GPU_FAULT:
        return (
            f"GPU fault: {name}",
            f"GPU {p.get('gpu_index')} ({p.get('gpu')}) of {name} is unhealthy: {', '.join(p.get('reasons', []))}",
        )
    if t == EventType.IDLE_WARNING:
        return (
            f"Idle GPUs: {name}",
            f"The GPUs of {name} have been under {p.get('threshold_percent')} % busy for {p.get('idle_minutes')} min.",
        )
    if t == EventType.BUDGET_THRESHOLD:
        return (
            f"Budget {p.get('threshold_percent')} % used: {data.get('project', '')}",
            f"{data.get('project', '')} used {p.get('used')} of {p.get('budget')} credits for {p.get('period')}.",
        )
    if t == EventType.JOIN_TOKEN_USED:
        return (
            f"Join token used: {p.get('hostname')}",
            f"{p.get('hostname')} enrolled with join token {p.get('join_token')}.",
        )
    if t == EventType.SERVER_LOST:
        return f"Server lost: {data.get('server', '')}", f"{data.get('server', '')} went offline: {p.get('reason', '')}"
    if t == EventType.TEST:
        return "Test event", "A test event sent from the portal or the API."
    return t, ""


def webhook_body(event: Event, data: dict[str, Any]) -> dict[str, Any]:
    """The payload, as the Standard Webhooks specification shapes it: type, timestamp, data."""
    return {"type": event.type, "timestamp": event.occurred_at.isoformat(), "data": data}
