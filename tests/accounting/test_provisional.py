"""Figures still settling: a reservation not settled yet is in the report with its use so far, and every row
or point that counts it, or an hour the telemetry rollup has not finished, says ``provisional``."""

from __future__ import annotations

import pytest

from controlplane.accounting.rollup import rollup_pending
from controlplane.accounts.choices import Role
from tests.accounting.helpers import at, book, charged, finish, ran, telemetry
from tests.factories import member_of
from tests.reservations.fleet import project

pytestmark = pytest.mark.django_db

MARCH = {"start": "2025-03-01", "end": "2025-04-01"}
REPORT = "/api/v1/usage/report"


def get(client, user, url, **params):  # type: ignore[no-untyped-def]
    client.force_authenticate(user)
    res = client.get(url, params)
    assert res.status_code == 200, res.content
    return res.json()


@pytest.fixture
def running(proj, model, rack):  # type: ignore[no-untyped-def]
    """Two GPUs booked 10:00-12:00, their container started at 10:00 and still running (never settled)."""
    owner = member_of(proj, Role.OWNER)
    r = book(proj, model, at("2025-03-10 10:00"), at("2025-03-10 12:00"), count=2, actor=owner)
    ran(r, at("2025-03-10 10:00"), None, state="running")
    return r


def test_a_running_reservation_is_in_the_report_as_provisional(api_client, proj, running):  # type: ignore[no-untyped-def]
    body = get(api_client, running.created_by, REPORT, project=proj.slug, group_by="reservation", **MARCH)
    assert body["provisional"] is True
    (row,) = body["rows"]
    assert row["key"] == str(running.public_id) and row["provisional"] is True
    assert row["booked_gpu_hours"] == pytest.approx(4) and row["used_gpu_hours"] == pytest.approx(4)
    # Estimated at the model's billing weight (2) until the ledger charges it.
    assert row["credits"] == "8.0000"
    assert body["totals"]["provisional"] is True
    by_day = get(api_client, running.created_by, REPORT, project=proj.slug, group_by="day", **MARCH)
    assert [(r["key"], r["provisional"]) for r in by_day["rows"]] == [("2025-03-10", True)]


def test_settled_it_is_final_and_agrees_with_the_ledger(api_client, proj, running):  # type: ignore[no-untyped-def]
    finish(running, ended_at=at("2025-03-10 12:00"))
    body = get(api_client, running.created_by, REPORT, project=proj.slug, group_by="reservation", **MARCH)
    assert body["provisional"] is False
    (row,) = body["rows"]
    assert row["provisional"] is False and row["credits"] == str(charged(running))


def test_hours_the_rollup_has_not_finished_are_provisional_until_it_has(api_client, proj, model, rack):  # type: ignore[no-untyped-def]
    owner = member_of(proj, Role.OWNER)
    r = book(proj, model, at("2025-03-10 10:00"), at("2025-03-10 11:00"), actor=owner)
    ran(r, at("2025-03-10 10:00"), at("2025-03-10 11:00"))
    finish(r, ended_at=at("2025-03-10 11:00"))
    gpu_id = r.allocations.values_list("gpu_id", flat=True).get()
    telemetry(gpu_id, at("2025-03-10 10:00"), 60, util=80.0)
    rollup_pending(now=at("2025-03-10 10:40"))  # the 10:00 hour is rolled up so far, not for good
    body = get(api_client, owner, REPORT, project=proj.slug, group_by="reservation", **MARCH)
    assert body["rows"][0]["provisional"] is True
    assert body["final_until"] == "2025-03-10T10:00:00Z"
    points = get(api_client, owner, "/api/v1/usage/timeseries", project=proj.slug, bucket="hour", **MARCH)
    assert [(p["at"], p["provisional"]) for p in points] == [("2025-03-10T10:00:00+00:00", True)]
    rollup_pending(now=at("2025-03-10 13:00"))
    body = get(api_client, owner, REPORT, project=proj.slug, group_by="reservation", **MARCH)
    assert body["provisional"] is False and body["rows"][0]["util_mean_percent"] == pytest.approx(80)
    points = get(api_client, owner, "/api/v1/usage/timeseries", project=proj.slug, bucket="hour", **MARCH)
    assert [p["provisional"] for p in points] == [False]


def test_another_projects_running_reservation_is_not_in_the_report(api_client, running):  # type: ignore[no-untyped-def]
    other = project()
    owner = member_of(other, Role.OWNER)
    body = get(api_client, owner, REPORT, project=other.slug, group_by="reservation", **MARCH)
    assert body["rows"] == [] and body["provisional"] is False


def test_a_monthly_statement_leaves_unsettled_reservations_out(proj, running):  # type: ignore[no-untyped-def]
    from controlplane.accounting.statements import statement_generate

    statement = statement_generate(project=proj, month=at("2025-03-01 00:00"))
    assert statement.rows == []
