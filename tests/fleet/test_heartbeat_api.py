"""The heartbeat endpoint: who may post, what a malformed body gets, and that nothing of it is stored."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from controlplane.fleet.models import GpuTelemetryMinute
from controlplane.inventory.models import Gpu, Server, ServerEvent
from tests.factories import ApiTokenFactory, OperatorFactory
from tests.fleet.helpers import T0, enroll, gpu_facts, heartbeat

pytestmark = pytest.mark.django_db
URL = "/api/v1/agent/heartbeat"


def post(client: APIClient, body: Any) -> Any:
    raw = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return client.generic("POST", URL, raw, content_type="application/json")


def counts() -> tuple[int, int, int]:
    return Gpu.objects.count(), GpuTelemetryMinute.objects.count(), ServerEvent.objects.count()


def test_heartbeat_is_stored_and_answered_with_desired_state(agent: APIClient, node: Any) -> None:
    response = post(agent, heartbeat("node-a", samples_per_gpu=5))
    assert response.status_code == 200, response.content
    reply = response.json()
    assert reply == {
        "schema_version": 1,
        "server": "node-a",
        "server_state": "commissioning",
        "heartbeat_interval_s": 5.0,
        "desired": [],
        "stop": [],
    }
    server = Server.objects.get(hostname="node-a")
    assert server.last_heartbeat_seq == 1 and server.last_heartbeat_at is not None
    assert server.facts["backend"] == "simulated"
    gpu = Gpu.objects.get(index=0)
    assert gpu.model.name == "H100-80GB" and gpu.telemetry["DCGM_FI_DEV_GPU_UTIL"] == 50.0
    assert GpuTelemetryMinute.objects.get(gpu=gpu).samples == 5


def _queries_for(agent: APIClient, gpus: int, samples: int, seq: int) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    body = heartbeat(
        "node-a",
        seq=seq,
        gpus=gpu_facts("node-a", count=gpus),
        samples_per_gpu=samples,
        start=T0 + timedelta(seconds=10 * seq),
    )
    with CaptureQueriesContext(connection) as captured:
        assert post(agent, body).status_code == 200
    return len(captured)


def test_heartbeat_query_count_does_not_grow_with_gpus_or_samples(agent: APIClient, node: Any) -> None:
    post(agent, heartbeat("node-a", gpus=gpu_facts("node-a", count=8)))  # discovery happens once
    assert _queries_for(agent, 8, 1, seq=2) == _queries_for(agent, 8, 5, seq=3) == _queries_for(agent, 8, 30, seq=4)


def test_whole_heartbeat_request_is_eight_statements_at_most(agent: APIClient, node: Any) -> None:
    post(agent, heartbeat("node-a", gpus=gpu_facts("node-a", count=8)))
    # credential + server, transaction, lock server + read GPUs, update GPUs, upsert minutes, update server,
    # dispatch probe (nothing due, nothing live): the budget of the agent endpoint, dispatch included.
    assert _queries_for(agent, 8, 30, seq=2) <= 8


def test_fleet_side_of_a_heartbeat_is_a_handful_of_statements(
    agent: APIClient, node: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from controlplane.fleet import desired

    # Dispatch's hooks have their own budget; this holds the fleet's part.
    monkeypatch.setattr(desired, "desired_state_for", lambda server: ([], []))
    monkeypatch.setattr(desired, "containers_reported", lambda server, reports, now: None)
    post(agent, heartbeat("node-a", gpus=gpu_facts("node-a", count=8)))
    # credential, savepoint pair, lock server, read GPUs, update GPUs, upsert minutes, update server
    assert _queries_for(agent, 8, 5, seq=2) <= 8
    assert GpuTelemetryMinute.objects.filter(samples=6).count() == 8


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda b: b.pop("seq"), "seq"),
        (lambda b: b["gpus"][0].pop("uuid"), "gpus.0.uuid"),
        (lambda b: b["gpus"][1].update(index="one"), "gpus.1.index"),
        (
            lambda b: b["samples"][0]["fields"].update({"DCGM_FI_DEV_GPU_UTIL": "busy"}),
            "samples.0.fields.DCGM_FI_DEV_GPU_UTIL",
        ),
        (lambda b: b["node"].update(colour="blue"), "node.colour"),
        (lambda b: b.update(schema_version=2), "schema_version"),
        (lambda b: b["samples"][1].update(uuid="GPU-not-reported"), "samples.1.uuid"),
    ],
    ids=[
        "missing-field",
        "missing-nested",
        "wrong-type",
        "wrong-type-in-sample",
        "unknown-field",
        "wrong-schema-version",
        "sample-for-unknown-gpu",
    ],
)
def test_malformed_heartbeat_names_the_field_and_stores_nothing(
    agent: APIClient, node: Any, mutate: Any, field: str
) -> None:
    body = heartbeat("node-a", samples_per_gpu=2)
    mutate(body)
    before = counts()
    response = post(agent, body)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert field in error["fields"], error
    assert error["message"]
    assert counts() == before
    assert Server.objects.get(hostname="node-a").last_heartbeat_at is None


def test_body_that_is_not_json_is_a_clear_400(agent: APIClient, node: Any) -> None:
    response = post(agent, b"{not json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "validation_error"


@override_settings(FLEET_HEARTBEAT_MAX_BYTES=2048)
def test_oversize_heartbeat_is_refused_naming_the_limit(agent: APIClient, node: Any) -> None:
    body = heartbeat("node-a", samples_per_gpu=20)
    before = counts()
    response = post(agent, body)
    assert response.status_code == 413
    assert "2048" in response.json()["error"]["message"]
    assert counts() == before


def test_credential_of_one_node_cannot_report_for_another(agent: APIClient, node: Any) -> None:
    other, _ = enroll("node-b")
    before = counts()
    response = post(agent, heartbeat("node-b"))
    assert response.status_code == 403
    assert "node.hostname" in response.json()["error"]["fields"]
    assert counts() == before
    other.refresh_from_db()
    assert other.last_heartbeat_at is None


def test_user_token_is_refused_on_the_agent_endpoint(node: Any) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {ApiTokenFactory(user=OperatorFactory()).plaintext}")
    assert post(client, heartbeat("node-a")).status_code == 401


def test_session_user_is_refused_on_the_agent_endpoint(node: Any) -> None:
    client = APIClient()
    client.force_login(OperatorFactory())
    assert post(client, heartbeat("node-a")).status_code == 401


def test_missing_credential_is_401(node: Any) -> None:
    assert post(APIClient(), heartbeat("node-a")).status_code == 401


def test_node_credential_is_refused_on_tenant_endpoints(agent: APIClient) -> None:
    assert agent.get("/api/v1/servers").status_code == 401
    assert agent.get("/api/v1/gpu-models").status_code == 401


def test_revoked_credential_is_401(agent: APIClient, node: Any, operator: Any) -> None:
    from controlplane.fleet.services import credential_revoke

    credential_revoke(server=node[0], actor=operator, reason="stolen laptop had it")
    response = post(agent, heartbeat("node-a"))
    assert response.status_code == 401
    assert "revoked" in response.json()["error"]["message"]


def test_forged_credential_is_401(node: Any) -> None:
    lookup = node[1].split("_")[1]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer gcn_{lookup}_forged")
    assert post(client, heartbeat("node-a")).status_code == 401
