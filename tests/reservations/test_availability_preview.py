"""The availability API tells the portal what it draws: which GPUs cannot be booked and why, and which GPUs a
booking would get (a dry run of booking's own placement)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from controlplane.inventory.choices import GpuHealth, ServerState
from controlplane.inventory.services import server_set_state
from controlplane.reservations import services
from tests.factories import OperatorFactory, UserFactory
from tests.reservations.fleet import CONTAINER, gpu_model, project, server, spec, window

pytestmark = pytest.mark.django_db
TIMELINE = "/api/v1/availability/timeline/"
FREE = "/api/v1/availability/free/"


def _rows(api_client, w):  # type: ignore[no-untyped-def]
    response = api_client.get(TIMELINE, {"start": "now", "end": (w.ends_at + timedelta(hours=1)).isoformat()})
    assert response.status_code == 200, response.data
    return {(g["server"], g["index"]): g for g in response.data["gpus"]}


def test_timeline_names_why_capacity_is_not_free(api_client):  # type: ignore[no-untyped-def]
    model = gpu_model()
    ready = server(model, gpus=2, hostname="gpu-ready")
    draining = server(model, gpus=2, hostname="gpu-draining")
    maint = server(model, gpus=1, hostname="gpu-maint")
    operator = OperatorFactory()
    server_set_state(server=draining, to=ServerState.DRAINING, actor=operator, reason="PSU swap on Friday")
    server_set_state(server=maint, to=ServerState.MAINTENANCE, actor=operator, reason="firmware update")
    sick = ready.gpus.get(index=1)
    sick.health, sick.health_reasons = GpuHealth.UNHEALTHY, ["xid:79", "temperature"]
    sick.save()
    api_client.force_authenticate(UserFactory())
    w = window()
    rows = _rows(api_client, w)

    assert rows[("gpu-ready", 0)]["unavailable"] is None
    assert rows[("gpu-ready", 0)]["server_state"] == "ready" and rows[("gpu-ready", 0)]["health"] == "healthy"
    assert rows[("gpu-ready", 1)]["unavailable"] == {"reason": "unhealthy", "detail": "xid:79; temperature"}
    for index in (0, 1):
        assert rows[("gpu-draining", index)]["unavailable"] == {"reason": "draining", "detail": "PSU swap on Friday"}
    assert rows[("gpu-maint", 0)]["unavailable"] == {"reason": "maintenance", "detail": "firmware update"}

    # The free-window line counts the same GPUs out.
    free = api_client.get(FREE, {"gpu_model": model.name, "gpu_count": 1, "start": "now", "end": w.ends_at.isoformat()})
    assert free.status_code == 200 and free.data["free_gpus"] == 1


def test_free_proposal_is_what_booking_then_takes(api_client):  # type: ignore[no-untyped-def]
    model = gpu_model()
    server(model, gpus=8, hostname="gpu-big")
    server(model, gpus=4, hostname="gpu-small")
    owner = UserFactory()
    proj = project(owner=owner)
    api_client.force_authenticate(owner)
    w = window()
    params = {"gpu_model": model.name, "start": w.starts_at.isoformat(), "end": w.ends_at.isoformat()}

    for count in (1, 2, 4):
        free = api_client.get(FREE, {**params, "gpu_count": count})
        assert free.status_code == 200, free.data
        proposal = free.data["proposal"]
        assert proposal is not None and len(proposal) == count
        booked = services.reservation_create(
            project=proj, name="probe", spec=spec(model, count=count), window=w, container=CONTAINER, actor=owner
        )
        assert sorted(a.gpu.uuid for a in booked.allocations.all()) == sorted(proposal)
        services.reservation_cancel(reservation=booked, actor=owner, reason="probe")

    # More than the fleet holds: no proposal.
    assert api_client.get(FREE, {**params, "gpu_count": 13}).data["proposal"] is None
