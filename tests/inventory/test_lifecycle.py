from __future__ import annotations

from typing import Any

import pytest

from controlplane.core.errors import Conflict, ValidationFailed
from controlplane.fleet.models import NodeCredential
from controlplane.inventory.choices import EventKind, ServerState
from controlplane.inventory.models import Server, ServerEvent
from controlplane.inventory.services import ALLOWED_TRANSITIONS, server_set_state
from tests.factories import OperatorFactory

pytestmark = pytest.mark.django_db

S = ServerState


@pytest.fixture
def operator(db: Any) -> Any:
    return OperatorFactory(username="opal")


def make_server(state: str = S.COMMISSIONING) -> Server:
    return Server.objects.create(hostname=f"node-{state}", state=state)


@pytest.mark.parametrize(
    ("start", "to"),
    [
        (S.COMMISSIONING, S.READY),
        (S.READY, S.DRAINING),
        (S.DRAINING, S.READY),
        (S.READY, S.MAINTENANCE),
        (S.DRAINING, S.MAINTENANCE),
        (S.MAINTENANCE, S.READY),
        (S.COMMISSIONING, S.RETIRED),
        (S.READY, S.RETIRED),
        (S.OFFLINE, S.RETIRED),
        (S.MAINTENANCE, S.RETIRED),
    ],
)
def test_allowed_transition_is_made_and_recorded(operator: Any, start: str, to: str) -> None:
    server = make_server(start)
    server = server_set_state(server=server, to=to, actor=operator, reason="planned work")
    assert server.state == to
    event = ServerEvent.objects.get(server=server, kind=EventKind.STATE)
    assert (event.from_state, event.to_state, event.actor, event.actor_label, event.reason) == (
        start,
        to,
        operator,
        "opal",
        "planned work",
    )


@pytest.mark.parametrize(
    ("start", "to"),
    [
        (S.COMMISSIONING, S.DRAINING),
        (S.READY, S.OFFLINE),
        (S.MAINTENANCE, S.DRAINING),
        (S.OFFLINE, S.READY),
        (S.RETIRED, S.READY),
        (S.RETIRED, S.RETIRED),
        (S.READY, S.READY),
        (S.MAINTENANCE, S.COMMISSIONING),
    ],
)
def test_disallowed_transition_is_a_409_naming_from_and_to(operator: Any, start: str, to: str) -> None:
    server = make_server(start)
    with pytest.raises(Conflict) as err:
        server_set_state(server=server, to=to, actor=operator, reason="try")
    assert err.value.extra == {"from": start, "to": to}
    server.refresh_from_db()
    assert server.state == start
    assert not ServerEvent.objects.exists()


def test_offline_is_entered_only_by_node_loss() -> None:
    assert all(S.OFFLINE not in targets for targets in ALLOWED_TRANSITIONS.values())


def test_state_change_needs_a_reason(operator: Any) -> None:
    with pytest.raises(ValidationFailed) as err:
        server_set_state(server=make_server(), to=S.READY, actor=operator, reason="  ")
    assert "reason" in err.value.fields


def test_stale_state_loses_to_the_concurrent_writer(operator: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Node loss marks the server offline between our read and our write: the update matches nothing."""
    server = make_server(S.READY)
    real_filter = Server.objects.filter
    calls = {"n": 0}

    def racing_filter(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:  # just before the conditional update
            real_filter(pk=server.pk).update(state=S.OFFLINE)
        return real_filter(*args, **kwargs)

    monkeypatch.setattr(Server.objects, "filter", racing_filter)
    with pytest.raises(Conflict, match="changed state meanwhile"):
        server_set_state(server=server, to=S.DRAINING, actor=operator, reason="drain")


def test_retiring_revokes_the_node_credential(operator: Any) -> None:
    from tests.fleet.helpers import enroll

    server, _ = enroll("node-old")
    server_set_state(server=server, to=S.RETIRED, actor=operator, reason="decommissioned")
    assert not NodeCredential.objects.filter(server=server, revoked_at__isnull=True).exists()
    assert ServerEvent.objects.filter(server=server, kind=EventKind.CREDENTIAL_REVOKED).exists()
