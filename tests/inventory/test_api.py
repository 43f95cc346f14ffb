"""Who sees and does what on the inventory API: operator, tenant (project owner), outsider, anonymous."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from controlplane.accounts.choices import Role
from controlplane.inventory.choices import GpuHealth, ServerState
from controlplane.inventory.models import Gpu, GpuModel, Rack, Server, Site
from controlplane.inventory.services import server_set_state
from nodeagent import schema
from tests.factories import OperatorFactory, ProjectFactory, UserFactory, member_of
from tests.fleet.helpers import enroll, gpu_facts, gpu_uuid, h100_model, heartbeat, ingest

pytestmark = pytest.mark.django_db


class People:
    def __init__(self) -> None:
        self.operator = OperatorFactory(username="opal")
        self.owner = member_of(ProjectFactory(slug="atlas"), Role.OWNER, username="olive")
        self.outsider = UserFactory(username="oscar")

    def client(self, who: str) -> APIClient:
        client = APIClient()
        if who != "anonymous":
            client.force_authenticate(getattr(self, who))
        return client


@pytest.fixture
def people(db: Any) -> People:
    return People()


@pytest.fixture
def fleet(people: People) -> dict[str, Any]:
    h100_model()
    site = Site.objects.create(name="ams1")
    rack = Rack.objects.create(site=site, name="r01")
    a, _ = enroll("node-a")
    Server.objects.filter(pk=a.pk).update(rack=rack)
    ingest(
        a,
        heartbeat("node-a", gpus=gpu_facts("node-a", count=4), fields={gpu_uuid("node-a", 3): {schema.GPU_TEMP: 99.0}}),
    )
    server_set_state(server=a, to=ServerState.READY, actor=people.operator, reason="burn-in passed")
    b, _ = enroll("node-b")
    ingest(b, heartbeat("node-b", gpus=gpu_facts("node-b", count=2, product="NVIDIA A100-SXM4-40GB")))
    gone, _ = enroll("node-gone")
    server_set_state(server=gone, to=ServerState.RETIRED, actor=people.operator, reason="end of life")
    return {"a": a, "b": b, "gone": gone, "site": site, "rack": rack}


READERS = ["operator", "owner", "outsider"]


@pytest.mark.parametrize(
    "path",
    ["/api/v1/sites", "/api/v1/racks", "/api/v1/gpu-models", "/api/v1/servers", "/api/v1/gpus", "/api/v1/join-tokens"],
)
def test_anonymous_is_refused_everywhere(people: People, path: str) -> None:
    assert people.client("anonymous").get(path).status_code == 401


@pytest.mark.parametrize("who", READERS)
@pytest.mark.parametrize(
    "path", ["/api/v1/sites", "/api/v1/racks", "/api/v1/gpu-models", "/api/v1/servers", "/api/v1/gpus"]
)
def test_any_signed_in_user_reads_catalog_and_fleet(fleet: Any, people: People, who: str, path: str) -> None:
    response = people.client(who).get(path)
    assert response.status_code == 200
    assert response.json()["count"] >= 1


def test_tenant_sees_the_live_fleet_without_operator_detail(fleet: Any, people: People) -> None:
    body = people.client("owner").get("/api/v1/servers").json()
    assert [s["hostname"] for s in body["results"]] == ["node-a", "node-b"]
    server = body["results"][0]
    assert set(server) == {"id", "hostname", "state", "site", "rack", "simulated", "gpus"}
    assert server["site"] == "ams1" and len(server["gpus"]) == 4
    assert "telemetry" not in server["gpus"][0] and "health_reasons" not in server["gpus"][0]
    gone = fleet["gone"].pk
    assert people.client("owner").get(f"/api/v1/servers/{gone}").status_code == 404
    assert people.client("owner").get(f"/api/v1/gpus?server={gone}").json()["count"] == 0


def test_operator_sees_facts_credentials_and_retired_servers(fleet: Any, people: People) -> None:
    body = people.client("operator").get("/api/v1/servers").json()
    by_host = {s["hostname"]: s for s in body["results"]}
    assert set(by_host) == {"node-a", "node-b", "node-gone"}
    assert by_host["node-a"]["credential"]["lookup"] and by_host["node-gone"]["credential"] is None
    assert by_host["node-a"]["facts"]["backend"] == "simulated"
    assert by_host["node-a"]["gpus"][3]["health_reasons"] == ["temperature"]


def test_server_filters(fleet: Any, people: People) -> None:
    client = people.client("operator")
    a100 = GpuModel.objects.get(product_name="NVIDIA A100-SXM4-40GB")

    def hosts(query: str) -> list[str]:
        return [s["hostname"] for s in client.get(f"/api/v1/servers?{query}").json()["results"]]

    assert hosts("state=ready") == ["node-a"]
    assert hosts("state=ready&state=commissioning") == ["node-a", "node-b"]
    assert hosts(f"site={fleet['site'].pk}") == ["node-a"]
    assert hosts(f"gpu_model={a100.pk}") == ["node-b"]
    bad = client.get("/api/v1/servers?state=melted")
    assert bad.status_code == 400 and "state" in bad.json()["error"]["fields"]


def test_gpu_filters(fleet: Any, people: People) -> None:
    client = people.client("owner")
    assert client.get("/api/v1/gpus?health=unhealthy").json()["count"] == 1
    assert client.get(f"/api/v1/gpus?server={fleet['b'].pk}").json()["count"] == 2
    assert client.get("/api/v1/gpus?present=false").json()["count"] == 0


@pytest.mark.parametrize("who", ["owner", "outsider"])
def test_tenants_cannot_write_or_see_operator_endpoints(fleet: Any, people: People, who: str) -> None:
    client = people.client(who)
    server = fleet["a"].pk
    gpu = Gpu.objects.get(uuid=gpu_uuid("node-a", 3)).pk
    assert client.post("/api/v1/gpu-models", {"name": "X", "product_name": "X", "memory_mib": 1}).status_code == 403
    assert client.post("/api/v1/sites", {"name": "fra1"}).status_code == 403
    assert client.post(f"/api/v1/servers/{server}/state", {"state": "draining", "reason": "x"}).status_code == 403
    assert client.post(f"/api/v1/servers/{server}/revoke-credential", {"reason": "x"}).status_code == 403
    assert client.get(f"/api/v1/servers/{server}/events").status_code == 403
    assert client.post(f"/api/v1/gpus/{gpu}/acknowledge", {"reason": "x"}).status_code == 403
    assert client.get("/api/v1/join-tokens").status_code == 403
    assert client.post("/api/v1/join-tokens", {}).status_code == 403
    assert Server.objects.get(pk=server).state == ServerState.READY


def test_operator_manages_catalog(people: People) -> None:
    client = people.client("operator")
    created = client.post(
        "/api/v1/gpu-models",
        {"name": "L4", "product_name": "NVIDIA L4", "memory_mib": 23034, "price_per_gpu_hour": "0.8000"},
    )
    assert created.status_code == 201
    bad = client.post(
        "/api/v1/gpu-models", {"name": "L40", "product_name": "NVIDIA L40", "memory_mib": 1, "price_per_gpu_hour": "-1"}
    )
    assert bad.status_code == 400 and "price_per_gpu_hour" in bad.json()["error"]["fields"]
    pk = created.json()["id"]
    assert client.patch(f"/api/v1/gpu-models/{pk}", {"price_per_gpu_hour": "0.9000"}).status_code == 200
    assert client.delete(f"/api/v1/gpu-models/{pk}").status_code == 204


def test_catalog_entry_in_use_cannot_be_deleted(fleet: Any, people: People) -> None:
    h100 = GpuModel.objects.get(name="H100-80GB")
    response = people.client("operator").delete(f"/api/v1/gpu-models/{h100.pk}")
    assert response.status_code == 409
    assert GpuModel.objects.filter(pk=h100.pk).exists()


def test_operator_changes_state_with_reason_and_reads_events(fleet: Any, people: People) -> None:
    client = people.client("operator")
    server = fleet["a"].pk
    response = client.post(f"/api/v1/servers/{server}/state", {"state": "draining", "reason": "firmware"})
    assert response.status_code == 200 and response.json()["state"] == "draining"
    refused = client.post(f"/api/v1/servers/{server}/state", {"state": "commissioning", "reason": "oops"})
    assert refused.status_code == 409
    assert refused.json()["error"]["from"] == "draining" and refused.json()["error"]["to"] == "commissioning"
    missing_reason = client.post(f"/api/v1/servers/{server}/state", {"state": "ready"})
    assert missing_reason.status_code == 400 and "reason" in missing_reason.json()["error"]["fields"]
    events = client.get(f"/api/v1/servers/{server}/events").json()["results"]
    assert events[0]["kind"] == "state" and events[0]["reason"] == "firmware"
    assert events[0]["actor_label"] == "opal"


def test_operator_revokes_a_credential(fleet: Any, people: People) -> None:
    client = people.client("operator")
    response = client.post(f"/api/v1/servers/{fleet['b'].pk}/revoke-credential", {"reason": "compromised"})
    assert response.status_code == 200 and response.json()["credential"] is None
    again = client.post(f"/api/v1/servers/{fleet['b'].pk}/revoke-credential", {"reason": "again"})
    assert again.status_code == 409


def test_operator_acknowledges_a_gpu_fault(fleet: Any, people: People) -> None:
    gpu = Gpu.objects.get(uuid=gpu_uuid("node-a", 0))
    ingest(
        fleet["a"],
        heartbeat(
            "node-a",
            seq=2,
            gpus=gpu_facts("node-a", count=4),
            events=[{"kind": "xid", "ts": "2026-01-05T12:00:10Z", "uuid": gpu.uuid, "xid": 79}],
        ),
    )
    client = people.client("operator")
    response = client.post(f"/api/v1/gpus/{gpu.pk}/acknowledge", {"reason": "reseated"})
    assert response.status_code == 200
    assert response.json()["health"] == GpuHealth.HEALTHY
    assert client.post(f"/api/v1/gpus/{gpu.pk}/acknowledge", {"reason": "again"}).status_code == 409


def test_operator_issues_lists_and_revokes_join_tokens(people: People) -> None:
    client = people.client("operator")
    created = client.post("/api/v1/join-tokens", {"note": "rack 7", "ttl_s": 3600})
    assert created.status_code == 201
    plaintext = created.json()["token"]
    assert plaintext.startswith("gcj_")
    listed = client.get("/api/v1/join-tokens").json()["results"]
    assert listed[0]["status"] == "active" and "token" not in listed[0]
    assert plaintext not in str(listed)
    revoked = client.post(f"/api/v1/join-tokens/{created.json()['id']}/revoke")
    assert revoked.status_code == 200 and revoked.json()["status"] == "revoked"
    assert client.post("/api/v1/join-tokens", {"ttl_s": 1}).status_code == 400


@pytest.mark.parametrize("who", ["operator", "owner"])
def test_server_list_query_count_does_not_grow_with_servers(
    people: People, who: str, django_assert_max_num_queries: Any
) -> None:
    h100_model()
    for i in range(6):
        server, _ = enroll(f"node-{i}")
        ingest(server, heartbeat(f"node-{i}", gpus=gpu_facts(f"node-{i}", count=8)))
    client = people.client(who)
    with django_assert_max_num_queries(6):
        response = client.get("/api/v1/servers")
    assert response.status_code == 200 and len(response.json()["results"]) == 6
    with django_assert_max_num_queries(4):
        response = client.get("/api/v1/gpus")
    assert response.json()["count"] == 48


def test_event_list_query_count_is_bounded(fleet: Any, people: People, django_assert_max_num_queries: Any) -> None:
    with django_assert_max_num_queries(5):
        response = people.client("operator").get(f"/api/v1/servers/{fleet['a'].pk}/events")
    assert len(response.json()["results"]) >= 4
