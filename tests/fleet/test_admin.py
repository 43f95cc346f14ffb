from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from controlplane.fleet.models import JoinToken
from controlplane.inventory.choices import EventKind, ServerState
from controlplane.inventory.models import ServerEvent

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(operator: Any) -> Client:
    operator.is_superuser = True
    operator.save()
    client = Client()
    client.force_login(operator)
    return client


def test_admin_join_token_shows_plaintext_once(admin_client: Client) -> None:
    response = admin_client.post("/admin/fleet/jointoken/add/", {"note": "rack 9", "ttl_s": "3600"}, follow=True)
    assert response.status_code == 200
    token = JoinToken.objects.get()
    shown = [str(m) for m in response.context["messages"]]
    assert any("gcj_" + token.lookup in m for m in shown)
    assert token.note == "rack 9"


def test_admin_state_change_goes_through_the_lifecycle(admin_client: Client, node: Any) -> None:
    server = node[0]
    url = f"/admin/inventory/server/{server.pk}/change/"
    response = admin_client.post(
        url,
        {
            "rack": "",
            "heartbeat_interval_s": "5.0",
            "new_state": "ready",
            "reason": "burn-in passed",
            "gpus-TOTAL_FORMS": "0",
            "gpus-INITIAL_FORMS": "0",
        },
    )
    assert response.status_code == 302, response.content[:2000]
    server.refresh_from_db()
    assert server.state == ServerState.READY
    assert ServerEvent.objects.filter(kind=EventKind.STATE, reason="burn-in passed").exists()


@pytest.mark.parametrize(
    "path",
    [
        "/admin/inventory/server/",
        "/admin/inventory/gpu/",
        "/admin/inventory/serverevent/",
        "/admin/inventory/gpumodel/",
        "/admin/fleet/jointoken/",
        "/admin/fleet/nodecredential/",
        "/admin/fleet/gputelemetryminute/",
    ],
)
def test_admin_lists_render(admin_client: Client, node: Any, path: str) -> None:
    assert admin_client.get(path).status_code == 200
