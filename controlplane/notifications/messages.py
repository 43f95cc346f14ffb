"""What an event says: its title and text for the list and emails, and its webhook payload."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from controlplane.notifications.choices import OPERATOR_EVENTS, EventType
from controlplane.notifications.models import Event


def link(event: Event) -> str:
    """The portal page to look at: the reservation's, else the fleet's (operators)."""
    base = settings.NOTIFICATIONS_PORTAL_URL.rstrip("/")
    if event.reservation is not None:
        return f"{base}/reservations/{event.reservation.public_id}"
    if event.type in OPERATOR_EVENTS:
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
    if t == EventType.IMAGE_FAILED:
        return (
            f"Image not pulled: {name}",
            f"The image {p.get('image')} of {name} could not be pulled on {p.get('server')} before its window: "
            f"{p.get('error', '')}. Fix the image or the project's registry credentials, or the container will not "
            "start when the window opens.",
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
        servers = p.get("servers") or [{"hostname": data.get("server", ""), "reason": p.get("reason", "")}]
        names = [str(s.get("hostname", "")) for s in servers]
        title = f"Server lost: {names[0]}" if len(names) == 1 else f"{len(names)} servers lost: {', '.join(names)}"
        lines = [f"{s.get('hostname', '')} went offline: {s.get('reason', '')}" for s in servers]
        return title[:200], "\n".join(lines)
    if t == EventType.SERVER_BACK:
        return (
            f"Server back: {data.get('server', '')}",
            f"{data.get('server', '')} is sending heartbeats again and is {p.get('to_state', '')} once more.",
        )
    if t == EventType.DISRUPTION:
        hosts = ", ".join(p.get("hostnames", []))
        return (
            f"Node loss held: {p.get('silent_servers')} of {p.get('live_servers')} servers silent",
            f"{p.get('silent_servers')} of {p.get('live_servers')} live servers went silent together at "
            f"{p.get('started_at')} ({hosts}). That looks like a fault of the control plane or its network rather "
            "than of the nodes, so node-loss handling is held: no server is marked offline, no reservation is "
            "interrupted or requeued, until most are heard again. Replaceable work is still stopped by its agents "
            "at their lease; other work keeps running.",
        )
    if t == EventType.DISRUPTION_ENDED:
        return (
            "Node loss no longer held",
            f"The disruption that began at {p.get('started_at')} ended at {p.get('ended_at')} (at most "
            f"{p.get('most_silent')} of {p.get('live_servers')} servers silent). Servers still silent are judged "
            "again after the grace.",
        )
    if t == EventType.TEST:
        return "Test event", "A test event sent from the portal or the API."
    return t, ""


def webhook_body(event: Event, data: dict[str, Any]) -> dict[str, Any]:
    """The payload, as the Standard Webhooks specification shapes it: type, timestamp, data."""
    return {"type": event.type, "timestamp": event.occurred_at.isoformat(), "data": data}
