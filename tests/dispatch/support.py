"""Builders for the dispatch tests: a booked reservation, and agent reports as the Docker runtime sends them."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from controlplane.dispatch.models import Launch
from controlplane.reservations import services as reservations
from controlplane.reservations.models import Reservation
from controlplane.reservations.specs import ContainerSpec, Window
from nodeagent import schema
from tests.factories import UserFactory
from tests.reservations.fleet import spec

CONTAINER = ContainerSpec(image="gpucp-busybox:test", command=["sleep", "60"], env={"EPOCHS": "3"})


def book(
    proj: Any,
    model: Any,
    *,
    count: int = 1,
    start_in: float = 0.0,
    seconds: float = 60.0,
    now: datetime | None = None,
    user: Any = None,
) -> Reservation:
    now = now or timezone.now()
    start = now + timedelta(seconds=start_in)
    return reservations.reservation_create(
        project=proj,
        name="job",
        spec=spec(model, count=count),
        window=Window(start, start + timedelta(seconds=seconds)),
        container=CONTAINER,
        actor=user or UserFactory(),
        now=now,
    )


def report(launch: Launch, state: str, **fields: Any) -> schema.ContainerReport:
    return schema.ContainerReport(
        launch_id=launch.launch_id,
        reservation=str(launch.reservation.public_id),
        gpu_uuids=list(launch.gpu_uuids),
        state=state,
        **fields,
    )
