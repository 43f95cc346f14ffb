from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.core import tokens
from controlplane.core.errors import Conflict, PermissionDenied, ValidationFailed
from controlplane.fleet import services
from controlplane.fleet.models import JoinToken, NodeCredential
from controlplane.inventory.choices import EventKind, ServerState
from controlplane.inventory.models import Server, ServerEvent
from controlplane.inventory.services import server_set_state

pytestmark = pytest.mark.django_db


def _post_enroll(token: str, hostname: str = "node-a") -> Any:
    return APIClient().post(
        "/api/v1/agent/enroll", {"join_token": token, "hostname": hostname, "simulated": True}, format="json"
    )


def test_join_token_is_stored_hashed_and_shown_once(operator: Any) -> None:
    token, plaintext = services.join_token_create(actor=operator, note="rack 4")
    assert plaintext.startswith("gcj_")
    assert token.digest == tokens.digest(plaintext)
    assert plaintext not in {token.lookup, token.digest}
    assert token.expires_at > timezone.now()


def test_enroll_creates_commissioning_server_with_credential_and_event(operator: Any) -> None:
    _, plaintext = services.join_token_create(actor=operator)
    response = _post_enroll(plaintext)
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["server"] == "node-a" and body["credential"].startswith("gcn_")
    server = Server.objects.get(hostname="node-a")
    assert server.state == ServerState.COMMISSIONING
    credential = NodeCredential.objects.get(server=server)
    assert credential.digest == tokens.digest(body["credential"])
    assert ServerEvent.objects.filter(server=server, kind=EventKind.ENROLLED).count() == 1
    assert JoinToken.objects.get().server == server


def test_join_token_works_only_once(operator: Any) -> None:
    _, plaintext = services.join_token_create(actor=operator)
    assert _post_enroll(plaintext, "node-a").status_code == 201
    second = _post_enroll(plaintext, "node-b")
    assert second.status_code == 403
    assert second.json()["error"]["fields"]["join_token"] == ["The join token is used."]
    assert not Server.objects.filter(hostname="node-b").exists()


def test_expired_join_token_is_refused(operator: Any) -> None:
    token, plaintext = services.join_token_create(actor=operator)
    JoinToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    response = _post_enroll(plaintext)
    assert response.status_code == 403
    assert "expired" in response.json()["error"]["message"]
    assert Server.objects.count() == 0


def test_revoked_join_token_is_refused(operator: Any) -> None:
    token, plaintext = services.join_token_create(actor=operator)
    services.join_token_revoke(token=token, actor=operator)
    with pytest.raises(PermissionDenied, match="revoked"):
        services.agent_enroll(join_token=plaintext, hostname="node-a", simulated=True)
    with pytest.raises(Conflict):
        services.join_token_revoke(token=token, actor=operator)


def test_forged_join_token_is_refused(operator: Any) -> None:
    token, _ = services.join_token_create(actor=operator)
    forged = f"gcj_{token.lookup}_not-the-secret"
    assert _post_enroll(forged).status_code == 403
    assert _post_enroll("gcp_abcdefabcdef_user-token-shape").status_code == 403
    assert JoinToken.objects.get(pk=token.pk).used_at is None


def test_malformed_enroll_names_the_field() -> None:
    response = APIClient().post("/api/v1/agent/enroll", {"join_token": "x" * 20}, format="json")
    assert response.status_code == 400
    assert "hostname" in response.json()["error"]["fields"]


def test_join_token_ttl_is_bounded(operator: Any) -> None:
    with pytest.raises(ValidationFailed) as err:
        services.join_token_create(actor=operator, ttl_s=5)
    assert "ttl_s" in err.value.fields


def test_enrolled_hostname_with_active_credential_cannot_enroll_again_and_token_stays_unused(operator: Any) -> None:
    services.agent_enroll(join_token=services.join_token_create(actor=operator)[1], hostname="node-a", simulated=True)
    token, plaintext = services.join_token_create(actor=operator)
    with pytest.raises(Conflict):
        services.agent_enroll(join_token=plaintext, hostname="node-a", simulated=True)
    token.refresh_from_db()
    assert token.used_at is None


def test_revoked_server_re_enrolls_with_new_credential_back_in_commissioning(operator: Any) -> None:
    server, first = services.agent_enroll(
        join_token=services.join_token_create(actor=operator)[1], hostname="node-a", simulated=True
    )
    server_set_state(server=server, to=ServerState.READY, actor=operator, reason="burn-in passed")
    services.credential_revoke(server=server, actor=operator, reason="disk replaced, node reinstalled")
    again, second = services.agent_enroll(
        join_token=services.join_token_create(actor=operator)[1], hostname="node-a", simulated=True
    )
    assert again.pk == server.pk and second != first
    assert again.state == ServerState.COMMISSIONING
    assert NodeCredential.objects.filter(server=server, revoked_at__isnull=True).count() == 1
    assert ServerEvent.objects.filter(server=server, kind=EventKind.ENROLLED, data__reenrolled=True).exists()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_agents_racing_for_one_join_token_exactly_one_wins(operator: Any) -> None:
    _, plaintext = services.join_token_create(actor=operator)
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def contender(hostname: str) -> None:
        try:
            barrier.wait(timeout=10)
            services.agent_enroll(join_token=plaintext, hostname=hostname, simulated=True)
            outcomes.append("won")
        except PermissionDenied:
            outcomes.append("refused")
        finally:
            connection.close()

    threads = [threading.Thread(target=contender, args=(f"node-{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(outcomes) == ["refused", "won"]
    assert Server.objects.count() == 1
    assert NodeCredential.objects.count() == 1
