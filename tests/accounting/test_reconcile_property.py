"""Property: whatever runs, a report's credits equal the ledger's charges, over any split of the range."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.accounting.selectors import ledger_charges, project_report
from controlplane.reservations.choices import ReservationState
from controlplane.reservations.services import reservation_extend, reservation_release
from tests.accounting.helpers import at, book, charged, finish, ran
from tests.reservations.fleet import gpu_model, project, server

pytestmark = pytest.mark.django_db

ORIGIN = at("2025-01-31 18:00")  # runs cross the January/February boundary

run = st.fixed_dictionaries(
    {
        "start_h": st.integers(0, 8),
        "hours": st.integers(1, 6),
        "count": st.integers(1, 2),
        "heavy": st.booleans(),
        "late_start_min": st.integers(0, 50),
        "stop_early_min": st.integers(0, 50),
        "ending": st.sampled_from(["completed", "released", "extended", "interrupted", "never_ran"]),
    }
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(runs=st.lists(run, min_size=1, max_size=4), cut_h=st.integers(1, 14))
def test_report_credits_equal_ledger_charges_for_random_runs(db, runs, cut_h):  # type: ignore[no-untyped-def]
    light, heavy = gpu_model("L4-24GB", 24576, weight="0.7"), gpu_model("H200-141GB", 144384, weight="3.3")
    proj = project()
    for i, r in enumerate(runs):
        model = heavy if r["heavy"] else light
        server(model, gpus=2)
        start = ORIGIN + timedelta(hours=r["start_h"], minutes=7 * i)
        end = start + timedelta(hours=r["hours"])
        res = book(proj, model, start, end, count=r["count"])
        began = start + timedelta(minutes=r["late_start_min"])
        stop = end - timedelta(minutes=r["stop_early_min"])
        to = ReservationState.COMPLETED
        if r["ending"] == "released":
            cut = began + (end - began) / 2
            reservation_release(reservation=res, actor=None, now=cut)
            stop = end = cut
        elif r["ending"] == "extended":
            new_end = end + timedelta(minutes=95)
            reservation_extend(reservation=res, ends_at=new_end, actor=None, now=start)
            stop = end = new_end
        elif r["ending"] == "interrupted":
            to, stop = ReservationState.INTERRUPTED, None
            end = began + (end - began) / 3
        if r["ending"] != "never_ran" and (stop is None or stop > began):
            ran(res, began, stop)
        finish(res, ended_at=end, to=to)

    everything = project_report(project=proj, start=at("2025-01-01"), end=at("2025-03-01"), group_by="reservation")
    assert everything.total.credits == charged(proj)
    cut = ORIGIN + timedelta(hours=cut_h)
    left = project_report(project=proj, start=at("2025-01-01"), end=cut, group_by="user")
    right = project_report(project=proj, start=cut, end=at("2025-03-01"), group_by="gpu_model")
    assert left.total.credits + right.total.credits == charged(proj)
    assert ledger_charges(project=proj, start=at("2025-01-01"), end=cut) == left.total.credits
    assert left.total.used_s + right.total.used_s == pytest.approx(everything.total.used_s)
    assert sum(row.credits for row in everything.rows) == everything.total.credits
