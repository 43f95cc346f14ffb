"""Builders shared by the scheduling tests."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from controlplane.accounts.models import Project
from controlplane.reservations.specs import GpuSpec
from controlplane.scheduling import services
from controlplane.scheduling.models import PriorityClass, QueuedRequest
from tests.factories import UserFactory
from tests.reservations.fleet import CONTAINER


def klass(name: str = "normal") -> PriorityClass:
    return PriorityClass.objects.get(name=name)


def allow(proj: Project, name: str) -> None:
    """Grant a restricted class to the project's quota policy, as an operator does in the admin."""
    klass(name).allowed_policies.add(proj.quota_policy)


def submit(
    proj: Project,
    s: GpuSpec,
    *,
    hours: float = 1,
    priority: str = "normal",
    start_by: datetime | None = None,
    name: str = "job",
    actor: Any = None,
    now: datetime | None = None,
    allow_class: bool = True,
) -> QueuedRequest:
    """Queue a request; a restricted class is granted to the project first unless ``allow_class`` is False."""
    if allow_class and klass(priority).restricted:
        allow(proj, priority)
    return services.request_submit(
        project=proj,
        name=name,
        spec=s,
        container=CONTAINER,
        duration=timedelta(hours=hours),
        start_by=start_by,
        priority_class=klass(priority),
        actor=actor or UserFactory(),
        now=now,
    )


def restore_priority_classes() -> None:
    """Put back the classes the data migrations create, by running those migrations' own functions, when a
    transactional test's flush removed them (it empties every table, migration data included)."""
    import importlib

    from django.apps import apps

    if PriorityClass.objects.exists():
        return
    for module, function in (
        ("0002_priority_classes", "create"),
        ("0004_preemptible_class", "create"),
        ("0006_high_is_restricted", "restrict"),
    ):
        migration = importlib.import_module(f"controlplane.scheduling.migrations.{module}")
        getattr(migration, function)(apps, None)
