"""Idle reclamation on simulated telemetry: minute rows as the heartbeat ingest writes them."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from controlplane.accounting import reclaim
from controlplane.accounting.choices import IdleState
from controlplane.accounting.models import IdleReclamation
from controlplane.accounts.choices import Role
from controlplane.ledger.choices import EntryKind
from controlplane.ledger.models import LedgerEntry
from controlplane.ledger.services import quota_policy_set
from controlplane.reservations.choices import ReservationState
from controlplane.reservations.models import Reservation
from controlplane.reservations.services import reservation_finish, reservation_mark
from tests.accounting.helpers import book, telemetry
from tests.factories import UserFactory, member_of
from tests.reservations.fleet import project

pytestmark = pytest.mark.django_db

MIN = timedelta(minutes=1)


def _policy(proj: Any, percent: str | None = "5", minutes: int | None = 30, grace: int | None = 15) -> None:
    quota_policy_set(
        project=proj,
        actor=None,
        idle_util_percent=Decimal(percent) if percent else None,
        idle_minutes=minutes,
        idle_grace_minutes=grace,
        fields={"idle_util_percent", "idle_minutes", "idle_grace_minutes"},
    )


@pytest.fixture
def t0() -> datetime:
    # Half an hour ago, on the minute: the API's own clock then falls inside the grace of a warning at t0+30.
    return timezone.now().replace(second=0, microsecond=0) - 30 * MIN


def _running(proj: Any, model: Any, start: datetime, *, count: int = 2, hours: int = 4) -> Reservation:
    r = book(proj, model, start, start + timedelta(hours=hours), count=count)
    assert reservation_mark(
        reservation=r,
        from_states=[ReservationState.SCHEDULED],
        to=ReservationState.RUNNING,
        actor_label="system:test",
        reason="started",
        at=start,
    )
    r.refresh_from_db()
    return r


def _gpus(r: Reservation) -> list[int]:
    return list(r.allocations.values_list("gpu_id", flat=True))


def _idle(r: Reservation, start: datetime, minutes: int, util: float | None = 1.0) -> None:
    for gpu_id in _gpus(r):
        telemetry(gpu_id, start, minutes, util=util)


def test_the_warning_goes_out_at_the_threshold_and_not_before(proj, model, rack, t0):  # type: ignore[no-untyped-def]
    _policy(proj)
    r = _running(proj, model, t0)
    _idle(r, t0, 30)
    booked_end = r.ends_at
    assert reclaim.idle_reclaim_pass(now=t0 + 30 * MIN - timedelta(seconds=1)) == 0
    r.refresh_from_db()
    assert r.ends_at == booked_end and r.yield_notice_seconds is None

    assert reclaim.idle_reclaim_pass(now=t0 + 30 * MIN) == 1
    r.refresh_from_db()
    assert r.ends_at == t0 + 45 * MIN
    assert r.yield_notice_seconds == 15 * 60
    assert r.yield_reason.startswith("idle: mean utilization 1.0% < 5% for 30 min")
    assert set(r.allocations.values_list("ends_at", flat=True)) == {t0 + 45 * MIN}
    warning = r.events.get(data__idle="warned")
    assert warning.data["booked_ends_at"] == booked_end.isoformat()
    assert IdleReclamation.objects.get(reservation=r).state == IdleState.WARNED


def test_busy_gpus_are_not_reclaimed_and_one_busy_gpu_keeps_the_whole_job(proj, model, rack, t0):  # type: ignore[no-untyped-def]
    _policy(proj)
    r = _running(proj, model, t0)
    first, second = _gpus(r)
    telemetry(first, t0, 30, util=0.0)
    telemetry(second, t0, 30, util=9.0)  # the mean across both (4.5 %) is under 5 %; this GPU is not
    assert reclaim.idle_reclaim_pass(now=t0 + 30 * MIN) == 0
    assert not IdleReclamation.objects.exists()


def test_unknown_or_sparse_utilization_is_never_reclaimed(proj, model, rack, t0):  # type: ignore[no-untyped-def]
    _policy(proj)
    r = _running(proj, model, t0)
    assert reclaim.idle_reclaim_pass(now=t0 + 30 * MIN) == 0  # no readings at all
    first, second = _gpus(r)
    telemetry(first, t0, 30, util=0.0)
    telemetry(second, t0, 30, util=None)  # minutes with power but no utilization field: unknown
    assert reclaim.idle_reclaim_pass(now=t0 + 30 * MIN) == 0
    r.refresh_from_db()
    assert r.yield_notice_seconds is None


def test_readings_for_less_than_ninety_percent_of_the_span_are_not_idle(proj, model, rack, t0):  # type: ignore[no-untyped-def]
    _policy(proj)
    r = _running(proj, model, t0)
    first, second = _gpus(r)
    telemetry(first, t0, 30, util=0.0)
    telemetry(second, t0, 26, util=0.0)  # 26 of 30 minutes: under the 27 the coverage rule asks
    assert reclaim.idle_reclaim_pass(now=t0 + 30 * MIN) == 0
    telemetry(second, t0 + 26 * MIN, 1, util=0.0)  # 27 of 30
    assert reclaim.idle_reclaim_pass(now=t0 + 30 * MIN) == 1


def test_a_policy_without_thresholds_never_reclaims(proj, model, rack, t0):  # type: ignore[no-untyped-def]
    r = _running(proj, model, t0)
    _idle(r, t0, 60, util=0.0)
    assert reclaim.idle_reclaim_pass(now=t0 + 60 * MIN) == 0
    assert not IdleReclamation.objects.exists()


def test_half_a_threshold_is_refused():  # type: ignore[no-untyped-def]
    from django.core.exceptions import ValidationError

    proj = project()
    with pytest.raises(ValidationError) as exc:
        _policy(proj, grace=None)
    assert "idle_util_percent" in exc.value.message_dict


def test_the_beat_is_idempotent_two_runs_make_one_yield(proj, model, rack, t0):  # type: ignore[no-untyped-def]
    _policy(proj)
    r = _running(proj, model, t0)
    _idle(r, t0, 30)
    assert reclaim.idle_reclaim_pass(now=t0 + 30 * MIN) == 1
    assert reclaim.idle_reclaim_pass(now=t0 + 30 * MIN + timedelta(seconds=30)) == 0
    assert r.events.filter(data__notice_seconds=15 * 60).count() == 1
    assert r.events.filter(data__idle="warned").count() == 1


def test_keep_restores_the_booked_end_and_is_not_reclaimed_again(proj, model, rack, t0):  # type: ignore[no-untyped-def]
    _policy(proj)
    owner = member_of(proj, Role.OWNER)
    r = _running(proj, model, t0)
    booked_end = r.ends_at
    _idle(r, t0, 60)
    reclaim.idle_reclaim_pass(now=t0 + 30 * MIN)
    kept = reclaim.idle_keep(reservation=r, actor=owner, now=t0 + 31 * MIN)
    assert kept.ends_at == booked_end
    assert kept.yield_notice_seconds is None and kept.yield_reason == ""
    assert set(kept.allocations.values_list("ends_at", flat=True)) == {booked_end}
    assert IdleReclamation.objects.get(reservation=r).state == IdleState.KEPT
    assert kept.events.filter(data__idle="kept", actor=owner).count() == 1
    # Still idle later: never reclaimed again in this window.
    assert reclaim.idle_reclaim_pass(now=t0 + 60 * MIN) == 0
    kept.refresh_from_db()
    assert kept.ends_at == booked_end
    from controlplane.core.errors import Conflict

    with pytest.raises(Conflict) as exc:
        reclaim.idle_keep(reservation=r, actor=owner, now=t0 + 62 * MIN)
    assert exc.value.code == "nothing_to_keep"


def test_keep_is_refused_when_the_freed_gpus_were_booked_meanwhile(proj, model, rack, t0):  # type: ignore[no-untyped-def]
    from controlplane.core.errors import Conflict

    _policy(proj)
    r = _running(proj, model, t0, count=4)  # the rack's four GPUs
    _idle(r, t0, 30)
    reclaim.idle_reclaim_pass(now=t0 + 30 * MIN)
    r.refresh_from_db()
    cut_end = r.ends_at
    other = project()
    book(other, model, cut_end, cut_end + timedelta(hours=1), count=4)  # someone takes them from the cut end
    with pytest.raises(Conflict) as exc:
        reclaim.idle_keep(reservation=r, actor=None, now=t0 + 31 * MIN)
    assert exc.value.code == "gpu_taken"
    r.refresh_from_db()
    assert r.ends_at == cut_end
    assert IdleReclamation.objects.get(reservation=r).state == IdleState.WARNED


def test_after_the_grace_the_gpus_are_released_and_the_unused_credits_refunded(proj, model, rack, t0):  # type: ignore[no-untyped-def]
    _policy(proj)
    r = _running(proj, model, t0)  # 2 GPUs x weight 2 x 4 h = 16 credits held
    _idle(r, t0, 30)
    held = -sum(e.amount for e in LedgerEntry.objects.filter(reservation=r, kind=EntryKind.HOLD))
    assert held == Decimal("16")
    reclaim.idle_reclaim_pass(now=t0 + 30 * MIN)
    r.refresh_from_db()
    cut_end = r.ends_at
    # What dispatch does at the cut end: the container stopped, the finish settles the ledger.
    assert reservation_finish(
        reservation=r, to=ReservationState.COMPLETED, ended_at=cut_end, actor_label="system:test", reason="ended"
    )
    charge = -sum(e.amount for e in LedgerEntry.objects.filter(reservation=r, kind=EntryKind.CHARGE))
    release = sum(e.amount for e in LedgerEntry.objects.filter(reservation=r, kind=EntryKind.RELEASE))
    assert charge == Decimal("3")  # 2 GPUs x 2 x 0.75 h up to the cut end
    assert release == Decimal("16")  # the hold comes back whole; the charge takes what ran
    assert reclaim.idle_reclaim_pass(now=cut_end) == 1
    reclamation = IdleReclamation.objects.get(reservation=r)
    assert reclamation.state == IdleState.RECLAIMED
    assert reclamation.reclaimed_gpu_hours == pytest.approx(2 * 3.25)
    assert r.events.filter(data__idle="reclaimed").count() == 1
    totals = reclaim.reclaimed_gpu_hours(project_ids=[proj.pk], start=t0, end=t0 + timedelta(days=1))
    assert totals == {proj.pk: pytest.approx(6.5)}


def test_keep_after_the_grace_is_refused(proj, model, rack, t0):  # type: ignore[no-untyped-def]
    from controlplane.core.errors import Conflict

    _policy(proj)
    r = _running(proj, model, t0)
    _idle(r, t0, 30)
    reclaim.idle_reclaim_pass(now=t0 + 30 * MIN)
    with pytest.raises(Conflict) as exc:
        reclaim.idle_keep(reservation=r, actor=None, now=t0 + 45 * MIN)
    assert exc.value.code == "nothing_to_keep"


def test_listeners_hear_of_the_warning_once_it_commits(proj, model, rack, t0, django_capture_on_commit_callbacks):  # type: ignore[no-untyped-def]
    heard: list[IdleReclamation] = []
    reclaim.register_on_idle_warning(heard.append)
    try:
        _policy(proj)
        r = _running(proj, model, t0)
        _idle(r, t0, 30)
        with django_capture_on_commit_callbacks(execute=True):
            reclaim.idle_reclaim_pass(now=t0 + 30 * MIN)
        assert [h.reservation_id for h in heard] == [r.pk]
    finally:
        reclaim._on_idle_warning.remove(heard.append)


@pytest.mark.parametrize("role,status", [(Role.OWNER, 200), (Role.MEMBER, 200), (Role.VIEWER, 403), (None, 404)])
def test_keep_api_owner_teammate_viewer_outsider(api_client, proj, model, rack, t0, role, status):  # type: ignore[no-untyped-def]
    _policy(proj)
    r = _running(proj, model, t0)
    _idle(r, t0, 30)
    reclaim.idle_reclaim_pass(now=t0 + 30 * MIN)
    user = member_of(proj, role) if role else UserFactory()
    api_client.force_authenticate(user)
    res = api_client.post(f"/api/v1/reservations/{r.public_id}/keep/")
    assert res.status_code == status, res.content
    if status == 200:
        assert res.json()["ends_at"].startswith((t0 + timedelta(hours=4)).strftime("%Y-%m-%dT%H:%M"))
        again = api_client.post(f"/api/v1/reservations/{r.public_id}/keep/")
        assert again.status_code == 409 and again.json()["error"]["code"] == "nothing_to_keep"


def test_the_usage_report_and_its_csv_show_reclaimed_gpu_hours(api_client, proj, model, rack, t0):  # type: ignore[no-untyped-def]
    _policy(proj)
    owner = member_of(proj, Role.OWNER)
    r = _running(proj, model, t0)
    _idle(r, t0, 30)
    reclaim.idle_reclaim_pass(now=t0 + 30 * MIN)
    r.refresh_from_db()
    reclaim.idle_reclaim_pass(now=r.ends_at)  # the grace passed unkept
    api_client.force_authenticate(owner)
    day = t0.date().isoformat()
    params = {"project": proj.slug, "start": day, "end": (t0 + timedelta(days=2)).date().isoformat()}
    data = api_client.get("/api/v1/usage/report", params).json()
    assert data["reclaimed_gpu_hours"] == pytest.approx(6.5)
    assert data["reclaimed_by_project"] == {proj.slug: pytest.approx(6.5)}
    csv = api_client.get("/api/v1/usage/report.csv", params).content.decode()
    assert csv.splitlines()[-1].startswith("idle_reclaimed,Idle reclaimed (6.5 GPU-hours)")
    other = project()
    outsider = member_of(other, Role.OWNER)
    api_client.force_authenticate(outsider)
    assert api_client.get("/api/v1/usage/report", {**params, "project": other.slug}).json()["reclaimed_gpu_hours"] == 0


def test_the_idle_endpoint_says_where_the_warning_stands(api_client, proj, model, rack, t0):  # type: ignore[no-untyped-def]
    _policy(proj)
    viewer = member_of(proj, Role.VIEWER)
    r = _running(proj, model, t0)
    api_client.force_authenticate(viewer)
    assert api_client.get(f"/api/v1/reservations/{r.public_id}/idle/").json() == {"idle": None}
    _idle(r, t0, 30)
    reclaim.idle_reclaim_pass(now=t0 + 30 * MIN)
    idle = api_client.get(f"/api/v1/reservations/{r.public_id}/idle/").json()["idle"]
    assert idle["state"] == "warned" and idle["idle_minutes"] == 30 and idle["threshold_percent"] == "5.00"
    assert idle["cut_ends_at"].startswith((t0 + 45 * MIN).strftime("%Y-%m-%dT%H:%M"))


def test_operators_set_the_thresholds_together_through_the_quota_api(api_client, proj):  # type: ignore[no-untyped-def]
    from tests.factories import OperatorFactory

    api_client.force_authenticate(OperatorFactory())
    url = f"/api/v1/ledger/quotas/{proj.slug}/"
    half = api_client.patch(url, {"idle_util_percent": "5"}, format="json")
    assert half.status_code == 400, half.content
    assert "idle_util_percent" in half.json()["error"]["fields"]
    bad = api_client.patch(url, {"idle_util_percent": "5", "idle_minutes": 1, "idle_grace_minutes": 15}, format="json")
    assert bad.status_code == 400 and "idle_minutes" in bad.json()["error"]["fields"]
    ok = api_client.patch(url, {"idle_util_percent": "5", "idle_minutes": 30, "idle_grace_minutes": 15}, format="json")
    assert ok.status_code == 200, ok.content
    assert (ok.json()["idle_util_percent"], ok.json()["idle_minutes"], ok.json()["idle_grace_minutes"]) == (
        "5.00",
        30,
        15,
    )
    off = api_client.patch(
        url, {"idle_util_percent": None, "idle_minutes": None, "idle_grace_minutes": None}, format="json"
    )
    assert off.status_code == 200 and off.json()["idle_minutes"] is None
