"""The usage API: who sees what, the error shape, CSV, statements."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from controlplane.accounting.models import MonthlyStatement
from controlplane.accounting.rollup import rollup_pending
from controlplane.accounting.statements import statement_generate, statements_generate_due
from controlplane.accounts.choices import Role
from tests.accounting.helpers import at, book, charged, finish, ran, telemetry
from tests.factories import OperatorFactory, UserFactory, member_of
from tests.reservations.fleet import project

pytestmark = pytest.mark.django_db

MARCH = {"start": "2025-03-01", "end": "2025-04-01"}


@pytest.fixture
def used(proj, model, rack):  # type: ignore[no-untyped-def]
    owner = member_of(proj, Role.OWNER)
    r = book(proj, model, at("2025-03-10 10:00"), at("2025-03-10 12:00"), count=2, actor=owner)
    ran(r, at("2025-03-10 10:00"), at("2025-03-10 11:00"))
    finish(r, ended_at=at("2025-03-10 12:00"))
    for gpu_id in r.allocations.values_list("gpu_id", flat=True):
        telemetry(gpu_id, at("2025-03-10 10:00"), 60, util=80.0)
    rollup_pending(now=at("2025-03-10 13:00"))
    return r


def get(client, user, url, **params):  # type: ignore[no-untyped-def]
    client.force_authenticate(user)
    return client.get(url, params)


def test_owner_and_viewer_read_the_report_and_an_outsider_gets_404(api_client, proj, used):  # type: ignore[no-untyped-def]
    viewer = member_of(proj, Role.VIEWER)
    outsider = member_of(project(), Role.OWNER)
    for user in (used.created_by, viewer):
        res = get(api_client, user, "/api/v1/usage/report", project=proj.slug, group_by="user", **MARCH)
        assert res.status_code == 200, res.content
        body = res.json()
        assert body["totals"]["used_gpu_hours"] == pytest.approx(2)
        assert body["totals"]["booked_gpu_hours"] == pytest.approx(4)
        assert body["totals"]["credits"] == str(charged(used))
        assert [r["key"] for r in body["rows"]] == [used.created_by.username]
    res = get(api_client, outsider, "/api/v1/usage/report", project=proj.slug, **MARCH)
    assert res.status_code == 404
    assert res.json()["error"]["code"] == "not_found"


def test_report_as_csv_by_query_and_by_suffix(api_client, proj, used):  # type: ignore[no-untyped-def]
    for url, extra in (("/api/v1/usage/report", {"format": "csv"}), ("/api/v1/usage/report.csv", {})):
        res = get(api_client, used.created_by, url, project=proj.slug, group_by="day", **MARCH, **extra)
        assert res.status_code == 200
        assert res["Content-Type"].startswith("text/csv")
        lines = res.content.decode().strip().splitlines()
        assert lines[0].startswith("key,label,booked_gpu_hours,used_gpu_hours")
        assert lines[1].startswith("2025-03-10,2025-03-10,4.0,2.0")
        assert lines[-1].startswith("total,Total")


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"group_by": "planet"}, "group_by"),
        ({"start": "2025-03-01T10:30:00Z", "end": "2025-03-02"}, "start"),
        ({"start": "2025-03-02", "end": "2025-03-01"}, "end"),
        ({"start": "2025-03-02"}, "end"),
        ({"start": "yesterday", "end": "2025-03-01"}, "start"),
        ({"period": "fortnight"}, "period"),
    ],
)
def test_bad_report_parameters_are_refused_naming_the_field(api_client, proj, used, params, field):  # type: ignore[no-untyped-def]
    res = get(api_client, used.created_by, "/api/v1/usage/report", project=proj.slug, **params)
    assert res.status_code == 400
    assert field in res.json()["error"]["fields"]


def test_period_and_date_select_a_week(api_client, proj, used):  # type: ignore[no-untyped-def]
    res = get(api_client, used.created_by, "/api/v1/usage/report", project=proj.slug, period="week", date="2025-03-12")
    assert res.status_code == 200
    assert res.json()["start"].startswith("2025-03-10T00:00:00") and res.json()["end"].startswith("2025-03-17")
    assert res.json()["totals"]["used_gpu_hours"] == pytest.approx(2)


def test_fleet_report_is_for_operators_only(api_client, proj, used):  # type: ignore[no-untyped-def]
    res = get(api_client, used.created_by, "/api/v1/usage/fleet", **MARCH)
    assert res.status_code == 403
    res = get(api_client, OperatorFactory(), "/api/v1/usage/fleet", group_by="gpu_model", **MARCH)
    assert res.status_code == 200
    assert res.json()["rows"][0]["key"] == "H100-80GB"
    assert res.json()["totals"]["util_mean_percent"] == pytest.approx(80.0)


def test_timeseries_for_a_member_and_for_the_fleet(api_client, proj, used):  # type: ignore[no-untyped-def]
    res = get(api_client, used.created_by, "/api/v1/usage/timeseries", project=proj.slug, bucket="hour", **MARCH)
    assert res.status_code == 200
    assert [p["at"] for p in res.json()] == ["2025-03-10T10:00:00+00:00", "2025-03-10T11:00:00+00:00"]
    assert get(api_client, used.created_by, "/api/v1/usage/timeseries", **MARCH).status_code == 403
    assert get(api_client, OperatorFactory(), "/api/v1/usage/timeseries", **MARCH).status_code == 200
    outsider = UserFactory()
    assert get(api_client, outsider, "/api/v1/usage/timeseries", project=proj.slug, **MARCH).status_code == 404


def test_usage_records_are_listed_only_for_members(api_client, proj, used):  # type: ignore[no-untyped-def]
    res = get(api_client, used.created_by, "/api/v1/usage/records/")
    assert res.status_code == 200 and res.json()["count"] == 2
    assert get(api_client, UserFactory(), "/api/v1/usage/records/").json()["count"] == 0


def test_report_is_a_fixed_number_of_queries(api_client, proj, model, rack, used):  # type: ignore[no-untyped-def]
    user = used.created_by
    api_client.force_authenticate(user)
    with CaptureQueriesContext(connection) as few:
        api_client.get("/api/v1/usage/report", {"project": proj.slug, "group_by": "reservation", **MARCH})
    for hour in (13, 15, 17):
        r = book(proj, model, at(f"2025-03-11 {hour}:00"), at(f"2025-03-11 {hour + 1}:00"), count=2, actor=user)
        ran(r, at(f"2025-03-11 {hour}:00"), at(f"2025-03-11 {hour + 1}:00"))
        finish(r, ended_at=at(f"2025-03-11 {hour + 1}:00"))
    with CaptureQueriesContext(connection) as many:
        res = api_client.get("/api/v1/usage/report", {"project": proj.slug, "group_by": "reservation", **MARCH})
    assert len(res.json()["rows"]) == 4
    assert len(many) == len(few)


def test_monthly_statement_is_generated_once_and_downloadable_by_members(api_client, proj, used):  # type: ignore[no-untyped-def]
    assert statements_generate_due(now=at("2025-04-01 00:30")) == 1
    assert statements_generate_due(now=at("2025-04-01 01:30")) == 0
    statement = MonthlyStatement.objects.get(project=proj, period_key="2025-03")
    assert statement_generate(project=proj, month=at("2025-03-15")).pk == statement.pk
    assert statement.totals["credits"] == str(charged(used))

    viewer = member_of(proj, Role.VIEWER)
    res = get(api_client, viewer, f"/api/v1/usage/statements/{statement.pk}/csv/")
    assert res.status_code == 200 and res["Content-Type"].startswith("text/csv")
    assert res.content.decode().splitlines()[-1].startswith("total,Total")
    listed = get(api_client, viewer, "/api/v1/usage/statements/", project=proj.slug).json()
    assert [s["period_key"] for s in listed["results"]] == ["2025-03"]
    outsider = member_of(project(), Role.OWNER)
    assert get(api_client, outsider, f"/api/v1/usage/statements/{statement.pk}/csv/").status_code == 404
    assert get(api_client, outsider, f"/api/v1/usage/statements/{statement.pk}/").status_code == 404
