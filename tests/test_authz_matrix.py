"""Who may call what: one row per endpoint and method, one expected status per role (invariant 6).

Each caller authenticates for real: users with a personal bearer token, the agent with a node credential.
Another tenant's object is a 404, never a 403 that would confirm it exists.

To cover a new endpoint, add one row to ROWS:

    row("POST", "/api/v1/reservations/", body={...}, **BOOKERS_CREATE)

Paths are format strings over the world's refs ("{project}", "{teammate}", ...). A test module that needs
objects of its own appends a builder to REF_BUILDERS: ``def refs(world) -> dict[str, object]``, run after the
base world exists. List the module's URLs in COVERED_URLCONFS and every endpoint it serves must have a row.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.urls import include, path
from drf_spectacular.drainage import GENERATOR_STATS
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient

from controlplane.accounts.choices import Role
from controlplane.core import tokens
from tests.factories import TEST_PASSWORD, ApiTokenFactory, OperatorFactory, ProjectFactory, UserFactory, member_of

ROLES = ("owner", "teammate", "viewer", "outsider", "operator", "anonymous", "agent")


@dataclass(frozen=True)
class Row:
    method: str
    path: str
    expect: dict[str, int]
    body: dict[str, Any] | Callable[[World], dict[str, Any]] | None = None

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


def row(
    method: str,
    path: str,
    *,
    owner: int,
    teammate: int,
    viewer: int,
    outsider: int,
    operator: int,
    anonymous: int = 401,
    agent: int = 401,
    body: Any = None,
) -> Row:
    """One endpoint. Anonymous callers and node agents are refused tenant endpoints unless stated."""
    expect = {
        "owner": owner,
        "teammate": teammate,
        "viewer": viewer,
        "outsider": outsider,
        "operator": operator,
        "anonymous": anonymous,
        "agent": agent,
    }
    return Row(method, path, expect, body)


# Presets for the usual shapes of a project-scoped endpoint.
MEMBERS_READ = dict(owner=200, teammate=200, viewer=200, outsider=404, operator=200)
OWNERS_WRITE = dict(owner=200, teammate=403, viewer=403, outsider=404, operator=200)
OWNERS_CREATE = dict(owner=201, teammate=403, viewer=403, outsider=404, operator=201)
OWNERS_DELETE = dict(owner=204, teammate=403, viewer=403, outsider=404, operator=204)
BOOKERS_CREATE = dict(owner=201, teammate=201, viewer=403, outsider=404, operator=201)
ANY_USER = dict(owner=200, teammate=200, viewer=200, outsider=200, operator=200)
ANY_USER_CREATE = dict(owner=201, teammate=201, viewer=201, outsider=201, operator=201)
OPERATORS_CREATE = dict(owner=403, teammate=403, viewer=403, outsider=403, operator=201)
# The owner's own objects (tokens): anyone else, operators included, gets a 404 through the API.
ONLY_ITS_USER = dict(owner=200, teammate=404, viewer=404, outsider=404, operator=404)
PUBLIC = dict(ANY_USER, anonymous=200, agent=200)

PROJECT = "/api/v1/projects/{project}/"
MEMBER = "/api/v1/projects/{project}/members/{teammate}/"
TOKEN = "/api/v1/tokens/{owner_token}/"

ROWS: list[Row] = [
    # accounts
    row("GET", "/api/v1/projects/", **ANY_USER),
    row("POST", "/api/v1/projects/", body={"name": "New", "owner": "sam"}, **OPERATORS_CREATE),
    row("GET", PROJECT, **MEMBERS_READ),
    row("PATCH", PROJECT, body={"description": "changed"}, **OWNERS_WRITE),
    row("PUT", PROJECT, body={"name": "Atlas", "description": "", "requeue_on_interrupt": True}, **OWNERS_WRITE),
    row("GET", "/api/v1/projects/{project}/members/", **MEMBERS_READ),
    row("POST", "/api/v1/projects/{project}/members/", body={"username": "sam", "role": "viewer"}, **OWNERS_CREATE),
    row("GET", MEMBER, **MEMBERS_READ),
    row("PATCH", MEMBER, body={"role": "viewer"}, **OWNERS_WRITE),
    row("PUT", MEMBER, body={"role": "owner"}, **OWNERS_WRITE),
    row("DELETE", MEMBER, **OWNERS_DELETE),
    row("GET", "/api/v1/tokens/", **ANY_USER),
    row("POST", "/api/v1/tokens/", body={"name": "matrix"}, **ANY_USER_CREATE),
    row("GET", TOKEN, **ONLY_ITS_USER),
    row("DELETE", TOKEN, **dict(ONLY_ITS_USER, owner=204)),
    row("POST", TOKEN + "revoke/", **ONLY_ITS_USER),
    row("GET", "/api/v1/me/", **ANY_USER),
    row("GET", "/api/v1/auth/csrf/", **PUBLIC),
    row("POST", "/api/v1/auth/login/", body={"username": "olive", "password": TEST_PASSWORD}, **PUBLIC),
    row("POST", "/api/v1/auth/logout/", **dict(PUBLIC, **{role: 204 for role in ROLES})),
]

# Every endpoint these URL modules serve must appear in ROWS.
COVERED_URLCONFS = ["controlplane.accounts.api.urls"]


class World:
    """A project with an owner, a teammate and a viewer; an outsider owning another project; an operator;
    a stranger with no project; and an enrolled node's agent."""

    def __init__(self) -> None:
        self.project = ProjectFactory(slug="atlas", name="Atlas")
        self.users = {
            "owner": member_of(self.project, Role.OWNER, username="olive"),
            "teammate": member_of(self.project, Role.MEMBER, username="tom"),
            "viewer": member_of(self.project, Role.VIEWER, username="vera"),
            "outsider": member_of(ProjectFactory(slug="zephyr"), Role.OWNER, username="oscar"),
            "operator": OperatorFactory(username="opal"),
        }
        UserFactory(username="sam")
        self.credentials = {role: f"Bearer {ApiTokenFactory(user=user).plaintext}" for role, user in self.users.items()}
        self.credentials["agent"] = f"Bearer {agent_credential()}"
        self.refs: dict[str, object] = {
            "project": self.project.pk,
            "teammate": "tom",
            "owner_token": ApiTokenFactory(user=self.users["owner"], name="spare").pk,
        }
        for build in REF_BUILDERS:
            self.refs.update(build(self))

    def client(self, role: str) -> APIClient:
        client = APIClient()
        if role in self.credentials:
            client.credentials(HTTP_AUTHORIZATION=self.credentials[role])
        return client


REF_BUILDERS: list[Callable[[World], dict[str, object]]] = []


def agent_credential() -> str:
    """A real node credential when the fleet app has them, else a well-formed one: both must be refused."""
    issued = tokens.issue(tokens.NODE_CREDENTIAL)
    try:
        from controlplane.fleet.models import NodeCredential
        from controlplane.inventory.models import Server
    except ImportError:
        return issued.plaintext
    server = Server.objects.create(hostname="node-matrix")
    NodeCredential.objects.create(server=server, lookup=issued.lookup, digest=issued.digest)
    return issued.plaintext


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("case", ROWS, ids=str)
def test_authorization_matrix(db: Any, case: Row, role: str) -> None:
    world = World()
    body = case.body(world) if callable(case.body) else case.body
    url = case.path.format(**world.refs)
    response = world.client(role).generic(case.method, url, data=_json(body), content_type="application/json")
    expected = case.expect[role]
    assert response.status_code == expected, (
        f"{case.method} {url} as {role}: expected {expected}, got {response.status_code}: {response.content[:300]!r}"
    )
    if expected == 404 and role not in ("anonymous", "agent"):
        # The body must not hint that the object exists.
        assert response.json()["error"]["code"] == "not_found"


def test_every_covered_endpoint_has_a_row() -> None:
    covered = {(r.method, _shape(r.path)) for r in ROWS}
    GENERATOR_STATS.reset()
    with GENERATOR_STATS.silence():
        schema = SchemaGenerator(patterns=[path("api/v1/", include(conf)) for conf in COVERED_URLCONFS]).get_schema(
            request=None, public=True
        )
    served = {(method.upper(), _shape(p)) for p, ops in schema["paths"].items() for method in ops}
    assert served - covered == set()


def test_every_row_lists_every_role() -> None:
    for case in ROWS:
        assert set(case.expect) == set(ROLES), case


def _shape(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "{}", path.split("?")[0])


def _json(body: dict[str, Any] | None) -> str:
    import json

    return json.dumps(body) if body is not None else ""


# --- reservations, availability and the ledger -----------------------------------------------------------
def _booking_refs(world: World) -> dict[str, object]:
    """A fleet, credits for atlas, a future reservation to act on and a finished one to refund."""
    from datetime import timedelta

    from django.utils import timezone

    from controlplane.ledger.models import LedgerEntry
    from controlplane.ledger.services import ledger_grant
    from controlplane.reservations import services
    from controlplane.reservations.choices import ReservationState
    from tests.reservations.fleet import CONTAINER, gpu_model, server, spec, window

    model = gpu_model()
    server(model, gpus=8)
    ledger_grant(project=world.project, amount=1000, actor=None, reason="matrix")
    owner = world.users["owner"]
    future = services.reservation_create(
        project=world.project, name="future", spec=spec(model), window=window(), container=CONTAINER, actor=owner
    )
    done = services.reservation_create(
        project=world.project,
        name="done",
        spec=spec(model),
        window=window(start_in=timedelta(hours=5)),
        container=CONTAINER,
        actor=owner,
    )
    services.reservation_finish(
        reservation=done,
        to=ReservationState.COMPLETED,
        ended_at=done.ends_at,
        actor_label="system:matrix",
        reason="matrix",
    )
    start = timezone.now() + timedelta(hours=10)
    return {
        "project_slug": world.project.slug,
        "reservation": future.public_id,
        "done": done.public_id,
        "entry": LedgerEntry.objects.filter(project=world.project).first().pk,
        "start": start.isoformat().replace("+00:00", "Z"),
        "end": (start + timedelta(hours=1)).isoformat().replace("+00:00", "Z"),
        "later": (future.ends_at + timedelta(hours=1)).isoformat(),
    }


REF_BUILDERS.append(_booking_refs)
COVERED_URLCONFS.extend(["controlplane.reservations.api.urls", "controlplane.ledger.api.urls"])
BOOKERS_WRITE = dict(owner=200, teammate=200, viewer=403, outsider=404, operator=200)
OPERATORS_WRITE = dict(owner=403, teammate=403, viewer=403, outsider=403, operator=200)
RESERVATION = "/api/v1/reservations/{reservation}/"
SPEC_QUERY = "gpu_model=H100-80GB&gpu_count=1"
ROWS.extend(
    [
        row("GET", "/api/v1/reservations/", **ANY_USER),
        row(
            "POST",
            "/api/v1/reservations/",
            **BOOKERS_CREATE,
            body=lambda w: {
                "project": "atlas",
                "name": "matrix",
                "spec": {"gpu_model": "H100-80GB", "gpu_count": 1},
                "window": {"start": w.refs["start"], "end": w.refs["end"]},
                "container": {"image": "img"},
            },
        ),
        row("GET", RESERVATION, **MEMBERS_READ),
        row("POST", RESERVATION + "cancel/", body={"reason": "matrix"}, **BOOKERS_WRITE),
        row("POST", RESERVATION + "release/", body={}, **BOOKERS_WRITE),
        row("POST", RESERVATION + "extend/", body=lambda w: {"ends_at": w.refs["later"]}, **BOOKERS_WRITE),
        row("GET", "/api/v1/availability/free/?" + SPEC_QUERY + "&start={start}&end={end}", **ANY_USER),
        row("GET", "/api/v1/availability/earliest/?" + SPEC_QUERY + "&duration_hours=2", **ANY_USER),
        row("GET", "/api/v1/availability/timeline/?start={start}&end={end}", **ANY_USER),
        row("GET", "/api/v1/ledger/entries/", **ANY_USER),
        row("GET", "/api/v1/ledger/entries/{entry}/", **MEMBERS_READ),
        row("GET", "/api/v1/ledger/balances/", **ANY_USER),
        row("GET", "/api/v1/ledger/balances/{project_slug}/", **MEMBERS_READ),
        row("GET", "/api/v1/ledger/quotas/", **ANY_USER),
        row("GET", "/api/v1/ledger/quotas/{project_slug}/", **MEMBERS_READ),
        row("PATCH", "/api/v1/ledger/quotas/{project_slug}/", body={"max_concurrent_gpus": 8}, **OPERATORS_WRITE),
        row("PUT", "/api/v1/ledger/quotas/{project_slug}/", body={"credits_per_period": "100"}, **OPERATORS_WRITE),
        row(
            "POST",
            "/api/v1/ledger/grants/",
            body={"project": "atlas", "amount": "5", "reason": "m"},
            **OPERATORS_CREATE,
        ),
        row(
            "POST",
            "/api/v1/ledger/adjustments/",
            body={"project": "atlas", "amount": "-1", "reason": "m"},
            **OPERATORS_CREATE,
        ),
        row(
            "POST",
            "/api/v1/ledger/refunds/",
            body=lambda w: {"project": "atlas", "reservation": str(w.refs["done"]), "amount": "0.5", "reason": "m"},
            **OPERATORS_CREATE,
        ),
    ]
)
