from __future__ import annotations

from decimal import Decimal

import pytest

from controlplane.ledger.models import QuotaPolicy
from tests.factories import OperatorFactory, UserFactory
from tests.reservations.fleet import project

pytestmark = pytest.mark.django_db


@pytest.fixture
def team():  # type: ignore[no-untyped-def]
    owner, viewer, outsider = UserFactory(), UserFactory(), UserFactory()
    return {
        "project": project(owner=owner, viewer=viewer, grant="25"),
        "owner": owner,
        "viewer": viewer,
        "outsider": outsider,
        "operator": OperatorFactory(),
    }


@pytest.mark.parametrize(("who", "code"), [("owner", 200), ("viewer", 200), ("outsider", 404), ("operator", 200)])
def test_balance_is_visible_to_members_only(api_client, team, who, code):
    api_client.force_authenticate(team[who])
    response = api_client.get(f"/api/v1/ledger/balances/{team['project'].slug}/")
    assert response.status_code == code
    if code == 200:
        assert Decimal(response.data["balance"]) == Decimal("25")


def test_entries_list_is_narrowed_and_filtered(api_client, team):
    other = project(grant="7")
    api_client.force_authenticate(team["viewer"])
    data = api_client.get("/api/v1/ledger/entries/").data
    assert data["count"] == 1 and data["results"][0]["project"] == team["project"].slug
    assert api_client.get("/api/v1/ledger/entries/", {"kind": "hold"}).data["count"] == 0
    assert api_client.get("/api/v1/ledger/entries/", {"project": other.slug}).data["count"] == 0


@pytest.mark.parametrize(("who", "code"), [("owner", 403), ("viewer", 403), ("outsider", 403), ("operator", 201)])
def test_only_operators_grant_adjust_and_refund(api_client, team, who, code):
    api_client.force_authenticate(team[who])
    slug = team["project"].slug
    grant = api_client.post("/api/v1/ledger/grants/", {"project": slug, "amount": "10", "reason": "Q4"}, format="json")
    adjust = api_client.post(
        "/api/v1/ledger/adjustments/", {"project": slug, "amount": "-5", "reason": "typo"}, format="json"
    )
    assert (grant.status_code, adjust.status_code) == (code, code)


def test_grant_input_is_validated_naming_the_field(api_client, team):
    api_client.force_authenticate(team["operator"])
    response = api_client.post(
        "/api/v1/ledger/grants/", {"project": team["project"].slug, "amount": "-1"}, format="json"
    )
    assert response.status_code == 400
    assert {"amount", "reason"} <= set(response.data["error"]["fields"])
    too_much = api_client.post(
        "/api/v1/ledger/adjustments/", {"project": team["project"].slug, "amount": "-100", "reason": "x"}, format="json"
    )
    assert too_much.status_code == 409 and too_much.data["error"]["quota"] == "credits"


def test_quota_policy_read_by_members_and_set_by_operators(api_client, team):
    url = f"/api/v1/ledger/quotas/{team['project'].slug}/"
    api_client.force_authenticate(team["owner"])
    assert api_client.get(url).status_code == 200
    assert api_client.patch(url, {"max_concurrent_gpus": 4}, format="json").status_code == 403
    api_client.force_authenticate(team["outsider"])
    assert api_client.get(url).status_code == 404
    api_client.force_authenticate(team["operator"])
    response = api_client.patch(url, {"max_concurrent_gpus": 4, "max_reservation_hours": "12"}, format="json")
    assert response.status_code == 200, response.data
    policy = QuotaPolicy.objects.get(project=team["project"])
    assert policy.max_concurrent_gpus == 4 and policy.updated_by == team["operator"]
    bad = api_client.patch(url, {"credits_per_period": "-3"}, format="json")
    assert bad.status_code == 400 and "credits_per_period" in bad.data["error"]["fields"]


def test_balance_list_reads_all_totals_in_one_query(api_client):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    owner = UserFactory()
    api_client.force_authenticate(owner)

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert api_client.get("/api/v1/ledger/balances/").status_code == 200
        return len(captured)

    project(owner=owner, grant="5")
    one = queries()
    for _ in range(4):
        project(owner=owner, grant="5")
    assert queries() == one
    assert [row["balance"] for row in api_client.get("/api/v1/ledger/balances/").json()] == ["5.0000"] * 5
