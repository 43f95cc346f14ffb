"""What the volume tests share: a project with an owner, a member and a viewer, an outsider with a project of
their own, an operator, GPUs to book, and API clients signed in with real tokens."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.access.datasets import dataset_create
from controlplane.access.models import Volume
from controlplane.access.volumes import volume_create
from controlplane.reservations import services
from controlplane.reservations.models import Reservation
from controlplane.reservations.specs import ContainerSpec, MountRequest, Window
from tests.factories import ApiTokenFactory, OperatorFactory, UserFactory
from tests.reservations.fleet import gpu_model, project, server, spec

BOOKINGS = "/api/v1/reservations/"


class VolumeWorld:
    def __init__(self) -> None:
        self.owner: Any = UserFactory(username="olive")
        self.member: Any = UserFactory(username="tom")
        self.viewer: Any = UserFactory(username="vera")
        self.outsider: Any = UserFactory(username="oscar")
        self.operator: Any = OperatorFactory(username="opal")
        self.project = project(owner=self.owner, member=self.member, viewer=self.viewer, slug="atlas")
        self.other = project(owner=self.outsider, slug="zephyr")
        self.model = gpu_model()
        self.server = server(self.model, gpus=8)
        self.data = volume_create(project=self.project, name="data", size_limit_gib=10, actor=self.owner)
        self.foreign = volume_create(project=self.other, name="secret", size_limit_gib=5, actor=self.outsider)
        self.imagenet = dataset_create(name="imagenet", allowed_projects=[self.project], actor=self.operator)
        dataset_create(name="private", allowed_projects=[self.other], actor=self.operator)

    def client(self, user: Any) -> APIClient:
        client = APIClient()
        if user is not None:
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {ApiTokenFactory(user=user).plaintext}")
        return client

    def book(
        self,
        *mounts: MountRequest,
        start_in: timedelta = timedelta(hours=1),
        hours: float = 2,
        network: str = "none",
        actor: Any = None,
        now: datetime | None = None,
    ) -> Reservation:
        start = (now or timezone.now()) + start_in
        return services.reservation_create(
            project=self.project,
            name="job",
            spec=spec(self.model),
            window=Window(start, start + timedelta(hours=hours)),
            container=ContainerSpec(image="img:1", volumes=list(mounts), network=network),
            actor=actor or self.owner,
        )

    def body(self, *, start_in: timedelta = timedelta(hours=1), hours: float = 2, **container: Any) -> dict[str, Any]:
        start = timezone.now() + start_in
        return {
            "project": self.project.slug,
            "name": "job",
            "spec": {"gpu_model": self.model.name, "gpu_count": 1},
            "window": {"start": start.isoformat(), "end": (start + timedelta(hours=hours)).isoformat()},
            "container": {"image": "img:1", **container},
        }


def measured(volume: Volume, used_bytes: int, at: datetime | None = None) -> None:
    Volume.objects.filter(pk=volume.pk).update(used_bytes=used_bytes, measured_at=at or timezone.now())


def volume(name: str = "data") -> MountRequest:
    return MountRequest(kind="volume", name=name)
