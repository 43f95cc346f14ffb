"""POST /reservations reads every body with ReservationCreateSerializer (``read_booking``), the one definition of
a valid booking: valid bookings of each form, each kind of bad input as its 400 naming the field, a project not
the caller's as 404, and the serializer each thread reuses leaving nothing of one request for the next. The
answer is built directly and gives what ReservationDetailSerializer gives."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer

from controlplane.accounts.models import Project
from controlplane.reservations import services
from controlplane.reservations.api.serializers import ReservationDetailSerializer, read_booking, reservation_detail
from controlplane.reservations.models import Reservation
from controlplane.reservations.specs import ContainerSpec, GpuSpec
from tests.factories import OperatorFactory, UserFactory
from tests.reservations.fleet import gpu_model, project, server, window

pytestmark = pytest.mark.django_db
URL = "/api/v1/reservations/"


def _json(data: Any) -> Any:
    return json.loads(JSONRenderer().render(data))


@pytest.fixture
def owner(api_client):  # type: ignore[no-untyped-def]
    model = gpu_model()
    server(model, gpus=8)
    server(model, gpus=8)
    user = UserFactory()
    project(owner=user, grant="100000")
    api_client.force_authenticate(user)
    return user


MISSING = object()  # a key left out of the body


def _body(**over: Any) -> dict[str, Any]:
    """A valid booking in the first project, with ``over`` merged in (a part's keys one by one)."""
    start = timezone.now() + timedelta(hours=1)
    data: dict[str, Any] = {
        "project": Project.objects.order_by("pk").first().slug,  # type: ignore[union-attr]
        "name": "train",
        "spec": {"gpu_model": "H100-80GB", "gpu_count": 2},
        "window": {"start": start.isoformat(), "end": (start + timedelta(hours=2)).isoformat()},
        "container": {"image": "registry.example/train:1", "command": ["python", "t.py"], "env": {"A": "1"}},
    }
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {k: v for k, v in {**data[key], **value}.items() if v is not MISSING}
        elif value is MISSING:
            del data[key]
        else:
            data[key] = value
    return data


@pytest.mark.parametrize(
    ("over", "stored"),
    [
        ({}, {"gpu_count": 2, "name": "train"}),
        ({"spec": {"gpu_model": "h100-80gb"}}, {"gpu_count": 2}),  # any case
        ({"spec": {"gpu_model": None, "min_memory_mib": 1000, "gpu_count": 1}}, {"min_memory_mib": 1000}),
        ({"spec": {"gpu_count": None, "whole_servers": 1}}, {"whole_servers": 1}),
        ({"name": "  padded  "}, {"name": "padded"}),
        ({"container": {"command": [" keep ", ""], "env": {"_a1": " spaced ", "B": ""}}}, {}),
        ({"window": {"start": " NOW ", "end": (timezone.now() + timedelta(hours=3)).isoformat()}}, {}),
        ({"window": {"start": "now", "end": MISSING, "duration": "10m"}}, {}),
        ({"window": {"end": MISSING, "duration": 600}}, {}),
    ],
)
def test_a_valid_booking_is_booked_as_given(api_client, owner, over, stored):
    data = _body(**over)
    response = api_client.post(URL, data, format="json")
    assert response.status_code == 201, response.json()
    reservation = Reservation.objects.get()
    for attr, value in stored.items():
        assert getattr(reservation, attr) == value
    assert reservation.command == data["container"]["command"]
    assert reservation.env == data["container"]["env"]


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"name": MISSING}, "name", "This field is required."),
        ({"spec": "H100-80GB"}, "spec", "Invalid data. Expected a dictionary, but got str."),
        ({"name": "x" * 121}, "name", "Ensure this field has no more than 120 characters."),
        ({"name": "   "}, "name", "This field may not be blank."),
        ({"spec": {"min_memory_mib": 1000}}, "spec.gpu_model", "Give either a GPU model or a minimum GPU memory"),
        ({"spec": {"whole_servers": 1}}, "spec.gpu_count", "Give either a GPU count or a number of whole servers"),
        ({"spec": {"gpu_count": 0}}, "spec.gpu_count", "Ensure this value is greater than or equal to 1."),
        ({"spec": {"gpu_count": 4097}}, "spec.gpu_count", "Ensure this value is less than or equal to 4096."),
        ({"spec": {"gpu_model": "NOPE"}}, "spec.gpu_model", 'No GPU model named "NOPE". Valid names: H100-80GB.'),
        ({"spec": {"gpu_model": 7}}, "spec.gpu_model", "Not a valid string."),
        ({"spec": {"mig_profile": "1g.10gb"}}, "spec.mig_profile", "Give a MIG profile instead of a GPU model"),
        ({"window": {"start": "yesterday"}}, "window.start", "Datetime has wrong format."),
        ({"window": {"start": "2020-01-01T00:00:00Z"}}, "window.start", "The window cannot start in the past"),
        ({"window": {"end": "2020-01-01T00:00:00Z"}}, "window.end", "The window must end after it starts."),
        ({"window": {"end": "2030-01-01T00:00:00"}}, "window.end", "This date-time has no time zone"),
        ({"window": {"duration": "10m"}}, "window.duration", "Give window.end or window.duration, not both."),
        ({"window": {"end": MISSING, "duration": "0m"}}, "window.duration", "A duration must be longer than zero."),
        ({"window": {"end": MISSING}}, "window.end", "Give window.end or window.duration."),
        ({"container": {"image": ""}}, "container.image", "This field may not be blank."),
        ({"container": {"image": "y" * 513}}, "container.image", "no more than 512 characters"),
        ({"container": {"command": "python"}}, "container.command", 'Expected a list of items but got type "str".'),
        ({"container": {"command": [1]}}, "container.command.0", "Not a valid string."),
        ({"container": {"command": ["a\x00"]}}, "container.command.0", "Null characters are not allowed."),
        ({"container": {"env": {"A": 1}}}, "container.env.A", "Not a valid string."),
        ({"container": {"env": {"A=B": "1"}}}, "container.env.A=B", "Not a valid variable name"),
        ({"container": {"network": "host"}}, "container.network", '"host" is not a valid choice.'),
    ],
)
def test_bad_input_is_a_400_naming_the_field(api_client, owner, data, field, words):
    response = api_client.post(URL, _body(**data), format="json")
    assert response.status_code == 400, response.json()
    error = response.json()["error"]
    assert error["code"] == "validation_error"
    assert words in error["fields"][field][0], error
    assert not Reservation.objects.exists()


def test_every_bad_field_is_named_at_once(api_client, owner):
    body = _body(name="x" * 121, container={"image": "x", "command": [1]})
    response = api_client.post(URL, body, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["fields"] == {
        "name": ["Ensure this field has no more than 120 characters."],
        "container.command.0": ["Not a valid string."],
    }


@pytest.mark.parametrize("slug", ["no-such-project", "theirs"])
def test_a_project_not_among_the_callers_is_a_404(api_client, owner, slug):
    project(owner=UserFactory(), slug="theirs")
    response = api_client.post(URL, _body(project=slug), format="json")
    assert response.status_code == 404
    assert response.json()["error"]["fields"] == {"project": ["No such project."]}
    assert not Reservation.objects.exists()


@pytest.mark.parametrize("body", [None, [], "text", {"project": 7}])
def test_a_body_that_is_not_a_booking_is_a_400(api_client, owner, body):
    response = api_client.post(URL, json.dumps(body), content_type="application/json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "validation_error"


def test_a_read_keeps_nothing_of_the_read_before_it(owner):
    """The serializer a thread reuses: a project given as already read for one request is not known to the
    next, whose caller cannot see it; nor are a valid read's values or an invalid one's errors kept."""
    mine = Project.objects.get()
    model = gpu_model()
    args = read_booking(_body(), projects=Project.objects.all(), project=mine, gpu_model=model)
    assert args["project"] == mine and args["spec"].gpu_model_id == model.pk
    with pytest.raises(serializers.ValidationError) as refused:
        read_booking(_body(), projects=Project.objects.none())
    assert refused.value.detail == {"project": [f"Object with slug={mine.slug} does not exist."]}
    with pytest.raises(serializers.ValidationError) as refused:
        read_booking(_body(name=""), projects=Project.objects.all())
    assert set(refused.value.detail) == {"name"}  # type: ignore[arg-type]
    again = read_booking(_body(name="second"), projects=Project.objects.all())
    assert again["name"] == "second" and again["project"] == mine


def test_the_answer_is_what_the_detail_serializer_gives(api_client):
    model = gpu_model()
    server(model, gpus=4)
    server(model, gpus=8)
    owner = UserFactory()
    proj = project(owner=owner)
    for spec in (GpuSpec(gpu_model_id=model.pk, whole_servers=1), GpuSpec(min_memory_mib=1000, gpu_count=3)):
        created = services.reservation_create(
            project=proj,
            name="job",
            spec=spec,
            window=window(hours=3),
            container=ContainerSpec(image="img:1", command=["run", " x "], env={"K": "v"}),
            actor=owner,
        )
        stored = Reservation.objects.get(pk=created.pk)
        assert _json(reservation_detail(created)) == _json(ReservationDetailSerializer(stored).data)
        services.reservation_cancel(reservation=stored, actor=owner, reason="")
    # Through the API too, by an operator who is not a member, and then read back.
    api_client.force_authenticate(OperatorFactory())
    start = timezone.now() + timedelta(days=2)
    body = {
        "project": proj.slug,
        "name": "api",
        "spec": {"gpu_model": model.name, "gpu_count": 2},
        "window": {"start": start.isoformat(), "end": (start + timedelta(hours=1)).isoformat()},
        "container": {"image": "img:2"},
    }
    response = api_client.post(URL, body, format="json")
    assert response.status_code == 201, response.json()
    again = api_client.get(f"{URL}{response.json()['id']}/")
    assert response.json() == again.json()
    assert response.json()["created_by"] == again.json()["created_by"] != owner.username
