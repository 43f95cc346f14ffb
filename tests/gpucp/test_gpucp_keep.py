"""``gpucp keep`` against a live server: answering an idle warning (docs/efficiency.md, "Idle reclamation")."""

from __future__ import annotations

from gpucp_support import Gpucp, World

from controlplane.accounting.choices import IdleState
from controlplane.accounting.models import IdleReclamation
from tests.accounting.helpers import idle_warned


def test_keep_restores_the_booked_end_and_a_second_keep_exits_1(gpucp: Gpucp, world: World):
    r = idle_warned(world.project, world.model, actor=world.owner)
    booked_end = IdleReclamation.objects.get(reservation=r).booked_ends_at
    result = gpucp("--utc", "keep", str(r.public_id))
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"Kept {r.public_id}: it runs to ") and "UTC" in result.stdout
    r.refresh_from_db()
    assert r.ends_at == booked_end
    assert IdleReclamation.objects.get(reservation=r).state == IdleState.KEPT
    again = gpucp("keep", str(r.public_id))
    assert again.exit_code == 1
    assert "no idle warning" in again.stderr and "(nothing_to_keep)" in again.stderr


def test_keep_of_a_reservation_never_warned_exits_1(gpucp: Gpucp, world: World):
    from datetime import timedelta

    from django.utils import timezone

    from tests.accounting.helpers import book

    start = timezone.now() + timedelta(hours=1)
    r = book(world.project, world.model, start, start + timedelta(hours=1))
    result = gpucp("keep", str(r.public_id))
    assert result.exit_code == 1
    assert "(nothing_to_keep)" in result.stderr
