"""The pass's order and EASY backfill against shadow times (docs/scheduling.md, "The pass")."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from controlplane.reservations import services as booking
from controlplane.reservations.specs import Window
from controlplane.scheduling import services
from controlplane.scheduling.choices import RequestState
from controlplane.scheduling.order import shadow
from tests.factories import UserFactory
from tests.reservations.fleet import CONTAINER, gpu_model, project, server, spec, window
from tests.scheduling.support import submit

pytestmark = pytest.mark.django_db


def book(proj, model, *, count, start_in, hours):  # type: ignore[no-untyped-def]
    return booking.reservation_create(
        project=proj,
        name="booked",
        spec=spec(model, count=count),
        window=window(start_in=start_in, hours=hours),
        container=CONTAINER,
        actor=UserFactory(),
    )


def states(*requests):  # type: ignore[no-untyped-def]
    for r in requests:
        r.refresh_from_db()
    return [r.state for r in requests]


def test_a_short_request_behind_a_blocked_one_backfills_the_free_gpus():
    model = gpu_model()
    server(model, gpus=4)
    proj = project()
    now = timezone.now()
    blocker = book(proj, model, count=2, start_in=timedelta(0), hours=2)
    big = submit(proj, spec(model, count=4), hours=1, priority="high", name="big", now=now)
    short = submit(proj, spec(model, count=2), hours=2, name="short", now=now)  # ends with the blocker
    long = submit(proj, spec(model, count=2), hours=3, name="long", now=now)
    report = services.run_pass(now=now)
    assert states(big, short, long) == [RequestState.QUEUED, RequestState.STARTED, RequestState.QUEUED]
    assert report.backfilled == 1 and report.blocked == 1 and report.skipped_by_backfill_rule == 1
    # The shadow time of "big" is unchanged by the backfill: it still starts when the blocker ends.
    assert shadow(spec(model, count=4), duration=timedelta(hours=1), now=now).at == blocker.ends_at
    assert big.blocked_until == blocker.ends_at and big.blocked_by == blocker
    assert long.reason.startswith(f"waiting behind request {big.public_id}, which is blocked until ")


def test_a_request_starts_in_the_gap_before_an_advance_window_and_never_into_it():
    model = gpu_model()
    server(model, gpus=2)
    proj = project()
    now = timezone.now()
    advance = booking.reservation_create(
        project=proj,
        name="advance",
        spec=spec(model, count=2),
        window=Window(now + timedelta(hours=1), now + timedelta(hours=2)),
        container=CONTAINER,
        actor=UserFactory(),
    )
    too_long = submit(proj, spec(model, count=1), hours=1.5, priority="high", name="too-long", now=now)
    fits = submit(proj, spec(model, count=1), hours=1, name="fits", now=now)
    services.run_pass(now=now)
    assert states(too_long, fits) == [RequestState.QUEUED, RequestState.STARTED]
    assert fits.reservation.ends_at == advance.starts_at
    assert too_long.blocked_until == advance.ends_at
    advance.refresh_from_db()
    assert (advance.starts_at, advance.ends_at) == (now + timedelta(hours=1), now + timedelta(hours=2))


def test_every_blocked_request_ahead_bounds_a_backfill():
    model = gpu_model()
    server(model, gpus=4)
    proj = project()
    now = timezone.now()
    book(proj, model, count=2, start_in=timedelta(0), hours=3)
    early = book(proj, model, count=1, start_in=timedelta(0), hours=1)
    # "wide" waits for the 3-hour booking; "three" only for the 1-hour one: its shadow is the earlier bound.
    wide = submit(proj, spec(model, count=4), hours=1, priority="high", name="wide", now=now)
    three = submit(proj, spec(model, count=2), hours=1, priority="high", name="three", now=now)
    backfill = submit(proj, spec(model, count=1), hours=2, name="too-long-for-three", now=now)
    services.run_pass(now=now)
    assert states(wide, three, backfill) == [RequestState.QUEUED] * 3
    assert three.blocked_until == early.ends_at
    assert "which is blocked until" in backfill.reason


def test_a_held_request_is_skipped_and_released_back_into_its_place():
    model = gpu_model()
    server(model, gpus=1)
    proj = project()
    first = submit(proj, spec(model), name="first")
    second = submit(proj, spec(model), name="second")
    operator = UserFactory(is_staff=True)
    services.request_hold(request=first, actor=operator, reason="checking its image")
    assert services.schedule_pass() == 1
    assert states(first, second) == [RequestState.HELD, RequestState.STARTED]
    released = services.request_release(request=first, actor=operator)
    assert released.state == RequestState.QUEUED
    assert [(e.from_state, e.to_state, e.reason) for e in first.events.all()][1:] == [
        ("queued", "held", "checking its image"),
        ("held", "queued", "released by an operator"),
    ]


def test_the_pass_tries_at_most_its_cap():
    model = gpu_model()
    server(model, gpus=1)
    proj = project()
    book(proj, model, count=1, start_in=timedelta(0), hours=5)
    for i in range(5):
        submit(proj, spec(model), hours=10, name=f"r{i}")
    report = services.run_pass(max_tries=2)
    assert report.tried == 1 and report.blocked == 1  # the rest would end past the blocked one's shadow
    short = [submit(proj, spec(model), hours=1, name=f"s{i}") for i in range(3)]
    assert services.run_pass(max_tries=2).tried == 2
    assert states(*short) == [RequestState.QUEUED] * 3


def test_requests_the_rule_skips_cost_the_pass_no_query_once_their_reason_is_written():
    model = gpu_model()
    server(model, gpus=1)
    proj = project()
    book(proj, model, count=1, start_in=timedelta(0), hours=5)
    submit(proj, spec(model), hours=10, priority="high", name="head")
    submit(proj, spec(model), hours=10, name="behind")
    services.run_pass()
    with CaptureQueriesContext(connection) as few:
        services.run_pass()
    for i in range(10):
        submit(proj, spec(model), hours=10, name=f"more{i}")
    services.run_pass()  # writes their reasons once
    with CaptureQueriesContext(connection) as many:
        services.run_pass()
    assert len(many) == len(few)
