"""The efficiency statement and the operator's ranking (controlplane/accounting/efficiency.py), from reservations
that really ran (launches, settlement) and minute telemetry rolled up by the real rollup."""

from __future__ import annotations

import csv
import io
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


def run(proj, model, start, hours, *, count=1, utils=(80.0,), actor=None, name="job", profiling=None):  # type: ignore[no-untyped-def]
    """A reservation of ``count`` GPUs that ran its whole window; ``utils``: each hour's utilization;
    ``profiling``: each hour's (SM, tensor, DRAM) activity ratios, or None for an hour without them."""
    end = start + timedelta(hours=hours)
    r = book(proj, model, start, end, count=count, actor=actor, name=name)
    ran(r, start, end)
    finish(r, ended_at=end)
    for gpu_id in r.allocations.values_list("gpu_id", flat=True):
        for i, util in enumerate(utils):
            prof = profiling[i] if profiling else None
            telemetry(gpu_id, start + timedelta(hours=i), 60, util=util, power_w=300.0, profiling=prof)
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


def test_profiling_readings_are_shown_where_measured_and_not_measured_elsewhere(proj, model, rack):  # type: ignore[no-untyped-def]
    # A busy loop: 95 % utilization and little work; a real job: 90 % with SM and tensors busy; a GPU without GPM.
    run(proj, model, at("2025-03-10 10:00"), 2, utils=(95.0, 95.0), profiling=[(0.05, 0.0, 0.02)] * 2, name="loop")
    run(
        proj,
        model,
        at("2025-03-11 10:00"),
        2,
        count=2,
        utils=(90.0, 90.0),
        profiling=[(0.8, 0.5, 0.4), None],
        name="train",
    )
    run(proj, model, at("2025-03-12 10:00"), 1, utils=(90.0,), name="old-gpu")
    data = efficiency.statement(project=proj, month=at("2025-03-01 00:00"))
    rows = {r["name"]: r for r in data["reservations"]}
    loop, train, old = rows["loop"], rows["train"], rows["old-gpu"]
    assert loop["profiling"] == "measured" and loop["profiled_gpu_hours"] == pytest.approx(2)
    assert (loop["sm_active_percent"], loop["tensor_active_percent"], loop["dram_active_percent"]) == (5.0, 0.0, 2.0)
    assert loop["util_mean_percent"] == pytest.approx(95)  # what utilization alone would have said
    # Measured in its first hour only: the means are that hour's, and the statement says it is partial.
    assert train["profiling"] == "partly measured" and train["profiled_gpu_hours"] == pytest.approx(2)
    assert (train["sm_active_percent"], train["tensor_active_percent"]) == (80.0, 50.0)
    assert old["profiling"] == "not measured" and old["profiled_gpu_hours"] == 0
    assert old["sm_active_percent"] is None and old["tensor_active_percent"] is None  # never a zero
    # The month's totals weight each hour by its held time: 2 h at 5 %, 2 GPU-h at 80 %.
    t = data["totals"]
    assert t["profiling"] == "partly measured" and t["profiled_gpu_hours"] == pytest.approx(4)
    assert t["sm_active_percent"] == pytest.approx((5 * 2 + 80 * 2) / 4) and t["tensor_active_percent"] == 25.0
    assert data["previous"]["profiling"] == "not measured" and data["previous"]["sm_active_percent"] is None


def test_the_csv_labels_profiling_readings_and_says_not_measured(api_client, proj, model, rack):  # type: ignore[no-untyped-def]
    owner = member_of(proj, Role.OWNER)
    run(proj, model, at("2025-03-10 10:00"), 1, utils=(60.0,), profiling=[(0.5, 0.25, 0.1)], actor=owner, name="gpm")
    run(proj, model, at("2025-03-11 10:00"), 1, utils=(0.0,), actor=owner, name="nvml-only")
    api_client.force_authenticate(owner)
    response = api_client.get(URL + ".csv", {"project": proj.slug, "month": "2025-03"})
    rows = {row["label"]: row for row in csv.DictReader(io.StringIO(response.content.decode()))}
    assert rows["gpm"]["profiling"] == "measured" and float(rows["gpm"]["sm_active_percent"]) == 50.0
    assert float(rows["gpm"]["tensor_active_percent"]) == 25.0 and float(rows["gpm"]["dram_active_percent"]) == 10.0
    assert rows["nvml-only"]["profiling"] == "not measured" and rows["nvml-only"]["sm_active_percent"] == ""
    assert rows["Total 2025-03"]["profiling"] == "partly measured"
    json = api_client.get(URL, {"project": proj.slug, "month": "2025-03"}).json()
    assert json["totals"]["sm_active_percent"] == 50.0 and json["fleet"]["profiling"] == "partly measured"


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
