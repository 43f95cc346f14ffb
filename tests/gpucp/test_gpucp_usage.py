"""``gpucp usage``: the project's report beside its ledger balance, against a live server."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from decimal import Decimal

from django.utils import timezone
from gpucp_support import Gpucp, World

from controlplane.accounting.services import usage_record_reservation
from controlplane.ledger.selectors import ledger_totals
from controlplane.reservations import services as reservations
from tests.dispatch.support import book
from tests.reservations.fleet import project


def finished_reservation(world: World) -> datetime:
    """Two GPU-hours booked and charged, in the hour before the last, with its usage recorded; its start."""
    now = timezone.now().replace(minute=0, second=0, microsecond=0)
    start = now - timedelta(hours=2)
    r = book(world.project, world.model, count=2, seconds=3600, now=start, user=world.owner)
    reservations.reservation_finish(
        reservation=r, to="completed", ended_at=r.ends_at, actor_label="test", reason="done"
    )
    usage_record_reservation(reservation=r)
    return start


def test_usage_shows_the_report_and_the_balance(gpucp: Gpucp, world: World):
    start = finished_reservation(world)
    result = gpucp("--utc", "usage", "--period", "day", "--date", start.date().isoformat())
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("Usage of demo, ") and lines[0].endswith("UTC, by user:")
    alice = next(line.split() for line in lines if line.startswith("alice"))
    total = next(line.split() for line in lines if line.startswith("total"))
    assert alice[1] == total[1] == "2.00"  # booked GPU-hours
    totals = ledger_totals(project_id=world.project.pk)
    assert lines[-1] == f"Balance: {totals.balance:.4f} credits ({totals.held:.4f} held for booked windows)."
    assert totals.balance == Decimal("998")


def test_usage_json_has_the_apis_report_and_balance(gpucp: Gpucp, world: World):
    start = finished_reservation(world)
    data = json.loads(gpucp("--json", "usage", "--by", "gpu_model", "--date", start.date().isoformat()).stdout)
    assert set(data) == {"report", "balance"}
    assert data["report"]["project"] == "demo" and data["report"]["group_by"] == "gpu_model"
    assert [row["key"] for row in data["report"]["rows"]] == ["H100-80GB"]
    assert data["report"]["totals"]["booked_gpu_hours"] == 2.0
    assert data["balance"]["project"] == "demo" and Decimal(data["balance"]["balance"]) == Decimal("998")


def test_usage_needs_a_project_when_there_are_several(gpucp: Gpucp, world: World):
    project(owner=world.owner, slug="second")
    result = gpucp("usage")
    assert result.exit_code == 2 and "give --project" in result.stderr
    assert gpucp("usage", "--project", "second").exit_code == 0


def test_usage_of_a_project_not_yours_exits_4(gpucp: Gpucp):
    project(slug="theirs")
    result = gpucp("usage", "--project", "theirs")
    assert result.exit_code == 4 and "(not_found)" in result.stderr


def test_usage_with_a_period_the_api_does_not_know_gives_its_message(gpucp: Gpucp):
    result = gpucp("usage", "--period", "year")
    assert result.exit_code == 1
    assert "period" in result.stderr and "(validation_error)" in result.stderr
