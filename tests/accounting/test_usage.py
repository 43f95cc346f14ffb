"""Usage records: measured from what ran, split by hour, adding up to the ledger's charge."""

from __future__ import annotations

from decimal import Decimal

import pytest

from controlplane.accounting.models import UsageRecord, UsageSlice
from controlplane.accounting.selectors import ledger_charges, project_report
from controlplane.accounting.services import split_exact, usage_record_pending, usage_record_reservation
from controlplane.dispatch.choices import LaunchState
from controlplane.reservations.choices import ReservationState
from controlplane.reservations.services import reservation_cancel, reservation_extend, reservation_release
from tests.accounting.helpers import at, book, charged, finish, ran
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def slices_of(reservation):  # type: ignore[no-untyped-def]
    return {
        (s.record.gpu_id, s.hour): s
        for s in UsageSlice.objects.filter(reservation=reservation).select_related("record")
    }


def test_usage_is_measured_from_container_start_and_stop_not_from_the_booking(proj, model, rack):  # type: ignore[no-untyped-def]
    user = UserFactory()
    r = book(proj, model, at("2025-03-10 10:00"), at("2025-03-10 12:00"), count=2, actor=user)
    ran(r, at("2025-03-10 10:05"), at("2025-03-10 11:35"))
    finish(r, ended_at=at("2025-03-10 12:00"))

    records = list(UsageRecord.objects.filter(reservation=r))
    assert len(records) == 2
    for record in records:
        assert record.gpu_seconds == pytest.approx(90 * 60)
        assert record.booked_s == pytest.approx(2 * 3600)
        assert record.started_at == at("2025-03-10 10:05") and record.finished_at == at("2025-03-10 11:35")
        assert record.user == user and record.gpu_model == model
    # 2 GPUs x 1.5 h x weight 2 = 6 credits; price 2/h -> cost 6.
    assert charged(r) == Decimal("6.0000")
    assert sum(rec.credits for rec in records) == charged(r)
    assert sum(rec.cost for rec in records) == Decimal("6.0000")
    gpu = records[0].gpu_id
    slices = slices_of(r)
    assert slices[(gpu, at("2025-03-10 10:00"))].used_s == pytest.approx(55 * 60)
    assert slices[(gpu, at("2025-03-10 11:00"))].used_s == pytest.approx(35 * 60)
    assert slices[(gpu, at("2025-03-10 10:00"))].credits == Decimal("1.8333")  # 55/90 of 3, largest remainder
    assert sum(s.credits for s in slices.values()) == Decimal("6.0000")


def test_early_release_stops_booking_and_usage_at_the_release(proj, model, rack):  # type: ignore[no-untyped-def]
    r = book(proj, model, at("2025-03-10 10:00"), at("2025-03-10 14:00"))
    ran(r, at("2025-03-10 10:00"), at("2025-03-10 11:00:40"))  # stopped 40 s into the grace
    reservation_release(reservation=r, actor=None, now=at("2025-03-10 11:00"))
    finish(r, ended_at=at("2025-03-10 11:00"))

    record = UsageRecord.objects.get(reservation=r)
    assert record.booked_s == pytest.approx(3600) and record.booked_end == at("2025-03-10 11:00")
    assert record.gpu_seconds == pytest.approx(3600)
    assert record.credits == charged(r) == Decimal("2.0000")


def test_extension_is_booked_and_charged_for_what_ran_in_it(proj, model, rack):  # type: ignore[no-untyped-def]
    r = book(proj, model, at("2025-03-10 10:00"), at("2025-03-10 11:00"))
    reservation_extend(reservation=r, ends_at=at("2025-03-10 12:30"), actor=None, now=at("2025-03-10 10:30"))
    ran(r, at("2025-03-10 10:00"), at("2025-03-10 12:30"))
    finish(r, ended_at=at("2025-03-10 12:30"))

    record = UsageRecord.objects.get(reservation=r)
    assert record.booked_s == pytest.approx(2.5 * 3600)
    assert record.gpu_seconds == pytest.approx(2.5 * 3600)
    assert record.credits == charged(r) == Decimal("5.0000")
    assert sorted(h for _, h in slices_of(r)) == [
        at("2025-03-10 10:00"),
        at("2025-03-10 11:00"),
        at("2025-03-10 12:00"),
    ]


def test_interrupted_reservation_is_charged_up_to_the_loss(proj, model, rack):  # type: ignore[no-untyped-def]
    r = book(proj, model, at("2025-03-10 10:00"), at("2025-03-10 14:00"))
    ran(r, at("2025-03-10 10:00"), None, state=LaunchState.LOST)  # the server went silent: no stop reported
    finish(r, ended_at=at("2025-03-10 11:15"), to=ReservationState.INTERRUPTED)

    record = UsageRecord.objects.get(reservation=r)
    assert record.gpu_seconds == pytest.approx(75 * 60)
    assert record.booked_s == pytest.approx(75 * 60)  # the GPU was freed at the loss
    assert record.credits == charged(r) == Decimal("2.5000")


def test_reservation_crossing_a_month_is_attributed_by_usage_time(proj, model, rack):  # type: ignore[no-untyped-def]
    r = book(proj, model, at("2025-01-31 22:00"), at("2025-02-01 02:00"), count=2)
    ran(r, at("2025-01-31 22:30"), at("2025-02-01 01:30"))
    finish(r, ended_at=at("2025-02-01 02:00"))

    jan = project_report(project=proj, start=at("2025-01-01"), end=at("2025-02-01"), group_by="day")
    feb = project_report(project=proj, start=at("2025-02-01"), end=at("2025-03-01"), group_by="day")
    # 1.5 of the 3 hours ran in January on each GPU: half the charge each side.
    assert jan.total.credits == feb.total.credits == charged(r) / 2
    assert jan.total.used_s == pytest.approx(2 * 1.5 * 3600)
    assert jan.total.booked_s == pytest.approx(2 * 2 * 3600)
    assert jan.total.credits + feb.total.credits == charged(r)
    assert ledger_charges(project=proj, start=at("2025-01-01"), end=at("2025-02-01")) == jan.total.credits
    assert ledger_charges(project=proj, start=at("2025-02-01"), end=at("2025-03-01")) == feb.total.credits


def test_reservation_that_never_ran_is_recorded_with_nothing_charged(proj, model, rack):  # type: ignore[no-untyped-def]
    r = book(proj, model, at("2025-03-10 10:00"), at("2025-03-10 12:00"))
    finish(r, ended_at=at("2025-03-10 12:00"), to=ReservationState.FAILED)

    record = UsageRecord.objects.get(reservation=r)
    assert record.gpu_seconds == 0 and record.credits == 0 == charged(r)
    assert record.booked_s == pytest.approx(7200)  # held all the same, and reported as booked


def test_cancelled_before_the_window_gets_an_empty_record_and_the_reconciler_moves_on(proj, model, rack):  # type: ignore[no-untyped-def]
    r = book(proj, model, at("2025-03-10 10:00"), at("2025-03-10 12:00"))
    reservation_cancel(reservation=r, actor=None, now=at("2025-03-10 09:30"))

    assert usage_record_pending() == 1
    record = UsageRecord.objects.get(reservation=r)
    assert record.booked_s == 0 and record.credits == 0
    assert not UsageSlice.objects.filter(reservation=r).exists()
    assert usage_record_pending() == 0


def test_recording_twice_writes_nothing_more(proj, model, rack):  # type: ignore[no-untyped-def]
    r = book(proj, model, at("2025-03-10 10:00"), at("2025-03-10 12:00"))
    ran(r, at("2025-03-10 10:00"), at("2025-03-10 12:00"))
    finish(r, ended_at=at("2025-03-10 12:00"))
    before = (UsageRecord.objects.count(), UsageSlice.objects.count())

    assert len(usage_record_reservation(reservation=r)) == 1
    assert usage_record_pending() == 0
    assert (UsageRecord.objects.count(), UsageSlice.objects.count()) == before


def test_a_live_reservation_is_not_recorded(proj, model, rack):  # type: ignore[no-untyped-def]
    r = book(proj, model, at("2025-03-10 10:00"), at("2025-03-10 12:00"))
    assert usage_record_reservation(reservation=r) == []
    assert usage_record_pending() == 0


def test_report_reads_the_capped_charge_when_the_balance_ran_out(model, rack):  # type: ignore[no-untyped-def]
    from tests.reservations.fleet import project

    proj = project(grant="5")
    r = book(proj, model, at("2025-03-10 10:00"), at("2025-03-10 11:00"))  # holds 2 of the 5
    ran(r, at("2025-03-10 10:00"), at("2025-03-10 11:00"))
    finish(r, ended_at=at("2025-03-10 11:00"))
    report = project_report(project=proj, start=at("2025-03-10"), end=at("2025-03-11"))
    assert report.total.credits == charged(proj) == Decimal("2.0000")


@pytest.mark.parametrize(
    ("total", "weights"),
    [
        (Decimal("1.0000"), [1.0, 1.0, 1.0]),
        (Decimal("0.0001"), [5.0, 3.0]),
        (Decimal("7.3333"), [0.0, 0.0]),
        (Decimal("123.4567"), [3300.0, 2100.0, 0.5, 1e-9]),
    ],
)
def test_split_exact_parts_add_up_to_the_total(total, weights):  # type: ignore[no-untyped-def]
    parts = split_exact(total, weights)
    assert sum(parts) == total
    assert all(p >= 0 for p in parts)
    assert all(abs(p - a) <= Decimal("0.0001") for p, a in zip(parts, split_exact(total, weights), strict=True))


def test_split_exact_gives_a_part_with_no_weight_nothing():
    assert split_exact(Decimal("1.0000"), [1.0, 0.0, 3.0]) == [Decimal("0.2500"), Decimal("0"), Decimal("0.7500")]
