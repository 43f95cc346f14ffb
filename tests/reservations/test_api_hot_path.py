"""POST /reservations reads a plainly valid request and writes its answer without the DRF serializers; both
give exactly what the serializers give, and anything else still goes through them."""

from __future__ import annotations

import json
import random
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.renderers import JSONRenderer

from controlplane.inventory.models import GpuModel
from controlplane.reservations import services
from controlplane.reservations.api.serializers import (
    ReservationCreateSerializer,
    ReservationDetailSerializer,
    booking_args,
    reservation_detail,
)
from controlplane.reservations.models import Reservation
from controlplane.reservations.specs import ContainerSpec, GpuSpec
from tests.factories import OperatorFactory, UserFactory
from tests.reservations.fleet import gpu_model, project, server, window

pytestmark = pytest.mark.django_db
URL = "/api/v1/reservations/"


def _json(data: Any) -> Any:
    return json.loads(JSONRenderer().render(data))


def _read(data: dict[str, Any], proj: Any) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(what the hot path reads, what the serializer reads) for one request body."""
    model_name = data.get("spec", {}).get("gpu_model") if isinstance(data.get("spec"), dict) else None
    model = GpuModel.objects.filter(name=model_name).first() if isinstance(model_name, str) else None
    fast = booking_args(data, project=proj, gpu_model_id=model.pk if model else None)
    serializer = ReservationCreateSerializer(data=data, projects=type(proj).objects.all())
    slow = serializer.to_domain() if serializer.is_valid() else None
    return fast, slow


def _variants(rng: random.Random, proj: Any) -> dict[str, Any]:
    """A request body with each part drawn mostly from valid values, else from invalid ones of every kind."""
    start = timezone.now() + timedelta(minutes=rng.choice([1, 90]))
    end = start + timedelta(hours=2)
    berlin = timezone.get_fixed_timezone(120)
    iso = [
        start.isoformat(),
        start.isoformat().replace("+00:00", "Z"),
        start.astimezone(berlin).isoformat(timespec="minutes"),
        "now",
    ]

    def pick(valid: list[Any], invalid: list[Any]) -> Any:
        return rng.choice(valid if rng.random() < 0.9 else invalid)

    spec = rng.choice(
        [
            {"gpu_model": "H100-80GB", "gpu_count": pick([1, 2, 4096], [0, 4097, "2", 2.0, True, None])},
            {"min_memory_mib": pick([1, 1000], [0, "1000", True]), "whole_servers": pick([1, 512], [513, -1])},
            {"gpu_model": pick(["H100-80GB"], ["NOPE", 7, None]), "min_memory_mib": None, "gpu_count": 1},
            {"gpu_model": "H100-80GB", "min_memory_mib": 1000, "gpu_count": 1},
            {"gpu_model": "H100-80GB", "gpu_count": 1, "whole_servers": 1},
        ]
    )
    body: dict[str, Any] = {
        "project": proj.slug,
        "name": pick(["train", "  padded  ", "x" * 120, "tab\there"], ["", "   ", "x" * 121, 5, None, "a\x00b"]),
        "spec": spec,
        "window": {
            "start": pick(
                [*iso, " NOW "], ["yesterday", 12, None, "2020-01-01T00:00:00Z", start.strftime("%Y-%m-%dT%H:%M")]
            ),
            "end": pick([end.isoformat()], ["2020-01-01T00:00:00Z", "", None, start.isoformat()]),
        },
        "container": {
            "image": pick(["registry/x:1", " registry/x:1 ", "y" * 512], ["", "y" * 513, None, 3]),
            "command": pick(
                [["python", "t.py"], [], [" keep "], [""], ["x" * 4096]],
                [["a\x00"], ["\ud800"], "python", [1], ["x"] * 257, ["x" * 4097]],
            ),
            "env": pick(
                [{"A": "1"}, {}, {"A": ""}, {"A": " spaced "}, {"_a1": "1"}, {"A": "v" * 8192}],
                [{"A": 1}, ["A=1"], None, {"A": "\x00"}, {"A=B": "1"}, {"": "1"}, {"1A": "1"}, {"A": "v" * 8193}],
            ),
        },
    }
    for part in ("window", "container"):
        for key in list(body[part]):
            if rng.random() < 0.05:
                del body[part][key]
    if rng.random() < 0.02:
        body["spec"] = "H100-80GB"
    return body


def test_the_hot_path_reads_requests_as_the_serializer_does_or_leaves_them_to_it():
    gpu_model()
    proj = project(owner=UserFactory())
    rng = random.Random(3)
    accepted = refused = 0
    for _ in range(600):
        data = _variants(rng, proj)
        fast, slow = _read(data, proj)
        if fast is None:
            refused += 1
            continue
        accepted += 1
        # Accepted only what the serializer accepts, read to the same values ("now" aside: two clocks).
        assert slow is not None, data
        if str(data["window"].get("start")).strip().lower() == "now":
            assert abs(fast["window"].starts_at - slow["window"].starts_at) < timedelta(seconds=5)
            fast["window"], slow["window"] = fast["window"].ends_at, slow["window"].ends_at
        assert fast == slow, data
    assert accepted > 100 and refused > 100


def test_an_invalid_request_gets_the_serializers_error(api_client):
    owner = UserFactory()
    proj = project(owner=owner)
    gpu_model()
    api_client.force_authenticate(owner)
    start = timezone.now() + timedelta(hours=1)
    body = {
        "project": proj.slug,
        "name": "x" * 121,
        "spec": {"gpu_model": "H100-80GB", "gpu_count": 2},
        "window": {"start": start.isoformat(), "end": (start + timedelta(hours=1)).isoformat()},
        "container": {"image": "x", "command": [1]},
    }
    response = api_client.post(URL, body, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["fields"] == {
        "name": ["Ensure this field has no more than 120 characters."],
        "container.command.0": ["Not a valid string."],
    }
    assert not Reservation.objects.exists()


@pytest.mark.parametrize("whole", [False, True])
def test_the_booking_answer_is_what_the_detail_serializer_gives(api_client, whole):
    model = gpu_model()
    server(model, gpus=4)
    server(model, gpus=8)
    owner = UserFactory()
    proj = project(owner=owner)
    spec = GpuSpec(gpu_model_id=model.pk, whole_servers=1) if whole else GpuSpec(min_memory_mib=1000, gpu_count=3)
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
