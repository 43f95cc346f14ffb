"""Reads: the launches a caller may see."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from controlplane.dispatch.models import Launch
from controlplane.reservations.selectors import reservations_visible_to


def launches_visible_to(user: Any) -> QuerySet[Launch]:
    """Launches of the reservations of the caller's projects (every project for an operator)."""
    return Launch.objects.filter(reservation__in=reservations_visible_to(user))
