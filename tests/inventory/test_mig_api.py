"""The operator's MIG reconfiguration through the API: staff only, a drained server, nothing booked on the
GPU, a layout the GPU can hold (refused naming the field otherwise), an event for the request; and MIG devices
and the vendor shown to everyone who sees the GPU."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from controlplane.inventory.choices import EventKind, MigChange, ServerState
from controlplane.inventory.models import Gpu, ServerEvent
from controlplane.inventory.services import server_set_state
from nodeagent.backends.simulated import SimulatedBackend
from tests.fleet.helpers import enroll, h100_model, heartbeat, ingest
from tests.inventory.test_api import People, people  # noqa: F401 - fixtures
from tests.reservations.fleet import hold, project

pytestmark = pytest.mark.django_db


@pytest.fixture
def mig_node(people: People) -> dict[str, Any]:  # noqa: F811 - the fixture above
    h100_model()
    server, _ = enroll("node-m")
    backend = SimulatedBackend("2xH100-80GB:mig=7g.80gb", hostname="node-m")
    gpus = [g.model_dump(mode="json") for g in backend.discover()]
    ingest(server, heartbeat("node-m", gpus=gpus))
    server_set_state(server=server, to=ServerState.READY, actor=people.operator, reason="burn-in passed")
    return {"server": server, "gpus": list(Gpu.objects.filter(server=server).order_by("index"))}


def post_mig(people: People, who: str, gpu: Gpu, body: dict[str, Any]) -> Any:  # noqa: F811
    return people.client(who).post(f"/api/v1/gpus/{gpu.pk}/mig", body, format="json")


def drain(people: People, server: Any) -> None:  # noqa: F811
    server_set_state(server=server, to=ServerState.MAINTENANCE, actor=people.operator, reason="re-slicing")


def test_everyone_who_sees_a_gpu_sees_its_vendor_and_mig_devices(mig_node: Any, people: People) -> None:  # noqa: F811
    for who in ("operator", "owner", "outsider"):
        body = people.client(who).get(f"/api/v1/gpus/{mig_node['gpus'][0].pk}").json()
        assert body["vendor"] == "nvidia"
        assert body["mig_mode"] == {"current": True, "pending": True}
        (device,) = body["mig_devices"]
        assert device["profile"] == "7g.80gb" and device["uuid"].startswith("MIG-")
    tenant = people.client("owner").get(f"/api/v1/gpus/{mig_node['gpus'][0].pk}").json()
    assert "mig_desired" not in tenant and "mig_change" not in tenant


@pytest.mark.parametrize("who", ["owner", "outsider", "anonymous"])
def test_only_operators_reconfigure_mig(mig_node: Any, people: People, who: str) -> None:  # noqa: F811
    drain(people, mig_node["server"])
    response = post_mig(people, who, mig_node["gpus"][0], {"enabled": True, "layout": ["1g.10gb"]})
    assert response.status_code in (401, 403)
    assert "error" in response.json()
    assert Gpu.objects.get(pk=mig_node["gpus"][0].pk).mig_change == MigChange.NONE


def test_a_server_still_ready_is_refused_drain_first(mig_node: Any, people: People) -> None:  # noqa: F811
    response = post_mig(people, "operator", mig_node["gpus"][0], {"enabled": True, "layout": ["1g.10gb"]})
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "server_not_drained"


def test_a_gpu_booked_now_or_later_is_refused(mig_node: Any, people: People) -> None:  # noqa: F811
    gpu = mig_node["gpus"][1]
    now = timezone.now()
    hold(gpu, now + timedelta(hours=2), now + timedelta(hours=3), proj=project(slug="atlas-run"))
    drain(people, mig_node["server"])
    response = post_mig(people, "operator", gpu, {"enabled": True, "layout": ["1g.10gb"]})
    assert response.status_code == 409 and response.json()["error"]["code"] == "gpu_booked"
    assert Gpu.objects.get(pk=gpu.pk).mig_change == MigChange.NONE


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"enabled": True, "layout": ["4g.40gb", "4g.40gb"]}, "at most 1 x 4g.40gb"),
        ({"enabled": True, "layout": ["4g.40gb", "3g.40gb", "1g.10gb"]}, "compute slices"),
        ({"enabled": True, "layout": ["5g.50gb"]}, "not a MIG profile"),
        ({"enabled": False, "layout": ["1g.10gb"]}, "Must be empty"),
        ({"enabled": True, "layout": ["BAD PROFILE"]}, ""),
        ({"layout": ["1g.10gb"]}, ""),
    ],
)
def test_a_layout_the_gpu_cannot_hold_is_400_naming_the_field(mig_node: Any, people: People, body, message) -> None:  # noqa: F811
    drain(people, mig_node["server"])
    response = post_mig(people, "operator", mig_node["gpus"][0], body)
    assert response.status_code == 400, response.content
    fields = response.json()["error"]["fields"]
    assert set(fields) & {"layout", "enabled", "layout.0"}, fields
    assert message in str(fields)
    assert Gpu.objects.get(pk=mig_node["gpus"][0].pk).mig_change == MigChange.NONE  # nothing half-written


def test_a_gpu_without_mig_is_refused(people: People) -> None:  # noqa: F811
    server, _ = enroll("node-l")
    gpus = [g.model_dump(mode="json") for g in SimulatedBackend("1xL40S", hostname="node-l").discover()]
    ingest(server, heartbeat("node-l", gpus=gpus))
    drain(people, server)
    response = post_mig(people, "operator", Gpu.objects.get(server=server), {"enabled": True, "layout": ["1g.10gb"]})
    assert response.status_code == 400 and "does not support MIG" in str(response.json()["error"]["fields"])


def test_a_request_on_a_drained_idle_gpu_is_recorded_and_sent_to_the_agent(mig_node: Any, people: People) -> None:  # noqa: F811
    drain(people, mig_node["server"])
    gpu = mig_node["gpus"][0]
    body = {"enabled": True, "layout": ["3g.40gb", "2g.20gb", "2g.20gb"], "reason": "three tenants"}
    response = post_mig(people, "operator", gpu, body)
    assert response.status_code == 200, response.content
    data = response.json()
    assert data["mig_change"] == "applying" and data["mig_generation"] == 1
    assert data["mig_desired"] == {"enabled": True, "layout": ["3g.40gb", "2g.20gb", "2g.20gb"]}
    event = ServerEvent.objects.get(kind=EventKind.MIG_REQUESTED)
    assert (event.actor_label, event.reason, event.gpu_id) == ("opal", "three tenants", gpu.pk)
    again = post_mig(people, "operator", gpu, {"enabled": False, "layout": []})
    assert again.json()["mig_generation"] == 2  # a newer request supersedes the one the agent has not answered


def test_the_server_returns_to_ready_only_after_the_agent_reports(mig_node: Any, people: People) -> None:  # noqa: F811
    server = mig_node["server"]
    drain(people, server)
    gpu = mig_node["gpus"][0]
    assert post_mig(people, "operator", gpu, {"enabled": True, "layout": ["7g.80gb"]}).status_code == 200
    response = people.client("operator").post(
        f"/api/v1/servers/{server.pk}/state", {"state": "ready", "reason": "done"}, format="json"
    )
    assert response.status_code == 409 and response.json()["error"]["code"] == "mig_pending"
    assert Gpu.objects.get(pk=gpu.pk).server.state == ServerState.MAINTENANCE
    event = {
        "kind": "mig",
        "ts": timezone.now().isoformat(),
        "uuid": gpu.uuid,
        "generation": 1,
        "outcome": "applied",
        "message": "the GPU already has this MIG layout",
    }
    backend = SimulatedBackend("2xH100-80GB:mig=7g.80gb", hostname="node-m")
    facts = [g.model_dump(mode="json") for g in backend.discover()]
    ingest(server, heartbeat("node-m", seq=2, start=timezone.now(), gpus=facts, events=[event]))
    response = people.client("operator").post(
        f"/api/v1/servers/{server.pk}/state", {"state": "ready", "reason": "done"}, format="json"
    )
    assert response.status_code == 200, response.content
