"""The control plane client over real HTTP and its backoff (the journal behind heartbeats: test_journal.py)."""

from __future__ import annotations

import socket
from datetime import UTC, datetime

import pytest
from control_plane_double import ControlPlaneDouble

from nodeagent import schema
from nodeagent.client import (
    Backoff,
    ControlPlaneClient,
    CredentialRevoked,
    Rejected,
    Unreachable,
)

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
NODE = schema.NodeFacts(hostname="node-a", agent_version="0.1.0", backend="simulated", simulated=True)


def heartbeat(seq: int = 1) -> schema.Heartbeat:
    return schema.Heartbeat(seq=seq, sent_at=NOW, node=NODE, gpus=[])


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_enroll_sends_the_schema_and_validates_the_reply(control_plane: ControlPlaneDouble):
    client = ControlPlaneClient(control_plane.url)
    reply = client.enroll(schema.EnrollRequest(join_token="join-token-123", hostname="node-a", simulated=True))
    assert reply.credential == control_plane.credential and reply.server == "node-a"
    [request] = control_plane.received
    assert request.body == {
        "schema_version": 1,
        "join_token": "join-token-123",
        "hostname": "node-a",
        "simulated": True,
    }
    assert request.headers["Content-Type"] == "application/json"
    assert request.headers["User-Agent"].startswith("nodeagent/")


def test_heartbeat_carries_the_bearer_credential(control_plane: ControlPlaneDouble):
    reply = ControlPlaneClient(control_plane.url).heartbeat(control_plane.credential, heartbeat())
    assert reply.server_state == "ready"
    assert control_plane.received[0].headers["Authorization"] == f"Bearer {control_plane.credential}"


def test_a_revoked_credential_is_its_own_error(control_plane: ControlPlaneDouble):
    with pytest.raises(CredentialRevoked, match="unknown credential"):
        ControlPlaneClient(control_plane.url).heartbeat("not-the-credential", heartbeat())


def test_a_4xx_is_rejected_with_the_control_planes_sentence(control_plane: ControlPlaneDouble):
    control_plane.fail(
        1, status=400, body={"error": {"code": "validation_error", "message": "samples.0.uuid: bad uuid", "fields": {}}}
    )
    with pytest.raises(Rejected) as caught:
        ControlPlaneClient(control_plane.url).heartbeat(control_plane.credential, heartbeat())
    assert caught.value.status == 400 and caught.value.message == "samples.0.uuid: bad uuid"
    assert not isinstance(caught.value, CredentialRevoked)


def test_enroll_401_is_a_refusal_not_a_revocation(control_plane: ControlPlaneDouble):
    control_plane.fail(1, status=401)
    with pytest.raises(Rejected) as caught:
        ControlPlaneClient(control_plane.url).enroll(schema.EnrollRequest(join_token="join-token-123", hostname="n"))
    assert not isinstance(caught.value, CredentialRevoked)


@pytest.mark.parametrize(
    ("status", "body"), [(503, None), (500, "<html>oops</html>"), (200, {"unexpected": 1}), (200, "not json")]
)
def test_server_errors_and_unparseable_replies_are_worth_retrying(control_plane: ControlPlaneDouble, status, body):
    control_plane.script.append((status, body if body is not None else {}))
    with pytest.raises(Unreachable):
        ControlPlaneClient(control_plane.url).heartbeat(control_plane.credential, heartbeat())


def test_a_reply_in_another_schema_version_is_not_accepted(control_plane: ControlPlaneDouble):
    control_plane.script.append(
        (200, {"schema_version": 2, "server": "n", "server_state": "ready", "heartbeat_interval_s": 5})
    )
    with pytest.raises(Unreachable, match="schema_version"):
        ControlPlaneClient(control_plane.url).heartbeat(control_plane.credential, heartbeat())


def test_an_unreachable_control_plane_is_an_error_not_a_crash():
    with pytest.raises(Unreachable, match="ConnectionError"):
        ControlPlaneClient(closed_port_url(), timeout=2).heartbeat("x", heartbeat())


def test_server_url_must_be_http():
    with pytest.raises(ValueError, match="must start with http"):
        ControlPlaneClient("cp.example:8000")


def test_backoff_grows_exponentially_with_jitter_up_to_a_cap():
    low = Backoff(base_s=1, cap_s=30, rng=lambda: 0.0)
    high = Backoff(base_s=1, cap_s=30, rng=lambda: 1.0)
    assert [low.failure() for _ in range(7)] == [0.5, 1, 2, 4, 8, 15, 15]
    assert [high.failure() for _ in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    high.reset()
    assert high.failure() == 1


SECRET_FOR_TESTS = "hf_client-secret-for-tests-1234"


@pytest.mark.parametrize(
    ("breakage", "where"),
    [
        # A secret going nowhere (neither env nor file): refused as a whole, its value with it.
        ({"secrets": [{"name": "hf", "value": SECRET_FOR_TESTS}]}, "desired.0.secrets.0: "),
        # An egress container without its network's name: the whole container is refused, secrets and all.
        (
            {"network": "egress", "secrets": [{"name": "hf", "value": SECRET_FOR_TESTS, "file": True}]},
            "desired.0: ",
        ),
    ],
)
def test_a_reply_that_breaks_the_schema_is_said_without_what_it_held(
    control_plane: ControlPlaneDouble, breakage: dict[str, object], where: str
):
    # A reply's desired state carries secrets and registry passwords: pydantic's own text quotes what it refused.
    container = {
        "launch_id": "l-1",
        "reservation": "r-1",
        "project": "p",
        "image": "busybox",
        "gpu_uuids": ["GPU-1"],
        "window_start": "2030-01-01T00:00:00Z",
        "window_end": "2030-01-01T01:00:00Z",
        "registry_auth": {"registry": "r.example", "username": "u", "password": SECRET_FOR_TESTS},
        **breakage,
    }
    control_plane.script.append(
        (200, {"server": "n", "server_state": "ready", "heartbeat_interval_s": 5, "desired": [container]})
    )
    with pytest.raises(Unreachable) as caught:
        ControlPlaneClient(control_plane.url).heartbeat(control_plane.credential, heartbeat())
    message = str(caught.value)
    assert where in message
    assert SECRET_FOR_TESTS not in message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__  # never printed with it
