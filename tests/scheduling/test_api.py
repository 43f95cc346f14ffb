from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.reservations import services as booking
from controlplane.scheduling import services
from controlplane.scheduling.choices import RequestState
from controlplane.scheduling.models import QueuedRequest
from tests.factories import UserFactory
from tests.reservations.fleet import CONTAINER, gpu_model, project, server, spec, window
from tests.scheduling.support import allow, submit

pytestmark = pytest.mark.django_db
URL = "/api/v1/requests/"


@pytest.fixture
def fleet():  # type: ignore[no-untyped-def]
    model = gpu_model()
    server(model, gpus=2)
    return model


@pytest.fixture
def team():  # type: ignore[no-untyped-def]
    owner, member, viewer, outsider = (UserFactory() for _ in range(4))
    proj = project(owner=owner, member=member, viewer=viewer, grant="1000")
    return {"project": proj, "owner": owner, "member": member, "viewer": viewer, "outsider": outsider}


def body(proj, **over):  # type: ignore[no-untyped-def]
    data = {
        "project": proj.slug,
        "name": "train",
        "spec": {"gpu_model": "H100-80GB", "gpu_count": 2},
        "container": {"image": "registry.example/train:1", "command": ["python", "train.py"]},
        "duration": "1h30m",
    }
    data.update(over)
    return data


@pytest.mark.parametrize(("role", "expected"), [("owner", 201), ("member", 201), ("viewer", 403), ("outsider", 404)])
def test_submitting_needs_owner_or_member(api_client, fleet, team, role, expected):
    api_client.force_authenticate(team[role])
    response = api_client.post(URL, body(team["project"]), format="json")
    assert response.status_code == expected, response.data


def test_submit_answers_the_queued_request(api_client, fleet, team):
    allow(team["project"], "high")
    api_client.force_authenticate(team["member"])
    start_by = (timezone.now() + timedelta(hours=4)).isoformat()
    response = api_client.post(URL, body(team["project"], start_by=start_by, priority_class="high"), format="json")
    assert response.status_code == 201, response.data
    data = response.data
    assert data["state"] == "queued" and data["priority_class"] == "high" and data["duration_seconds"] == 5400
    assert data["spec"] == {"gpu_model": "H100-80GB", "min_memory_mib": None, "gpu_count": 2, "whole_servers": None}
    assert data["position"] == 1 and data["reservation"] is None
    assert data["estimated_start"] is not None
    assert QueuedRequest.objects.get(public_id=data["id"]).priority_class.name == "high"


@pytest.mark.parametrize("duration", ["PT1H", 3600, "1h"])
def test_the_duration_forms_of_a_booking_window(api_client, fleet, team, duration):
    api_client.force_authenticate(team["owner"])
    response = api_client.post(URL, body(team["project"], duration=duration), format="json")
    assert response.status_code == 201, response.data
    assert response.data["duration_seconds"] == 3600
    assert response.data["priority_class"] == "normal"


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"duration": "soon"}, "duration"),
        ({"duration": 0}, "duration"),
        ({"spec": {"gpu_model": "B999", "gpu_count": 1}}, "spec.gpu_model"),
        ({"container": {"image": "x", "command": "python train.py"}}, "container.command"),
        ({"start_by": "2031-01-01T10:00:00"}, "start_by"),
        ({"priority_class": "urgent"}, "priority_class"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(api_client, fleet, team, over, field):
    api_client.force_authenticate(team["owner"])
    response = api_client.post(URL, body(team["project"], **over), format="json")
    assert response.status_code == 400, response.data
    assert field in response.data["error"]["fields"], response.data
    assert not QueuedRequest.objects.exists()


def test_more_gpus_than_the_fleet_has_is_refused(api_client, fleet, team):
    api_client.force_authenticate(team["owner"])
    response = api_client.post(
        URL, body(team["project"], spec={"gpu_model": "H100-80GB", "gpu_count": 3}), format="json"
    )
    assert response.status_code == 409
    assert response.data["error"]["code"] == "no_capacity" and "spec.gpu_count" in response.data["error"]["fields"]
    assert QueuedRequest.objects.count() == 0


def test_tenants_see_only_their_projects_requests(api_client, fleet, team):
    mine = submit(team["project"], spec(fleet))
    other = submit(project(), spec(fleet))
    api_client.force_authenticate(team["viewer"])
    listed = api_client.get(URL).data
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert [r["id"] for r in rows] == [str(mine.public_id)]
    assert api_client.get(f"{URL}{mine.public_id}/").status_code == 200
    assert api_client.get(f"{URL}{other.public_id}/").status_code == 404
    assert api_client.post(f"{URL}{other.public_id}/cancel/", {}, format="json").status_code == 404


def test_filter_by_state(api_client, fleet, team):
    queued = submit(team["project"], spec(fleet))
    gone = submit(team["project"], spec(fleet))
    services.request_cancel(request=gone, actor=team["owner"])
    api_client.force_authenticate(team["owner"])
    listed = api_client.get(URL, {"state": "queued", "project": team["project"].slug}).data
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert [r["id"] for r in rows] == [str(queued.public_id)]


def test_cancel_by_a_member_not_a_viewer(api_client, fleet, team):
    r = submit(team["project"], spec(fleet))
    api_client.force_authenticate(team["viewer"])
    assert api_client.post(f"{URL}{r.public_id}/cancel/", {}, format="json").status_code == 403
    api_client.force_authenticate(team["member"])
    response = api_client.post(f"{URL}{r.public_id}/cancel/", {"reason": "not needed"}, format="json")
    assert response.status_code == 200 and response.data["state"] == "cancelled"
    assert response.data["position"] is None
    again = api_client.post(f"{URL}{r.public_id}/cancel/", {}, format="json")
    assert again.status_code == 409 and again.data["error"]["code"] == "invalid_state"


def test_position_estimated_start_reason_and_reservation(api_client, fleet, team):
    proj = team["project"]
    blocker = booking.reservation_create(
        project=proj,
        name="blocker",
        spec=spec(fleet, count=2),
        window=window(start_in=timedelta(0), hours=2),
        container=CONTAINER,
        actor=team["owner"],
    )
    normal = submit(proj, spec(fleet, count=2))
    high = submit(proj, spec(fleet, count=2), priority="high")
    services.schedule_pass()
    api_client.force_authenticate(team["viewer"])
    a = api_client.get(f"{URL}{normal.public_id}/").data
    b = api_client.get(f"{URL}{high.public_id}/").data
    assert (a["position"], b["position"]) == (2, 1)
    # When the blocker ends, plus the hour the high one ahead of it takes on the two GPUs.
    expected = blocker.ends_at + timedelta(hours=1)
    assert a["estimated_start"] == expected.isoformat().replace("+00:00", "Z")
    assert b["estimated_start"] == blocker.ends_at.isoformat().replace("+00:00", "Z")
    until = blocker.ends_at.isoformat().replace("+00:00", "Z")
    assert b["reason"] == f"waiting for 2 x H100-80GB; blocked by reservation {blocker.public_id} until {until}"
    booking.reservation_release(reservation=blocker, actor=team["owner"])
    services.schedule_pass()
    b = api_client.get(f"{URL}{high.public_id}/").data
    high.refresh_from_db()
    assert b["state"] == RequestState.STARTED and b["reservation"] == str(high.reservation.public_id)
    assert b["position"] is None and b["estimated_start"] is None


def test_a_retry_with_the_same_idempotency_key_queues_once(fleet, team):
    from rest_framework.test import APIClient

    from tests.factories import ApiTokenFactory

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {ApiTokenFactory(user=team['owner']).plaintext}")
    first = client.post(URL, body(team["project"]), format="json", HTTP_IDEMPOTENCY_KEY="queue-1")
    second = client.post(URL, body(team["project"]), format="json", HTTP_IDEMPOTENCY_KEY="queue-1")
    assert first.status_code == second.status_code == 201
    assert second["Idempotent-Replayed"] == "true" and second.json()["id"] == first.json()["id"]
    assert QueuedRequest.objects.count() == 1


def test_the_list_costs_the_same_queries_for_one_request_or_many(api_client, fleet, team):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    api_client.force_authenticate(team["owner"])
    submit(team["project"], spec(fleet))
    with CaptureQueriesContext(connection) as one:
        assert api_client.get(URL).status_code == 200
    for _ in range(5):
        submit(team["project"], spec(fleet))
    with CaptureQueriesContext(connection) as six:
        rows = api_client.get(URL).data["results"]
    assert len(rows) == 6
    assert len(six) == len(one), [q["sql"] for q in six.captured_queries]


def test_a_restricted_class_the_policy_does_not_allow_is_a_400_naming_priority_class(api_client, fleet, team):
    api_client.force_authenticate(team["member"])
    response = api_client.post(URL, body(team["project"], priority_class="high"), format="json")
    assert response.status_code == 400
    error = response.data["error"]
    assert error["code"] == "validation_error" and "priority_class" in error["fields"]
    assert 'The class "high" is restricted' in error["fields"]["priority_class"][0]
    assert not QueuedRequest.objects.exists()
    allow(team["project"], "high")
    assert api_client.post(URL, body(team["project"], priority_class="high"), format="json").status_code == 201


@pytest.fixture
def operator():  # type: ignore[no-untyped-def]
    return UserFactory(is_staff=True)


def test_operators_see_the_whole_queue_with_a_reason_per_request(api_client, fleet, team, operator):
    proj, other = team["project"], project()
    blocker = booking.reservation_create(
        project=other,
        name="blocker",
        spec=spec(fleet, count=2),
        window=window(start_in=timedelta(0), hours=2),
        container=CONTAINER,
        actor=operator,
    )
    mine = submit(proj, spec(fleet, count=2), name="mine")
    theirs = submit(other, spec(fleet, count=1), name="theirs", hours=3)
    held = submit(other, spec(fleet, count=1), name="held")
    services.request_hold(request=held, actor=operator)
    services.schedule_pass()
    api_client.force_authenticate(operator)
    rows = api_client.get(f"{URL}queue/").data
    assert [(r["name"], r["position"], r["state"]) for r in rows] == [
        ("mine", 1, "queued"),
        ("theirs", 2, "queued"),
        ("held", None, "held"),
    ]
    until = blocker.ends_at.isoformat().replace("+00:00", "Z")
    assert rows[0]["reason"] == f"waiting for 2 x H100-80GB; blocked by reservation {blocker.public_id} until {until}"
    assert rows[0]["blocked_by"] == str(blocker.public_id) and rows[0]["blocked_until"] == until
    assert rows[0]["spec"] == "2 x H100-80GB" and rows[0]["fair_share_factor"] == 1.0
    assert rows[1]["reason"].startswith(f"waiting behind request {mine.public_id}")
    assert rows[1]["id"] == str(theirs.public_id)
    api_client.force_authenticate(team["owner"])
    assert api_client.get(f"{URL}queue/").status_code == 403


def test_operators_hold_release_and_change_the_class(api_client, fleet, team, operator):
    r = submit(team["project"], spec(fleet, count=1))
    api_client.force_authenticate(team["owner"])
    for path, payload in (("hold/", {}), ("release/", {}), ("priority-class/", {"priority_class": "high"})):
        assert api_client.post(f"{URL}{r.public_id}/{path}", payload, format="json").status_code == 403
    api_client.force_authenticate(operator)
    held = api_client.post(f"{URL}{r.public_id}/hold/", {"reason": "image under review"}, format="json")
    assert held.status_code == 200 and held.data["state"] == "held" and held.data["position"] is None
    again = api_client.post(f"{URL}{r.public_id}/hold/", {}, format="json")
    assert again.status_code == 409 and again.data["error"]["code"] == "invalid_state"
    moved = api_client.post(f"{URL}{r.public_id}/priority-class/", {"priority_class": "high"}, format="json")
    assert moved.status_code == 200 and moved.data["priority_class"] == "high" and moved.data["state"] == "held"
    bad = api_client.post(f"{URL}{r.public_id}/priority-class/", {"priority_class": "nope"}, format="json")
    assert bad.status_code == 400 and "priority_class" in bad.data["error"]["fields"]
    released = api_client.post(f"{URL}{r.public_id}/release/", {}, format="json")
    assert released.status_code == 200 and released.data["state"] == "queued" and released.data["position"] == 1
    assert [(e["from_state"], e["to_state"], e["reason"]) for e in released.data["events"]] == [
        ("", "queued", "submitted"),
        ("queued", "held", "image under review"),
        ("held", "held", "class normal -> high"),
        ("held", "queued", "released by an operator"),
    ]


def test_a_project_fair_share_is_its_members_to_see(api_client, fleet, team):
    url = f"/api/v1/projects/{team['project'].slug}/fair-share/"
    api_client.force_authenticate(team["viewer"])
    data = api_client.get(url).data
    assert data["factor"] == 1.0 and data["shares"] == 1 and data["half_life_days"] == 7.0
    api_client.force_authenticate(team["outsider"])
    assert api_client.get(url).status_code == 404


CLASSES = "/api/v1/priority-classes/"


def test_the_classes_are_listed_most_urgent_first_with_their_terms(api_client, team):
    api_client.force_authenticate(team["member"])
    response = api_client.get(CLASSES)
    assert response.status_code == 200, response.data
    rows = response.json()
    assert [r["rank"] for r in rows] == sorted((r["rank"] for r in rows), reverse=True)
    assert [r["name"] for r in rows] == ["high", "normal", "preemptible"]
    preemptible = rows[2]
    assert set(preemptible) == {
        "name",
        "rank",
        "credit_multiplier",
        "notice_seconds",
        "preemptible",
        "restricted",
        "allowed",
    }
    assert preemptible["credit_multiplier"] == "0.500" and preemptible["notice_seconds"] == 120
    assert preemptible["preemptible"] is True and rows[0]["restricted"] is True


def test_an_operators_edit_of_a_class_is_what_the_list_answers(api_client, team):
    from decimal import Decimal

    from controlplane.scheduling.models import PriorityClass

    PriorityClass.objects.filter(name="preemptible").update(credit_multiplier=Decimal("0.25"), notice_seconds=300)
    api_client.force_authenticate(team["owner"])
    row = next(r for r in api_client.get(CLASSES).json() if r["name"] == "preemptible")
    assert row["credit_multiplier"] == "0.250" and row["notice_seconds"] == 300


def allowed(api_client, user):  # type: ignore[no-untyped-def]
    api_client.force_authenticate(user)
    return {r["name"]: r["allowed"] for r in api_client.get(CLASSES).json()}


def test_a_restricted_class_is_allowed_only_where_a_project_is_granted_it(api_client, team):
    ungranted = {"high": False, "normal": True, "preemptible": True}
    assert allowed(api_client, team["member"]) == ungranted
    allow(team["project"], "high")
    assert allowed(api_client, team["member"]) == {"high": True, "normal": True, "preemptible": True}
    assert allowed(api_client, team["owner"])["high"] is True
    # Neither a viewer (who cannot submit) nor an outsider gains from another project's grant.
    assert allowed(api_client, team["viewer"]) == ungranted
    assert allowed(api_client, team["outsider"]) == ungranted


def test_a_grant_to_another_project_does_not_allow_the_class(api_client, team):
    other = project(owner=UserFactory(), grant="10")
    allow(other, "high")
    assert allowed(api_client, team["member"])["high"] is False


def test_operators_may_use_every_class(api_client, operator):
    assert set(allowed(api_client, operator).values()) == {True}


def test_anonymous_callers_are_refused_the_classes(api_client):
    assert api_client.get(CLASSES).status_code in (401, 403)


def test_the_classes_cost_the_same_queries_however_many_projects_are_granted(api_client, team):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    api_client.force_authenticate(team["member"])
    api_client.get(CLASSES)  # warm the session's own lookups
    with CaptureQueriesContext(connection) as none_granted:
        assert api_client.get(CLASSES).status_code == 200
    for _ in range(4):
        extra = project(owner=UserFactory(), member=team["member"], grant="10")
        allow(extra, "high")
    allow(team["project"], "high")
    with CaptureQueriesContext(connection) as five_granted:
        assert api_client.get(CLASSES).json()[0]["allowed"] is True
    assert len(five_granted) == len(none_granted) <= 2, [q["sql"] for q in five_granted.captured_queries]
