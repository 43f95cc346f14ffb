"""The efficiency statement and the operator's ranking (controlplane/accounting/efficiency.py), from reservations
that really ran (launches, settlement) and minute telemetry rolled up by the real rollup."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from controlplane.accounting import efficiency
from controlplane.accounting.rollup import rollup_hour
from controlplane.accounts.choices import Role
from controlplane.inventory.models import Rack, Site
from tests.accounting.helpers import at, book, finish, ran, telemetry
from tests.factories import OperatorFactory, member_of
from tests.reservations.fleet import project

pytestmark = pytest.mark.django_db


def roll(start, hours: int) -> None:  # type: ignore[no-untyped-def]
    for i in range(hours):
        hour = start + timedelta(hours=i)
        rollup_hour(hour=hour, upto=hour + timedelta(hours=1))


def run(proj, model, start, hours, *, count=1, utils=(80.0,), actor=None, name="job"):  # type: ignore[no-untyped-def]
    """A reservation of ``count`` GPUs that ran its whole window; ``utils``: each hour's utilization."""
    end = start + timedelta(hours=hours)
    r = book(proj, model, start, end, count=count, actor=actor, name=name)
    ran(r, start, end)
    finish(r, ended_at=end)
    for gpu_id in r.allocations.values_list("gpu_id", flat=True):
        for i, util in enumerate(utils):
            telemetry(gpu_id, start + timedelta(hours=i), 60, util=util, power_w=300.0)
    roll(start, hours)
    return r


@pytest.fixture
def march(proj, model, rack):  # type: ignore[no-untyped-def]
    """proj in March 2025: a busy 2-GPU job and a half-idle 1-GPU job; in February one job; another project's
    job in March. The server sits in a liquid-cooled site (PUE 1.2, 0.30 per kWh)."""
    site = Site.objects.create(name="dc-liquid", pue=Decimal("1.20"), electricity_price_per_kwh=Decimal("0.30"))
    rack.rack = Rack.objects.create(site=site, name="r1")
    rack.save(update_fields=["rack"])
    owner = member_of(proj, Role.OWNER)
    busy = run(proj, model, at("2025-03-10 10:00"), 2, count=2, utils=(80.0, 80.0), actor=owner, name="busy")
    idle = run(proj, model, at("2025-03-11 14:00"), 2, utils=(0.0, 90.0), actor=owner, name="half-idle")
    run(proj, model, at("2025-02-20 10:00"), 1, utils=(50.0,), actor=owner, name="february")
    other = project()
    run(other, model, at("2025-03-12 10:00"), 1, utils=(20.0,), name="other")
    return {"owner": owner, "busy": busy, "idle": idle, "other": other}


def test_the_statement_gives_utilization_idle_energy_and_waste(proj, march):  # type: ignore[no-untyped-def]
    data = efficiency.statement(project=proj, month=at("2025-03-15 00:00"))
    t = data["totals"]
    assert data["period"] == "2025-03" and t["held_gpu_hours"] == pytest.approx(6)
    assert t["idle_gpu_hours"] == pytest.approx(1) and t["idle_share"] == pytest.approx(1 / 6, abs=1e-4)
    # Time-weighted: 240 GPU-minutes at 80, 60 at 0, 60 at 90.
    assert t["util_mean_percent"] == pytest.approx((80 * 240 + 90 * 60) / 360, abs=0.01)
    assert t["low_util_share"] == pytest.approx(1 / 6, abs=1e-4)  # the idle hour only: 80 % is above the line
    # 300 W for 6 GPU-hours; the facility's is x1.2 and costs 0.30 a kWh.
    assert t["energy_kwh"] == pytest.approx(1.8) and t["energy_wh_per_gpu_hour"] == pytest.approx(300)
    assert t["facility_energy_kwh"] == pytest.approx(2.16)
    assert Decimal(t["energy_cost"]) == Decimal("0.6480") and t["energy_currency"] == "USD"
    # Weight 2: 2 GPUs x 2 h + 1 GPU x 2 h = 12 credits; half of the second job's 4 was idle.
    assert Decimal(t["credits"]) == Decimal("12") and Decimal(t["idle_credits"]) == Decimal("2")
    ranked = data["reservations"]
    assert [r["name"] for r in ranked] == ["half-idle", "busy"]
    assert ranked[0]["reservation"] == str(march["idle"].public_id) and ranked[0]["idle_share"] == 0.5
    assert data["previous"]["period"] == "2025-02" and data["previous"]["held_gpu_hours"] == pytest.approx(1)
    assert data["previous"]["util_mean_percent"] == pytest.approx(50)
    # The fleet adds the other project's hour at 20 %.
    assert data["fleet"]["held_gpu_hours"] == pytest.approx(7)
    assert data["fleet"]["low_util_share"] == pytest.approx(2 / 7, abs=1e-4)


def test_a_server_in_no_site_uses_the_default_pue_and_no_price(proj, model, rack):  # type: ignore[no-untyped-def]
    run(proj, model, at("2025-03-10 10:00"), 1)
    t = efficiency.statement(project=proj, month=at("2025-03-01 00:00"))["totals"]
    assert t["facility_energy_kwh"] == pytest.approx(0.3 * 1.5) and Decimal(t["energy_cost"]) == 0


def test_an_empty_month_is_all_zeros_and_nulls(proj):  # type: ignore[no-untyped-def]
    data = efficiency.statement(project=proj, month=at("2025-03-01 00:00"))
    assert data["reservations"] == [] and data["totals"]["held_gpu_hours"] == 0
    assert data["totals"]["util_mean_percent"] is None and data["totals"]["idle_share"] is None


def test_the_statement_reads_a_constant_number_of_queries(proj, model, rack):  # type: ignore[no-untyped-def]
    counts = []
    for n, day in enumerate((10, 11, 12)):
        for k in range(1 + 3 * n):
            run(proj, model, at(f"2025-03-{day} 00:00") + timedelta(hours=2 * k), 1, name=f"j{day}-{k}")
        with CaptureQueriesContext(connection) as queries:
            efficiency.statement(project=proj, month=at("2025-03-01 00:00"))
        counts.append(len(queries.captured_queries))
    assert counts[0] == counts[1] == counts[2] <= 8, counts


def test_the_ranking_puts_the_most_wasteful_project_first_in_constant_queries(proj, march):  # type: ignore[no-untyped-def]
    with CaptureQueriesContext(connection) as queries:
        data = efficiency.ranking(month=at("2025-03-01 00:00"))
    assert len(queries.captured_queries) <= 5
    assert [r["project"] for r in data["projects"]] == [proj.slug, march["other"].slug]
    assert [r["rank"] for r in data["projects"]] == [1, 2]
    assert data["fleet"]["held_gpu_hours"] == pytest.approx(7)


# -- API ----------------------------------------------------------------------------------------------------------

URL = "/api/v1/usage/efficiency"


@pytest.mark.parametrize(("who", "code"), [("owner", 200), ("viewer", 200), ("outsider", 404), ("operator", 200)])
def test_members_read_the_statement_and_an_outsider_gets_404(api_client, proj, march, who, code):  # type: ignore[no-untyped-def]
    users = {
        "owner": march["owner"],
        "viewer": member_of(proj, Role.VIEWER),
        "outsider": member_of(project(), Role.OWNER),
        "operator": OperatorFactory(),
    }
    api_client.force_authenticate(users[who])
    response = api_client.get(URL, {"project": proj.slug, "month": "2025-03"})
    assert response.status_code == code, response.content
    if code == 200:
        assert response.json()["totals"]["held_gpu_hours"] == pytest.approx(6)


def test_the_statement_as_csv_ranks_reservations_then_the_three_totals(api_client, proj, march):  # type: ignore[no-untyped-def]
    api_client.force_authenticate(march["owner"])
    for url, extra in ((URL, {"format": "csv"}), (URL + ".csv", {})):
        response = api_client.get(url, {"project": proj.slug, "month": "2025-03", **extra})
        assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
        assert f"efficiency-{proj.slug}-2025-03.csv" in response["Content-Disposition"]
        lines = response.content.decode().strip().splitlines()
        assert lines[0].startswith("key,label,held_gpu_hours,idle_gpu_hours")
        assert [line.split(",")[0] for line in lines[3:]] == ["total", "previous", "fleet"]
        assert lines[1].split(",")[1] == "half-idle"


def test_a_bad_month_is_a_400_naming_it(api_client, proj, march):  # type: ignore[no-untyped-def]
    api_client.force_authenticate(march["owner"])
    for bad in ("2025-13", "March", "2025-3", "0000-01", "0001-01", "9999-12"):
        response = api_client.get(URL, {"project": proj.slug, "month": bad})
        assert response.status_code == 400 and "month" in response.json()["error"]["fields"]
    missing = api_client.get(URL, {"month": "2025-03"})
    assert missing.status_code == 400 and "project" in missing.json()["error"]["fields"]


@pytest.mark.parametrize(("who", "code"), [("owner", 403), ("outsider", 403), ("operator", 200)])
def test_only_operators_see_the_ranking(api_client, proj, march, who, code):  # type: ignore[no-untyped-def]
    users = {"owner": march["owner"], "outsider": member_of(project(), Role.OWNER), "operator": OperatorFactory()}
    api_client.force_authenticate(users[who])
    response = api_client.get("/api/v1/usage/efficiency-ranking", {"month": "2025-03"})
    assert response.status_code == code
    if code == 200:
        assert response.json()["projects"][0]["project"] == proj.slug
        csv = api_client.get("/api/v1/usage/efficiency-ranking.csv", {"month": "2025-03"})
        assert csv.status_code == 200 and csv.content.decode().splitlines()[-1].startswith(",fleet,")
