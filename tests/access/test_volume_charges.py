"""Storage charges: per GiB-hour of size limit, once per volume and hour, through the ledger; capped when the
credits run out; shown in the usage report (JSON and CSV), the monthly statement and the ledger's entries."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from controlplane.access import storage
from controlplane.access.models import Volume
from controlplane.access.tasks import charge_volume_storage
from controlplane.access.volumes import volume_create, volume_delete, volume_update
from controlplane.accounting.selectors import project_report
from controlplane.accounting.statements import statement_generate, statements_generate_due
from controlplane.ledger.choices import EntryKind
from controlplane.ledger.models import LedgerEntry
from controlplane.ledger.selectors import ledger_totals
from tests.access.volume_world import VolumeWorld
from tests.reservations.fleet import project

pytestmark = pytest.mark.django_db
T0 = datetime(2025, 3, 10, 9, 20, tzinfo=UTC)  # a volume made at 09:20 is charged from the 09:00 hour


@pytest.fixture
def w(db: Any) -> VolumeWorld:
    return VolumeWorld()


def made_at(volume: Volume, when: datetime) -> Volume:
    Volume.objects.filter(pk=volume.pk).update(created_at=when, charged_until=storage.hour_of(when))
    return Volume.objects.get(pk=volume.pk)


def storage_entries(**filters: Any) -> list[LedgerEntry]:
    return list(
        LedgerEntry.objects.filter(kind=EntryKind.CHARGE, reservation__isnull=True, **filters).order_by("period_key")
    )


def test_each_ended_hour_is_charged_once_at_the_size_limit(w, settings):
    settings.ACCESS_VOLUME_CREDITS_PER_GIB_HOUR = "0.5"
    made_at(w.data, T0)  # 10 GiB
    made_at(w.foreign, T0)  # 5 GiB, the other project's
    now = T0 + timedelta(hours=3)  # 12:20: the 09, 10 and 11 hours have ended
    assert storage.storage_charge_due(now=now) == 6
    assert storage.storage_charge_due(now=now) == 0
    assert storage.storage_charge_due(now=now + timedelta(minutes=30)) == 0  # 12:50: the 12 hour has not ended
    mine = storage_entries(project=w.project)
    assert [e.period_key for e in mine] == ["2025-03-10T09", "2025-03-10T10", "2025-03-10T11"]
    assert {e.amount for e in mine} == {Decimal("-5.0000")}
    assert mine[0].data == {
        "kind": "storage", "volume": "data", "volume_id": w.data.pk, "hour": "2025-03-10T09:00:00+00:00",
        "gib": 10, "rate": "0.5", "used": "5.0000",
    }  # fmt: skip
    assert mine[0].actor_label == "system:storage" and "volume data" in mine[0].reason
    assert [e.amount for e in storage_entries(project=w.other)] == [Decimal("-2.5000")] * 3
    assert Volume.objects.get(pk=w.data.pk).charged_until == datetime(2025, 3, 10, 12, tzinfo=UTC)


def test_the_default_rate_is_a_thousandth_of_a_credit_per_gib_hour(w):
    made_at(w.data, T0)
    storage.storage_charge_due(now=T0 + timedelta(hours=1))
    assert [e.amount for e in storage_entries(project=w.project)] == [Decimal("-0.0100")]


def test_charging_a_volume_twice_for_the_same_hours_charges_once(w):
    volume = made_at(w.data, T0)
    stale = Volume.objects.get(pk=volume.pk)  # a second worker's copy, read before the first charged
    assert storage.charge_volume(volume=volume, through=T0 + timedelta(hours=2)) == 2
    assert storage.charge_volume(volume=stale, through=T0 + timedelta(hours=2)) == 0
    assert len(storage_entries(project=w.project)) == 2


def test_a_resize_applies_to_the_hours_charged_after_it(w, settings):
    settings.ACCESS_VOLUME_CREDITS_PER_GIB_HOUR = "1"
    made_at(w.data, T0)
    storage.storage_charge_due(now=T0 + timedelta(hours=1))
    volume_update(volume=w.data, actor=w.owner, size_limit_gib=30)
    storage.storage_charge_due(now=T0 + timedelta(hours=2))
    assert [e.amount for e in storage_entries(project=w.project)] == [Decimal("-10.0000"), Decimal("-30.0000")]


def test_a_deleted_volume_pays_for_the_hour_it_is_deleted_in(w):
    made_at(w.data, T0)
    made_at(w.foreign, T0)
    volume_delete(volume=w.data, actor=w.owner, now=T0 + timedelta(hours=1, minutes=5))  # at 10:25
    assert [e.period_key for e in storage_entries(project=w.project)] == ["2025-03-10T09", "2025-03-10T10"]
    assert storage.storage_charge_due(now=T0 + timedelta(hours=5)) == 5  # only the other project's volume
    assert len(storage_entries(project=w.project)) == 2


def test_a_task_run_catches_up_over_runs_and_is_bounded(w):
    made_at(w.data, T0)
    made_at(w.foreign, T0 + timedelta(days=30))  # not due
    now = T0 + timedelta(days=20)  # 480 hours behind
    assert storage.storage_charge_due(now=now, limit=100) == 100
    assert storage.storage_charge_due(now=now) == storage.MAX_HOURS_PER_VOLUME  # a week per volume per run
    assert storage.storage_charge_due(now=now) == storage.MAX_HOURS_PER_VOLUME
    assert storage.storage_charge_due(now=now) == 480 - 100 - 2 * storage.MAX_HOURS_PER_VOLUME
    assert storage.storage_charge_due(now=now) == 0
    assert len(storage_entries(project=w.project)) == 480
    assert charge_volume_storage.run() > 0  # the beat task: the hours since, up to now


def test_when_credits_run_out_the_charge_is_capped_and_the_rest_recorded(w, settings):
    settings.ACCESS_VOLUME_CREDITS_PER_GIB_HOUR = "1"
    poor = project(owner=w.owner, grant="15", slug="poor")
    volume = made_at(volume_create(project=poor, name="big", size_limit_gib=10, actor=w.owner), T0)
    storage.storage_charge_due(now=T0 + timedelta(hours=3))
    entries = storage_entries(project=poor)
    assert [e.amount for e in entries] == [Decimal("-10.0000"), Decimal("-5.0000"), Decimal("0.0000")]
    assert [e.data.get("uncharged") for e in entries] == [None, "5.0000", "10.0000"]
    assert ledger_totals(project_id=poor.pk).balance == 0  # never below zero
    assert Volume.objects.filter(pk=volume.pk).exists()  # the volume is kept
    report = project_report(project=poor, start=datetime(2025, 3, 1, tzinfo=UTC), end=datetime(2025, 4, 1, tzinfo=UTC))
    assert (report.storage.credits, report.storage.uncharged, report.storage.gib_hours) == (15, 15, 30)


def test_the_usage_report_shows_storage_per_volume_and_in_the_total(w, settings):
    settings.ACCESS_VOLUME_CREDITS_PER_GIB_HOUR = "0.25"
    made_at(w.data, T0)
    scratch = made_at(volume_create(project=w.project, name="scratch", size_limit_gib=2, actor=w.owner), T0)
    storage.storage_charge_due(now=T0 + timedelta(hours=4))
    volume_update(volume=scratch, actor=w.owner, size_limit_gib=2)
    client = w.client(w.viewer)
    query = {"project": "atlas", "start": "2025-03-10T10:00:00Z", "end": "2025-03-10T12:00:00Z"}  # two hours
    body = client.get("/api/v1/usage/report", query).json()
    assert body["storage"] == {
        "key": "storage", "label": "Storage (volumes)", "gib_hours": 24, "credits": "6.0000", "uncharged": "0.0000",
        "volumes": [
            {"volume": "data", "gib_hours": 20, "credits": "5.0000"},
            {"volume": "scratch", "gib_hours": 4, "credits": "1.0000"},
        ],
    }  # fmt: skip
    assert body["totals"]["credits"] == "0.0000"  # GPUs: none used
    assert body["total_credits"] == "6.0000"
    csv = client.get("/api/v1/usage/report.csv", query).content.decode().strip().splitlines()
    assert csv[-2].startswith("storage,Storage (24 GiB-hours),") and csv[-2].split(",")[9] == "6.0000"
    assert csv[-1].startswith("total_with_storage,Total with storage,") and csv[-1].split(",")[9] == "6.0000"
    # Another tenant's report is theirs alone.
    assert w.client(w.outsider).get("/api/v1/usage/report", query).status_code == 404


def test_the_monthly_statement_carries_storage(w):
    made_at(w.data, T0)
    storage.storage_charge_due(now=T0 + timedelta(hours=2))
    # Storage alone makes a project due for a statement.
    assert statements_generate_due(now=datetime(2025, 4, 1, 1, tzinfo=UTC)) == 1
    statement = statement_generate(project=w.project, month=T0)
    assert statement.totals["storage"]["gib_hours"] == 20 and statement.totals["storage"]["credits"] == "0.0200"
    assert statement.totals["total_credits"] == "0.0200"
    assert "storage,Storage (20 GiB-hours)" in statement.csv
    res = w.client(w.owner).get(f"/api/v1/usage/statements/{statement.pk}/")
    assert res.json()["totals"]["storage"]["volumes"] == [{"volume": "data", "gib_hours": 20, "credits": "0.0200"}]


def test_the_ledger_lists_storage_charges_with_no_reservation(w):
    made_at(w.data, T0)
    storage.storage_charge_due(now=T0 + timedelta(hours=1))
    rows = w.client(w.member).get("/api/v1/ledger/entries/", {"kind": "charge"}).json()["results"]
    assert [(r["reservation"], r["period_key"], r["data"]["volume"]) for r in rows] == [(None, "2025-03-10T09", "data")]
    balance = w.client(w.member).get("/api/v1/ledger/balances/atlas/").json()
    assert Decimal(balance["by_kind"]["charge"]) == Decimal("-0.0100")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_workers_charging_at_once_charge_each_hour_once():
    from tests.access.test_volume_booking import race

    w = VolumeWorld()
    made_at(w.data, T0)
    made_at(w.foreign, T0)
    now = T0 + timedelta(hours=6)
    race(*(lambda: storage.storage_charge_due(now=now) for _ in range(6)))
    keys = [e.period_key for e in storage_entries(project=w.project)]
    assert len(keys) == len(set(keys)) == 6
    assert len(storage_entries(project=w.other)) == 6
