"""The accounting console's writes: grants, adjustments and refunds, each with a reason and the operator as
the entry's actor; tenants are refused, bad input is named in the API's error shape."""

from __future__ import annotations

from decimal import Decimal

import pytest

from controlplane.ledger.choices import EntryKind
from controlplane.ledger.models import LedgerEntry
from tests.accounting.helpers import at, book, finish, ran
from tests.factories import OperatorFactory, UserFactory
from tests.reservations.fleet import gpu_model, project, server

pytestmark = pytest.mark.django_db


@pytest.fixture
def charged_run():  # type: ignore[no-untyped-def]
    owner = UserFactory()
    proj = project(owner=owner, grant="100")
    model = gpu_model("H100-80GB", weight="2")
    server(model, gpus=2)
    r = book(proj, model, at("2025-03-10 10:00"), at("2025-03-10 12:00"), actor=owner)
    ran(r, at("2025-03-10 10:00"), at("2025-03-10 11:00"))
    finish(r, ended_at=at("2025-03-10 12:00"))
    return {"project": proj, "owner": owner, "reservation": r}


def test_grant_adjustment_and_refund_are_entries_with_the_operator_as_actor(api_client, charged_run):  # type: ignore[no-untyped-def]
    operator = OperatorFactory(username="olga")
    api_client.force_authenticate(operator)
    slug, rid = charged_run["project"].slug, str(charged_run["reservation"].public_id)
    moves = [
        ("grants", {"amount": "10", "reason": "welcome credits"}),
        ("adjustments", {"amount": "-1.5", "reason": "double grant"}),
        ("refunds", {"amount": "1", "reason": "GPU fault", "reservation": rid}),
    ]
    for path, body in moves:
        response = api_client.post(f"/api/v1/ledger/{path}/", {"project": slug, **body}, format="json")
        assert response.status_code == 201, response.content
        assert response.json()["actor_label"] == "user:olga" and response.json()["reason"] == body["reason"]
    entries = LedgerEntry.objects.filter(project=charged_run["project"], actor=operator).order_by("id")
    assert [(e.kind, e.amount) for e in entries] == [
        (EntryKind.GRANT, Decimal("10")),
        (EntryKind.ADJUST, Decimal("-1.5")),
        (EntryKind.REFUND, Decimal("1")),
    ]
    listed = api_client.get("/api/v1/ledger/entries/", {"project": slug, "kind": ["refund"]}).json()
    assert listed["count"] == 1 and listed["results"][0]["reservation"] == rid


@pytest.mark.parametrize("path", ["grants", "adjustments", "refunds"])
def test_tenants_are_refused_every_move(api_client, charged_run, path):  # type: ignore[no-untyped-def]
    api_client.force_authenticate(charged_run["owner"])
    body = {"project": charged_run["project"].slug, "amount": "1", "reason": "mine"}
    if path == "refunds":
        body["reservation"] = str(charged_run["reservation"].public_id)
    response = api_client.post(f"/api/v1/ledger/{path}/", body, format="json")
    assert response.status_code == 403 and response.json()["error"]["code"]
    moved = LedgerEntry.objects.filter(kind__in=[EntryKind.GRANT, EntryKind.ADJUST, EntryKind.REFUND])
    assert not moved.filter(actor=charged_run["owner"]).exists()


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("grants", {"amount": "5"}, "reason"),
        ("grants", {"amount": "5", "reason": "   "}, "reason"),
        ("adjustments", {"amount": "0", "reason": "nothing"}, "amount"),
        ("adjustments", {"amount": "lots", "reason": "x"}, "amount"),
        ("refunds", {"amount": "1", "reason": "x"}, "reservation"),
        ("refunds", {"amount": "1", "reason": "x", "reservation": "not-a-uuid"}, "reservation"),
        ("refunds", {"amount": "100000", "reason": "too much", "reservation": "RID"}, "amount"),
    ],
)
def test_bad_input_is_refused_naming_the_field(api_client, charged_run, path, body, field):  # type: ignore[no-untyped-def]
    api_client.force_authenticate(OperatorFactory())
    body = {k: (str(charged_run["reservation"].public_id) if v == "RID" else v) for k, v in body.items()}
    response = api_client.post(
        f"/api/v1/ledger/{path}/", {"project": charged_run["project"].slug, **body}, format="json"
    )
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["fields"]


def test_a_refund_for_another_projects_reservation_is_refused(api_client, charged_run):  # type: ignore[no-untyped-def]
    other = project(grant="5")
    api_client.force_authenticate(OperatorFactory())
    body = {
        "project": other.slug,
        "amount": "1",
        "reason": "x",
        "reservation": str(charged_run["reservation"].public_id),
    }
    response = api_client.post("/api/v1/ledger/refunds/", body, format="json")
    assert response.status_code == 400 and "reservation" in response.json()["error"]["fields"]
