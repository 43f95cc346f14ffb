from __future__ import annotations

import threading

import pytest
from django.db import connection

from controlplane.accounts import services
from controlplane.accounts.choices import Role
from controlplane.accounts.models import Membership
from controlplane.core.errors import Conflict, PermissionDenied
from tests.factories import ProjectFactory, member_of


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_owners_demoting_each_other_at_once_leave_one_owner():
    project = ProjectFactory()
    a = member_of(project, Role.OWNER)
    b = member_of(project, Role.OWNER)
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def demote(actor, target) -> None:  # type: ignore[no-untyped-def]
        try:
            barrier.wait(timeout=10)
            services.membership_set(project=project, user=target, role=Role.MEMBER, actor=actor)
            outcomes.append("demoted")
        except (Conflict, PermissionDenied):
            # Conflict: the other was demoted first and this one was the last owner; PermissionDenied:
            # this actor was demoted first, so may no longer manage members.
            outcomes.append("refused")
        finally:
            connection.close()

    threads = [threading.Thread(target=demote, args=(a, b)), threading.Thread(target=demote, args=(b, a))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(outcomes) == ["demoted", "refused"]
    assert Membership.objects.filter(project=project, role=Role.OWNER).count() == 1
