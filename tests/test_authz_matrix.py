"""Who may call what: one row per endpoint and method, one expected status per role (invariant 6).

Each caller authenticates for real: users with a personal bearer token, the agent with a node credential.
Another tenant's object is a 404, never a 403 that would confirm it exists.

To cover a new endpoint, add one row to ROWS:

    row("POST", "/api/v1/reservations/", body={...}, **BOOKERS_CREATE)

Paths are format strings over the world's refs ("{project}", "{teammate}", ...). A test module that needs
objects of its own appends a builder to REF_BUILDERS: ``def refs(world) -> dict[str, object]``, run after the
base world exists. List the module's URLs in COVERED_URLCONFS and every endpoint it serves must have a row.

A refusal tells the caller nothing it may not know (issue 10):

- It is the same, status and bytes, when the target exists and when it does not. Each ref in a path has a
  missing twin in MISSING; a row whose body names a target gives ``missing_body`` and the kinds of target it
  names (``body_targets``). Only callers who cannot see any of the swapped targets are compared: a viewer
  of atlas knows atlas exists, and gets a 404 for a project that does not.
- It comes before the body is read: a write refused with the real body is refused identically with an empty
  body and with one whose every field has the wrong type (keeping only ``keep``, the keys that say what the
  target is, such as a booking's ``project``).
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


Body = dict[str, Any] | Callable[["World"], dict[str, Any]] | None


@dataclass(frozen=True)
class Row:
    method: str
    path: str
    expect: dict[str, int]
    body: Body = None
    missing_body: Body = None
    body_targets: frozenset[str] = frozenset()
    keep: tuple[str, ...] = ()

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
    missing_body: Any = None,
    body_targets: frozenset[str] = frozenset(),
    keep: tuple[str, ...] = (),
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
    return Row(method, path, expect, body, missing_body, body_targets, keep)


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
    row(
        "POST",
        "/api/v1/projects/",
        body={"name": "New", "owner": "sam"},
        missing_body={"name": "New", "owner": "no-such-user"},
        body_targets=frozenset({"user"}),
        **OPERATORS_CREATE,
    ),
    row("GET", PROJECT, **MEMBERS_READ),
    row("PATCH", PROJECT, body={"description": "changed"}, **OWNERS_WRITE),
    row("PUT", PROJECT, body={"name": "Atlas", "description": "", "requeue_on_interrupt": True}, **OWNERS_WRITE),
    row("GET", "/api/v1/projects/{project}/members/", **MEMBERS_READ),
    row(
        "POST",
        "/api/v1/projects/{project}/members/",
        body={"username": "sam", "role": "viewer"},
        missing_body={"username": "no-such-user", "role": "viewer"},
        body_targets=frozenset({"user"}),
        **OWNERS_CREATE,
    ),
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
    row("GET", "/api/v1/auth/session/", **PUBLIC),
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
    body = _built(case.body, world)
    url = case.path.format(**world.refs)
    response = world.client(role).generic(case.method, url, data=_json(body), content_type="application/json")
    expected = case.expect[role]
    assert response.status_code == expected, (
        f"{case.method} {url} as {role}: expected {expected}, got {response.status_code}: {response.content[:300]!r}"
    )
    if expected == 404 and role not in ("anonymous", "agent"):
        # The body must not hint that the object exists.
        assert response.json()["error"]["code"] == "not_found"
    if expected not in REFUSALS:
        return
    client = world.client(role)
    swapped = _refs_in(case.path) | case.body_targets
    if swapped and not any(role in VISIBLE_TO[kind] for kind in swapped):
        # The same refusal, to the byte, when the target does not exist.
        missing_refs = {**world.refs, **{ref: MISSING[ref] for ref in _refs_in(case.path)}}
        missing_body = _built(case.missing_body, world) if case.missing_body is not None else body
        missing_url = case.path.format(**missing_refs)
        twin = client.generic(case.method, missing_url, data=_json(missing_body), content_type="application/json")
        # A 404 names the path it was asked for; with that set aside, the bytes are the same.
        # (The path only: a query string is not part of it.)
        twin_content = twin.content.replace(missing_url.split("?")[0].encode(), url.split("?")[0].encode())
        assert (twin.status_code, twin_content) == (response.status_code, response.content), (
            f"{case} as {role}: a missing target is answered {twin.status_code} {twin.content[:300]!r}, "
            f"an existing one {response.status_code} {response.content[:300]!r}"
        )
    if case.method in ("POST", "PUT", "PATCH"):
        # Refused before the body is read: an empty body and a body of wrong types are refused alike.
        kept = {key: body[key] for key in case.keep} if isinstance(body, dict) else {}
        junk = {key: [] for key in (body or {})}
        for other in ({**kept}, {**junk, **kept}):
            again = client.generic(case.method, url, data=_json(other), content_type="application/json")
            assert (again.status_code, again.content) == (response.status_code, response.content), (
                f"{case} as {role} with the body {other}: {again.status_code} {again.content[:300]!r}, "
                f"but {response.status_code} {response.content[:300]!r} with the real one"
            )


REFUSALS = (401, 403, 404)
MEMBERS_OF_ATLAS = frozenset({"owner", "teammate", "viewer", "operator"})
# Who can see the object each kind of target names; a refusal may tell them whether it exists.
VISIBLE_TO: dict[str, frozenset[str]] = {
    "project": MEMBERS_OF_ATLAS,
    "project_slug": MEMBERS_OF_ATLAS,
    "teammate": MEMBERS_OF_ATLAS,
    "reservation": MEMBERS_OF_ATLAS,
    "done": MEMBERS_OF_ATLAS,
    "entry": MEMBERS_OF_ATLAS,
    "owner_token": frozenset({"owner"}),
    # Another user, not in the caller's projects: only operators see who exists.
    "user": frozenset({"operator"}),
}
# For each ref of a path, one that names nothing.
MISSING: dict[str, object] = {
    "project": 999_999,
    "project_slug": "no-such-project",
    "teammate": "no-such-user",
    "reservation": "00000000-0000-4000-8000-000000000000",
    "done": "00000000-0000-4000-8000-000000000001",
    "entry": 999_999,
    "owner_token": 999_999,
}


def _refs_in(path: str) -> set[str]:
    """The refs of a path that name a target (not the instants of a query)."""
    return set(re.findall(r"\{(\w+)\}", path)) - {"start", "end", "later"}


def _built(body: Body, world: World) -> dict[str, Any] | None:
    return body(world) if callable(body) else body


def test_every_path_ref_has_a_missing_twin_and_a_visibility() -> None:
    for case in ROWS:
        for ref in _refs_in(case.path):
            assert ref in MISSING and ref in VISIBLE_TO, (case, ref)
        assert case.body_targets <= set(VISIBLE_TO), case


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


def _booking(world: World, project: str) -> dict[str, Any]:
    return {
        "project": project,
        "name": "matrix",
        "spec": {"gpu_model": "H100-80GB", "gpu_count": 1},
        "window": {"start": world.refs["start"], "end": world.refs["end"]},
        "container": {"image": "img"},
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
            body=lambda w: _booking(w, "atlas"),
            missing_body=lambda w: _booking(w, "no-such-project"),
            body_targets=frozenset({"project_slug"}),
            keep=("project",),
        ),
        row("GET", RESERVATION, **MEMBERS_READ),
        row("POST", RESERVATION + "cancel/", body={"reason": "matrix"}, **BOOKERS_WRITE),
        row("POST", RESERVATION + "release/", body={}, **BOOKERS_WRITE),
        row("POST", RESERVATION + "extend/", body=lambda w: {"ends_at": w.refs["later"]}, **BOOKERS_WRITE),
        row("GET", RESERVATION + "extend-quote/?ends_at={end}", **MEMBERS_READ),
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
            missing_body={"project": "no-such-project", "amount": "5", "reason": "m"},
            body_targets=frozenset({"project_slug"}),
            **OPERATORS_CREATE,
        ),
        row(
            "POST",
            "/api/v1/ledger/adjustments/",
            body={"project": "atlas", "amount": "-1", "reason": "m"},
            missing_body={"project": "no-such-project", "amount": "-1", "reason": "m"},
            body_targets=frozenset({"project_slug"}),
            **OPERATORS_CREATE,
        ),
        row("GET", "/api/v1/ledger/budgets/{project_slug}/", **MEMBERS_READ),
        # The efficiency statement (accounting) and the operators' ranking.
        row("GET", "/api/v1/usage/efficiency?project={project_slug}&month=2025-03", **MEMBERS_READ),
        row("GET", "/api/v1/usage/efficiency.csv?project={project_slug}", **MEMBERS_READ),
        row("GET", "/api/v1/usage/efficiency-ranking?month=2025-03", **dict(OPERATORS_WRITE)),
        row("GET", "/api/v1/usage/efficiency-ranking.csv", **dict(OPERATORS_WRITE)),
        row("GET", "/api/v1/ledger/budget-alerts/", **ANY_USER),
        row("GET", "/api/v1/ledger/member-caps/", **ANY_USER),
        row(
            "POST",
            "/api/v1/ledger/member-caps/",
            body={"project": "atlas", "user": "tom", "gpu_hours_per_period": "10"},
            missing_body={"project": "no-such-project", "user": "tom", "gpu_hours_per_period": "10"},
            body_targets=frozenset({"project_slug"}),
            keep=("project",),
            **OWNERS_WRITE,
        ),
        row(
            "POST",
            "/api/v1/ledger/refunds/",
            body=lambda w: {"project": "atlas", "reservation": str(w.refs["done"]), "amount": "0.5", "reason": "m"},
            missing_body={"project": "no-such-project", "reservation": MISSING["done"], "amount": "0.5", "reason": "m"},
            body_targets=frozenset({"project_slug", "done"}),
            **OPERATORS_CREATE,
        ),
    ]
)


# --- the inventory and the fleet: operators write, every signed-in user reads the live fleet ---------------
def _fleet_refs(world: World) -> dict[str, object]:
    """A site and rack, a GPU model nothing uses, a GPU with a fault to acknowledge, and a join token."""
    from controlplane.fleet.services import join_token_create
    from controlplane.inventory.models import Gpu, GpuModel, Rack, Server, Site

    site = Site.objects.create(name="dc-matrix")
    rack = Rack.objects.create(site=site, name="r-matrix")
    unused = GpuModel.objects.create(name="L4-24GB", product_name="NVIDIA L4", memory_mib=23034)
    unused.mig_profiles.create(name="1g.10gb", memory_mib=9856, compute_slices=1, memory_slices=1)
    server = Server.objects.exclude(hostname="node-matrix").get()
    gpu = Gpu.objects.filter(server=server).order_by("index").first()
    assert gpu is not None
    Gpu.objects.filter(pk=gpu.pk).update(needs_acknowledgement=True, health_reasons=["xid 79"])
    token, _ = join_token_create(actor=None, note="matrix")
    return {
        "site": site.pk,
        "rack": rack.pk,
        "gpu_model": unused.pk,
        "mig_profile": "1g.10gb",
        "server": server.pk,
        "node": Server.objects.get(hostname="node-matrix").pk,
        "gpu": gpu.pk,
        "join_token": token.pk,
    }


def _heartbeat(world: World) -> dict[str, Any]:
    from tests.fleet.helpers import heartbeat

    return heartbeat("node-matrix", gpus=[])


REF_BUILDERS.append(_fleet_refs)
COVERED_URLCONFS.extend(["controlplane.inventory.api.urls", "controlplane.fleet.api.urls"])
EVERYONE = frozenset(ROLES)
VISIBLE_TO.update(
    {
        # The catalog and the live fleet are every signed-in user's to read (availability needs them).
        "site": EVERYONE,
        "rack": EVERYONE,
        "gpu_model": EVERYONE,
        "mig_profile": EVERYONE,
        "server": EVERYONE,
        "node": EVERYONE,
        "gpu": EVERYONE,
        # Join tokens are operators' only.
        "join_token": frozenset({"operator"}),
    }
)
MISSING.update({ref: 999_999 for ref in ("site", "rack", "gpu_model", "server", "node", "gpu", "join_token")})
MISSING["mig_profile"] = "9g.99gb"
OPERATORS_READ = dict(owner=403, teammate=403, viewer=403, outsider=403, operator=200)
OPERATORS_DELETE = dict(owner=403, teammate=403, viewer=403, outsider=403, operator=204)
NOBODY_BUT_THE_AGENT = dict(owner=401, teammate=401, viewer=401, outsider=401, operator=401, anonymous=401, agent=200)
SITE, RACK, MODEL = "/api/v1/sites/{site}/", "/api/v1/racks/{rack}/", "/api/v1/gpu-models/{gpu_model}/"
MODEL_BODY = {"name": "L4-24GB", "product_name": "NVIDIA L4", "memory_mib": 23034}
ROWS.extend(
    [
        row("GET", "/api/v1/sites/", **ANY_USER),
        row("POST", "/api/v1/sites/", body={"name": "dc-new"}, **OPERATORS_CREATE),
        row("GET", SITE, **ANY_USER),
        row("PUT", SITE, body={"name": "dc-renamed", "location": "here"}, **OPERATORS_WRITE),
        row("PATCH", SITE, body={"location": "there"}, **OPERATORS_WRITE),
        row("DELETE", SITE, **dict(OPERATORS_DELETE, operator=409)),  # its rack protects it
        row("GET", "/api/v1/racks/", **ANY_USER),
        row("POST", "/api/v1/racks/", body=lambda w: {"site": w.refs["site"], "name": "r-new"}, **OPERATORS_CREATE),
        row("GET", RACK, **ANY_USER),
        row("PUT", RACK, body=lambda w: {"site": w.refs["site"], "name": "r-renamed"}, **OPERATORS_WRITE),
        row("PATCH", RACK, body={"name": "r-patched"}, **OPERATORS_WRITE),
        row("DELETE", RACK, **OPERATORS_DELETE),
        row("GET", "/api/v1/gpu-models/", **ANY_USER),
        row(
            "POST",
            "/api/v1/gpu-models/",
            body={**MODEL_BODY, "name": "L40S", "product_name": "NVIDIA L40S"},
            **OPERATORS_CREATE,
        ),
        row("GET", MODEL, **ANY_USER),
        row("PUT", MODEL, body=MODEL_BODY, **OPERATORS_WRITE),
        row("PATCH", MODEL, body={"memory_mib": 24000}, **OPERATORS_WRITE),
        row("PATCH", f"{MODEL}mig-profiles/{{mig_profile}}/", body={"billing_weight": "0.3"}, **OPERATORS_WRITE),
        row("DELETE", MODEL, **OPERATORS_DELETE),
        row("GET", "/api/v1/servers/", **ANY_USER),
        row("GET", "/api/v1/servers/{server}/", **ANY_USER),
        row("GET", "/api/v1/servers/{server}/events/", **OPERATORS_READ),
        row("GET", "/api/v1/servers/{server}/drain-preview/", **OPERATORS_READ),
        row("POST", "/api/v1/servers/{server}/state/", body={"state": "maintenance", "reason": "m"}, **OPERATORS_WRITE),
        row("POST", "/api/v1/servers/{node}/revoke-credential/", body={"reason": "m"}, **OPERATORS_WRITE),
        row("GET", "/api/v1/gpus/", **ANY_USER),
        row("GET", "/api/v1/gpus/{gpu}/", **ANY_USER),
        row("POST", "/api/v1/gpus/{gpu}/acknowledge/", body={"reason": "m"}, **OPERATORS_WRITE),
        # Past authorization an operator is refused for the world's server: it is ready, not drained.
        row(
            "POST",
            "/api/v1/gpus/{gpu}/mig/",
            body={"enabled": True, "layout": ["7g.80gb"]},
            **{**OPERATORS_WRITE, "operator": 409},
        ),
        row("GET", "/api/v1/join-tokens/", **OPERATORS_READ),
        row("POST", "/api/v1/join-tokens/", body={"note": "matrix"}, **OPERATORS_CREATE),
        row("GET", "/api/v1/join-tokens/{join_token}/", **OPERATORS_READ),
        row("POST", "/api/v1/join-tokens/{join_token}/revoke/", **OPERATORS_WRITE),
        # The join token is the credential, and it is in the body: a forged one is refused alike for everyone.
        row(
            "POST",
            "/api/v1/agent/enroll/",
            body={"join_token": "gcj_000000000000_forged", "hostname": "node-new"},
            keep=("join_token", "hostname"),
            **{role: 403 for role in ROLES},
        ),
        row("POST", "/api/v1/agent/heartbeat/", body=_heartbeat, **NOBODY_BUT_THE_AGENT),
    ]
)


# --- SSH keys: personal, like tokens -----------------------------------------------------------------------
def _ssh_key_refs(world: World) -> dict[str, object]:
    from controlplane.access.services import ssh_key_create
    from tests.access.keygen import ed25519_key, public_line

    owner = world.users["owner"]
    key = ssh_key_create(user=owner, name="spare", public_key=public_line(ed25519_key()), actor=owner)
    return {"owner_key": key.pk}


def _new_ssh_key(world: World) -> dict[str, Any]:
    from tests.access.keygen import ed25519_key, public_line

    return {"name": "matrix", "public_key": public_line(ed25519_key())}


REF_BUILDERS.append(_ssh_key_refs)
COVERED_URLCONFS.append("controlplane.access.api.urls")
VISIBLE_TO["owner_key"] = frozenset({"owner"})
MISSING["owner_key"] = 999_999
SSH_KEY = "/api/v1/ssh-keys/{owner_key}/"
ROWS.extend(
    [
        row("GET", "/api/v1/ssh-keys/", **ANY_USER),
        row("POST", "/api/v1/ssh-keys/", body=_new_ssh_key, **ANY_USER_CREATE),
        row("GET", SSH_KEY, **ONLY_ITS_USER),
        row("DELETE", SSH_KEY, **dict(ONLY_ITS_USER, owner=204)),
        # The web proxy's links (docs/proxy.md): the project's owners and members only, as the SSH gateway; a
        # viewer and an operator who is no member read 404 like a stranger. The reservation has not started: the
        # owners' port is unknown (400 naming it), the terminal not ready (409).
        row(
            "POST",
            "/api/v1/reservations/{reservation}/open/",
            body={"port": "web"},
            **dict(owner=400, teammate=400, viewer=404, outsider=404, operator=404),
        ),
        row(
            "POST",
            "/api/v1/reservations/{reservation}/terminal/",
            body={},
            **dict(owner=409, teammate=409, viewer=404, outsider=404, operator=404),
        ),
    ]
)


# --- Volumes, datasets and egress networks (docs/volumes.md) ------------------------------------------------
def _volume_refs(world: World) -> dict[str, object]:
    from controlplane.access.datasets import dataset_create
    from controlplane.access.volumes import volume_create

    volume_create(project=world.project, name="data", size_limit_gib=10, actor=world.users["owner"])
    dataset_create(name="imagenet", allowed_projects=[world.project], actor=world.users["operator"])
    return {"project_slug": world.project.slug, "volume": "data", "dataset": "imagenet"}


REF_BUILDERS.append(_volume_refs)
VISIBLE_TO.update({"volume": MEMBERS_OF_ATLAS, "dataset": MEMBERS_OF_ATLAS})
MISSING.update({"volume": "no-such-volume", "dataset": "no-such-dataset"})
VOLUMES = "/api/v1/projects/{project_slug}/volumes/"
DATASET = "/api/v1/datasets/{dataset}/"
ROWS.extend(
    [
        row("GET", VOLUMES, **MEMBERS_READ),
        row("POST", VOLUMES, body={"name": "matrix", "size_limit_gib": 1}, **BOOKERS_CREATE),
        row("GET", VOLUMES + "{volume}/", **MEMBERS_READ),
        row("PATCH", VOLUMES + "{volume}/", body={"size_limit_gib": 2}, **BOOKERS_WRITE),
        row("DELETE", VOLUMES + "{volume}/", **dict(BOOKERS_WRITE, owner=204, teammate=204, operator=204)),
        row("GET", "/api/v1/datasets/", **ANY_USER),
        row("POST", "/api/v1/datasets/", body={"name": "matrix", "allowed_projects": ["atlas"]}, **OPERATORS_CREATE),
        row("GET", DATASET, **MEMBERS_READ),
        row("PATCH", DATASET, body={"description": "changed"}, **OPERATORS_WRITE),
        row("DELETE", DATASET, **OPERATORS_DELETE),
        row("GET", "/api/v1/projects/{project_slug}/egress/", **MEMBERS_READ),
        row("PUT", "/api/v1/projects/{project_slug}/egress/", body={"network_name": "atlas-egress"}, **OPERATORS_WRITE),
        row("DELETE", "/api/v1/projects/{project_slug}/egress/", **OPERATORS_DELETE),
    ]
)


# --- The queue (docs/scheduling.md) -------------------------------------------------------------------------
def _queue_refs(world: World) -> dict[str, object]:
    from datetime import timedelta

    from controlplane.scheduling.models import PriorityClass
    from controlplane.scheduling.services import request_submit
    from tests.reservations.fleet import CONTAINER, gpu_model, spec

    queued = request_submit(
        project=world.project,
        name="queued",
        spec=spec(gpu_model()),
        container=CONTAINER,
        duration=timedelta(hours=1),
        start_by=None,
        priority_class=PriorityClass.objects.get(name="normal"),
        actor=world.users["owner"],
    )
    return {"queued": queued.public_id}


def _queue_body(project: str) -> dict[str, Any]:
    return {
        "project": project,
        "name": "matrix",
        "spec": {"gpu_model": "H100-80GB", "gpu_count": 1},
        "container": {"image": "img"},
        "duration": "1h",
    }


REF_BUILDERS.append(_queue_refs)
COVERED_URLCONFS.append("controlplane.scheduling.api.urls")
VISIBLE_TO["queued"] = MEMBERS_OF_ATLAS
MISSING["queued"] = "00000000-0000-4000-8000-000000000000"
QUEUED = "/api/v1/requests/{queued}/"
ROWS.extend(
    [
        row("GET", "/api/v1/requests/", **ANY_USER),
        row(
            "POST",
            "/api/v1/requests/",
            **BOOKERS_CREATE,
            body=_queue_body("atlas"),
            missing_body=_queue_body("no-such-project"),
            body_targets=frozenset({"project_slug"}),
            keep=("project",),
        ),
        row("GET", QUEUED, **MEMBERS_READ),
        row("POST", QUEUED + "cancel/", body={"reason": "matrix"}, **BOOKERS_WRITE),
        row("GET", "/api/v1/requests/queue/", **OPERATORS_READ),
        row("POST", QUEUED + "hold/", body={"reason": "matrix"}, **OPERATORS_WRITE),
        row("POST", QUEUED + "release/", body={"reason": "matrix"}, **dict(OPERATORS_WRITE, operator=409)),
        row("POST", QUEUED + "priority-class/", body={"priority_class": "high"}, **OPERATORS_WRITE),
        row("GET", "/api/v1/projects/{project_slug}/fair-share/", **MEMBERS_READ),
        row("GET", "/api/v1/priority-classes/", **ANY_USER),
    ]
)


# notifications: your own list and preferences; a project's webhooks for its owners (and operators).
def _webhook_refs(world: World) -> dict[str, object]:
    from controlplane.notifications.services import endpoint_create

    endpoint = endpoint_create(
        project=world.project,
        url="http://93.184.215.14/hook",
        events=["reservation.failed"],
        description="",
        actor=world.users["owner"],
    )
    return {"webhook": endpoint.public_id}


REF_BUILDERS.append(_webhook_refs)
COVERED_URLCONFS.append("controlplane.notifications.api.urls")
VISIBLE_TO["webhook"] = frozenset({"owner", "operator"})
MISSING["webhook"] = "00000000-0000-4000-8000-000000000000"
OWNERS_READ = dict(owner=200, teammate=403, viewer=403, outsider=404, operator=200)
WEBHOOKS = "/api/v1/projects/{project}/webhooks/"
WEBHOOK = WEBHOOKS + "{webhook}/"
ROWS.extend(
    [
        row("GET", "/api/v1/notifications/", **ANY_USER),
        row("GET", "/api/v1/notifications/unread-count/", **ANY_USER),
        row("POST", "/api/v1/notifications/mark-read/", body={}, **ANY_USER),
        row("GET", "/api/v1/notifications/preferences/", **ANY_USER),
        row(
            "PUT",
            "/api/v1/notifications/preferences/",
            body={"preferences": [{"event_type": "reservation.booked", "channel": "email"}]},
            **ANY_USER,
        ),
        row("GET", "/api/v1/notifications/outbox/", **ANY_USER),
        row("GET", WEBHOOKS, **OWNERS_READ),
        row(
            "POST",
            WEBHOOKS,
            body={"url": "http://93.184.215.14/other", "events": ["reservation.running"]},
            **OWNERS_CREATE,
        ),
        row("GET", WEBHOOK, **OWNERS_READ),
        row("PATCH", WEBHOOK, body={"description": "matrix"}, **OWNERS_WRITE),
        row("DELETE", WEBHOOK, **OWNERS_DELETE),
        row("GET", WEBHOOK + "deliveries/", **OWNERS_READ),
        row("POST", WEBHOOK + "test/", **dict(OWNERS_WRITE, owner=202, operator=202)),
        row("POST", WEBHOOK + "rotate-secret/", body={"overlap_s": 60}, **OWNERS_WRITE),
    ]
)


# --- Idle reclamation (docs/efficiency.md, "Idle reclamation") ---------------------------------------------
def _idle_refs(world: World) -> dict[str, object]:
    """A running reservation of atlas that sat idle for its policy's 30 minutes and was just warned."""
    from controlplane.inventory.models import GpuModel
    from tests.accounting.helpers import idle_warned

    idle = idle_warned(world.project, GpuModel.objects.get(name="H100-80GB"), actor=world.users["owner"])
    return {"idle": idle.public_id}


REF_BUILDERS.append(_idle_refs)
VISIBLE_TO["idle"] = MEMBERS_OF_ATLAS
MISSING["idle"] = "00000000-0000-4000-8000-000000000002"
ROWS.append(row("POST", "/api/v1/reservations/{idle}/keep/", **BOOKERS_WRITE))
ROWS.append(row("GET", "/api/v1/reservations/{idle}/idle/", **MEMBERS_READ))


# --- Project secrets and registry credentials (docs/images.md) ----------------------------------------------
def _vault_refs(world: World) -> dict[str, object]:
    from controlplane.vault.services import registry_set, secret_set

    secret_set(project=world.project, name="HF_TOKEN", value="matrix-secret", actor=world.users["owner"])
    registry_set(
        project=world.project, registry="nvcr.io", username="u", password="matrix-pw", actor=world.users["owner"]
    )
    return {"secret": "HF_TOKEN", "registry": "nvcr.io"}


REF_BUILDERS.append(_vault_refs)
COVERED_URLCONFS.append("controlplane.vault.api.urls")
VISIBLE_TO.update({"secret": MEMBERS_OF_ATLAS, "registry": MEMBERS_OF_ATLAS})
MISSING.update({"secret": "NO_SUCH_SECRET", "registry": "no-such.example"})
SECRETS = "/api/v1/projects/{project_slug}/secrets/"
REGISTRIES = "/api/v1/projects/{project_slug}/registries/"
ROWS.extend(
    [
        row("GET", SECRETS, **MEMBERS_READ),
        row("POST", SECRETS, body={"name": "MATRIX", "value": "v"}, **BOOKERS_CREATE),
        row("GET", SECRETS + "{secret}/", **MEMBERS_READ),
        row("PUT", SECRETS + "{secret}/", body={"value": "v2"}, **BOOKERS_WRITE),
        row("DELETE", SECRETS + "{secret}/", **dict(BOOKERS_WRITE, owner=204, teammate=204, operator=204)),
        row("GET", REGISTRIES, **MEMBERS_READ),
        row("POST", REGISTRIES, body={"registry": "ghcr.io", "username": "u", "password": "p"}, **BOOKERS_CREATE),
        row("GET", REGISTRIES + "{registry}/", **MEMBERS_READ),
        row("PUT", REGISTRIES + "{registry}/", body={"username": "u", "password": "p2"}, **BOOKERS_WRITE),
        row("DELETE", REGISTRIES + "{registry}/", **dict(BOOKERS_WRITE, owner=204, teammate=204, operator=204)),
    ]
)
