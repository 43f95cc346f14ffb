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
from tests.fleet.helpers import T0, enroll, gpu_facts, heartbeat, ingest

pytestmark = pytest.mark.django_db
URL = "/api/v1/agent/heartbeat"


def post(client: APIClient, body: Any) -> Any:
    raw = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return client.generic("POST", URL, raw, content_type="application/json")


def _mig(*uuids: str) -> dict[str, Any]:
    return {"current": True, "pending": True, "devices": [{"uuid": u} for u in uuids]}


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


def test_whole_heartbeat_request_is_four_statements_on_postgresql(agent: APIClient, node: Any) -> None:
    from django.db import connection

    post(agent, heartbeat("node-a", gpus=gpu_facts("node-a", count=8)))
    # PostgreSQL: the transaction, the credential verified with its server locked and the GPUs read, and the
    # writes (GPUs, minutes, server) sent with dispatch's probe (nothing due, nothing live) as one statement:
    # the budget of the agent endpoint, dispatch included. SQLite, without data-modifying CTEs, sends the
    # writes and the probe one by one.
    budget = 4 if connection.vendor == "postgresql" else 7
    assert _queries_for(agent, 8, 30, seq=2) <= budget


def test_fleet_side_of_a_heartbeat_is_a_handful_of_statements(
    agent: APIClient, node: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import connection

    from controlplane.fleet import desired

    # Dispatch's hooks have their own budget; this holds the fleet's part (the probe costs no statement of its
    # own on PostgreSQL).
    monkeypatch.setattr(desired, "desired_state_for", lambda server, **kwargs: ([], []))
    monkeypatch.setattr(desired, "containers_reported", lambda server, reports, now: None)
    post(agent, heartbeat("node-a", gpus=gpu_facts("node-a", count=8)))
    # savepoint pair, credential + lock server + read GPUs, then the GPUs, minutes and server writes
    budget = 4 if connection.vendor == "postgresql" else 7
    assert _queries_for(agent, 8, 5, seq=2) <= budget
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
        (lambda b: b.update(schema_version=3), "schema_version"),
        (lambda b: b["samples"][1].update(uuid="GPU-not-reported"), "samples.1.uuid"),
        # Beyond the columns (bigint, integer) and NVML's widest counter: a 400, not the database's 500.
        (lambda b: b.update(seq=2**63), "seq"),
        (lambda b: b["gpus"][0].update(memory_total_mib=2**31), "gpus.0.memory_total_mib"),
        (
            lambda b: b["samples"][0]["fields"].update({"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 2.0**65}),
            "samples.0.fields.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        ),
        (lambda b: b["gpus"][1].update(mig=_mig("MIG-a", "MIG-a")), "gpus.1.mig.devices.1.uuid"),
        (lambda b: [g.update(mig=_mig("MIG-a")) for g in b["gpus"]], "gpus.1.mig.devices.0.uuid"),
    ],
    ids=[
        "missing-field",
        "missing-nested",
        "wrong-type",
        "wrong-type-in-sample",
        "unknown-field",
        "wrong-schema-version",
        "sample-for-unknown-gpu",
        "seq-past-bigint",
        "memory-past-integer",
        "reading-past-2-64",
        "mig-device-twice-on-a-gpu",
        "mig-device-on-two-gpus",
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


# -- wire version 2: columns per GPU --------------------------------------------------------------------------


def _v2(**kwargs: Any) -> dict[str, Any]:
    return heartbeat("node-a", samples_per_gpu=3, version=2, **kwargs)


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (
            lambda b: b["samples"][1]["fields"]["DCGM_FI_DEV_GPU_TEMP"].__setitem__(2, "hot"),
            "samples.1.fields.DCGM_FI_DEV_GPU_TEMP.2",
        ),
        (lambda b: b["samples"][0]["fields"]["DCGM_FI_DEV_GPU_TEMP"].pop(), "samples.0.fields.DCGM_FI_DEV_GPU_TEMP"),
        (
            lambda b: b["samples"][0]["ts"].append(b["samples"][0]["ts"][-1] + 1),
            "samples.0.fields.DCGM_FI_DEV_GPU_UTIL",
        ),
        (lambda b: b["samples"][0]["ts"].__setitem__(1, -5), "samples.0.ts.1"),
        (lambda b: b["samples"][0]["ts"].__setitem__(1, "2026-01-05T12:00:00Z"), "samples.0.ts.1"),
        (lambda b: b["samples"][0]["ts"].__setitem__(0, 1e300), "samples.0.ts.0"),
        (lambda b: b["samples"][1].update(uuid="GPU-not-reported"), "samples.1.uuid"),
        (lambda b: b["samples"][0].update(values=[]), "samples.0.values"),
        (lambda b: b["samples"][0].pop("ts"), "samples.0.ts"),
    ],
    ids=[
        "bad-value",
        "short-column",
        "long-ts",
        "negative-ts",
        "iso-ts",
        "ts-past-year-9999",
        "unknown-gpu",
        "unknown-key",
        "no-ts",
    ],
)
def test_malformed_v2_heartbeat_names_the_field_and_stores_nothing(
    agent: APIClient, node: Any, mutate: Any, field: str
) -> None:
    body = _v2()
    mutate(body)
    before = counts()
    response = post(agent, body)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert field in error["fields"], error
    assert error["message"].startswith(field)
    assert counts() == before
    assert Server.objects.get(hostname="node-a").last_heartbeat_at is None


def test_v2_reading_that_is_not_a_finite_number_is_refused_naming_it(agent: APIClient, node: Any) -> None:
    body = json.dumps(_v2()).replace(
        '"DCGM_FI_DEV_GPU_TEMP": [40.0, 40.0, 40.0]', '"DCGM_FI_DEV_GPU_TEMP": [40.0, NaN, 40.0]', 1
    )
    assert "NaN" in body
    before = counts()
    response = post(agent, body)
    assert response.status_code == 400, response.content
    assert "samples.0.fields.DCGM_FI_DEV_GPU_TEMP.1" in response.json()["error"]["fields"]
    assert counts() == before


@pytest.mark.parametrize("reading", ["NaN", "Infinity", "-Infinity"])
def test_v1_reading_that_is_not_a_finite_number_is_refused_naming_it(agent: APIClient, node: Any, reading: str) -> None:
    """An older agent's body: each sample's reading must be a number or null, in every sample (not only the
    newest, which the GPU's latest telemetry is taken from)."""
    body = heartbeat("node-a", samples_per_gpu=2, version=1)
    for index in (0, len(body["samples"]) - 1):
        body["samples"][index]["fields"]["DCGM_FI_DEV_GPU_TEMP"] = 12345.5
        raw = json.dumps(body).replace("12345.5", reading, 1)
        body["samples"][index]["fields"]["DCGM_FI_DEV_GPU_TEMP"] = 40.0
        before = counts()
        response = post(agent, raw)
        assert response.status_code == 400, response.content
        assert f"samples.{index}.fields.DCGM_FI_DEV_GPU_TEMP" in response.json()["error"]["fields"]
        assert counts() == before


def test_v2_unequal_columns_say_which_lengths(agent: APIClient, node: Any) -> None:
    body = _v2()
    body["samples"][0]["fields"]["DCGM_FI_DEV_GPU_TEMP"].pop()
    message = post(agent, body).json()["error"]["fields"]["samples.0.fields.DCGM_FI_DEV_GPU_TEMP"][0]
    assert "2 values" in message and "ts has 3" in message


def test_v2_heartbeat_over_the_sample_limit_is_refused_naming_samples(agent: APIClient, node: Any) -> None:
    from nodeagent import schema

    body = _v2()
    per_gpu = schema.MAX_SAMPLES // 2 + 1
    start = body["samples"][0]["ts"][0]
    for series in body["samples"]:
        series["ts"] = [start + i for i in range(per_gpu)]
        series["fields"] = {}
    before = counts()
    response = post(agent, body)
    assert response.status_code == 400, response.content
    assert "samples" in response.json()["error"]["fields"]
    assert counts() == before


def test_v1_heartbeat_without_schema_version_is_still_version_1(agent: APIClient, node: Any) -> None:
    body = heartbeat("node-a", samples_per_gpu=2, version=1)
    del body["schema_version"]
    assert post(agent, body).status_code == 200
    assert GpuTelemetryMinute.objects.filter(samples=2).count() == 2


def test_v2_series_of_one_gpu_in_pieces_and_out_of_order_fold_like_one(agent: APIClient, node: Any) -> None:
    body = _v2()
    first = body["samples"][0]
    # The GPU's three readings as two series, the later one first; only the first has the temperature.
    late = {"uuid": first["uuid"], "ts": first["ts"][2:], "fields": {"DCGM_FI_DEV_GPU_UTIL": [90.0]}}
    first["ts"], first["fields"] = (
        first["ts"][:2],
        {
            "DCGM_FI_DEV_GPU_UTIL": [10.0, 20.0],
            "DCGM_FI_DEV_GPU_TEMP": [40.0, 95.0],
        },
    )
    body["samples"].insert(0, late)
    assert post(agent, body).status_code == 200, post
    gpu = Gpu.objects.get(uuid=first["uuid"])
    minute = GpuTelemetryMinute.objects.get(gpu=gpu)
    assert (minute.samples, minute.util_samples, minute.util_sum, minute.util_max) == (3, 3, 120.0, 90.0)
    assert minute.temp_max_c == 95.0
    # The newest reading (util 90, no temperature) is the GPU's telemetry: 95 C was not the last word.
    assert gpu.telemetry == {"DCGM_FI_DEV_GPU_UTIL": 90.0}
    assert gpu.telemetry_at == T0 + timedelta(seconds=2)
    assert gpu.health_reasons == []


def test_v2_replay_after_a_v1_heartbeat_is_not_counted_twice(agent: APIClient, node: Any) -> None:
    """An agent upgraded mid-outage resends in version 2 what it sent in version 1: the watermark is the same."""
    assert post(agent, heartbeat("node-a", samples_per_gpu=3, version=1)).status_code == 200
    assert post(agent, heartbeat("node-a", seq=2, samples_per_gpu=4, version=2)).status_code == 200
    assert sorted(GpuTelemetryMinute.objects.values_list("samples", flat=True)) == [4, 4]


def test_a_due_window_reaches_the_node_by_a_heartbeat_without_container_reports(
    agent: APIClient, node: Any, h100: Any
) -> None:
    """Dispatch's probe rides along with the heartbeat's writes when no container is reported: it must still
    find the window that is due, and the next heartbeat the launch that is live."""
    from tests.dispatch.support import book
    from tests.reservations.fleet import project

    assert post(agent, heartbeat("node-a")).status_code == 200  # discovery: two H100s
    Server.objects.filter(hostname="node-a").update(state="ready")
    book(project(), h100, count=2)
    for seq in (2, 3):
        response = post(agent, heartbeat("node-a", seq=seq, start=T0 + timedelta(seconds=10 * seq)))
        assert response.status_code == 200, response.content
        [item] = response.json()["desired"]
        assert sorted(item["gpu_uuids"]) == sorted(Gpu.objects.values_list("uuid", flat=True))


def test_a_credential_revoked_between_heartbeats_refuses_the_next_and_writes_nothing(
    agent: APIClient, node: Any, operator: Any
) -> None:
    """The credential is verified inside the heartbeat's transaction, not cached: revocation is immediate."""
    from controlplane.fleet.services import credential_revoke

    assert post(agent, heartbeat("node-a", seq=1)).status_code == 200
    credential_revoke(server=node[0], actor=operator, reason="node reinstalled")
    before = counts()
    response = post(agent, heartbeat("node-a", seq=2, start=T0 + timedelta(seconds=10)))
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"
    assert "revoked" in response.json()["error"]["message"]
    assert counts() == before
    assert Server.objects.get(hostname="node-a").last_heartbeat_seq == 1


def test_a_malformed_credential_is_refused_before_the_body_is_read(node: Any) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer gcp_notanode_token")
    response = post(client, b"{not json")
    assert response.status_code == 401
    assert "not a node credential" in response.json()["error"]["message"]


def test_gpus_that_swap_indexes_or_take_a_missing_ones_are_taken(agent: APIClient, node: Any) -> None:
    """Indexes are unique among a server's present GPUs, and both engines check that row by row inside one
    UPDATE: a swap (cards reseated, the enumeration changed) or a card moved in at the index of one that went
    missing must not fail the heartbeat on the way to a valid end."""
    first = gpu_facts("node-a", count=3)
    assert post(agent, heartbeat("node-a", gpus=first)).status_code == 200
    swapped = [{**first[0], "index": 1}, {**first[1], "index": 0}, first[2]]
    response = post(agent, heartbeat("node-a", seq=2, start=T0 + timedelta(minutes=1), gpus=swapped))
    assert response.status_code == 200, response.content
    assert dict(Gpu.objects.values_list("uuid", "index")) == {g["uuid"]: g["index"] for g in swapped}
    # GPU 2 goes missing and another node's card arrives at its index, while 0 and 1 swap back.
    other, _ = enroll("node-b")
    moved = gpu_facts("node-b", count=1)[0]
    ingest(other, heartbeat("node-b", gpus=[moved]))
    back = [first[0], first[1], {**moved, "index": 2}]
    response = post(agent, heartbeat("node-a", seq=3, start=T0 + timedelta(minutes=2), gpus=back))
    assert response.status_code == 200, response.content
    rows = {g.uuid: (g.server.hostname, g.index, g.present) for g in Gpu.objects.select_related("server")}
    assert rows == {
        first[0]["uuid"]: ("node-a", 0, True),
        first[1]["uuid"]: ("node-a", 1, True),
        first[2]["uuid"]: ("node-a", 2, False),
        moved["uuid"]: ("node-a", 2, True),
    }
