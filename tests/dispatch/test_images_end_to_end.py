"""Bring your own image, the whole road: a project's private image on a real OCI registry, its credentials and a
secret in the vault, a booking ahead of its window -> the agent pulls it before the window (told by the heartbeat)
-> the container starts at the window from the image on the node, with the secret as a variable and a file -> the
digest that ran is on the launch. Wrong credentials are told to the tenant before the window. Neither the secret
nor the registry password appears in an API answer, an event, a notification or a control-plane log line.

The agent is the real one (tests/dispatch/test_end_to_end.py's ``agent_node``), against pytest-django's live server.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.dispatch.models import ImagePull, Launch
from controlplane.notifications.choices import EventType
from controlplane.notifications.models import Event
from controlplane.reservations import services as reservations
from controlplane.reservations.choices import ReservationState
from controlplane.reservations.models import Reservation, ReservationEvent
from controlplane.reservations.specs import ContainerSpec, GpuSpec, SecretRequest, Window
from controlplane.vault import services as vault
from tests.dispatch.test_end_to_end import agent_node, eager_celery, wait_for  # noqa: F401 - fixtures
from tests.reservations.fleet import project

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]
# Celery runs eagerly here, and an eager task ignores its ETA: with no horizon, a window ahead is opened by the
# heartbeat when it is due (as the beat would), not by the booking's scheduled task at once.
NO_ETA = override_settings(DISPATCH_ETA_HORIZON_S=0)

SECRET = "hf_e2e-secret-value-7f3a9c"
WRONG_PASSWORD = "not-the-readers-password-41"
# Prints digests of the secret as a variable and as a file (never the value itself: the log tail is an API answer).
JOB = [
    "sh",
    "-c",
    'echo "env=$(printf %s "$HF_TOKEN" | md5sum | cut -c1-32)"; '
    'echo "file=$(md5sum < /run/secrets/HF_TOKEN | cut -c1-32)"; '
    'trap "exit 0" TERM; while true; do sleep 0.1; done',
]


def book_ahead(proj: Any, image: str, *, start_in: float, seconds: float = 30.0) -> Reservation:
    now = timezone.now()
    with transaction.atomic():
        return reservations.reservation_create(
            project=proj,
            name="byo-image",
            spec=GpuSpec(min_memory_mib=1024, gpu_count=1),
            window=Window(now + timedelta(seconds=start_in), now + timedelta(seconds=start_in + seconds)),
            container=ContainerSpec(
                image=image, command=JOB, secrets=[SecretRequest.of("HF_TOKEN", env="HF_TOKEN", file=True)]
            ),
            actor=None,
            now=now,
        )


def forget_image(docker_client: Any, reference: str) -> None:
    from docker.errors import ImageNotFound

    try:
        docker_client.images.remove(reference, force=True)
    except ImageNotFound:
        pass


@NO_ETA
@override_settings(DISPATCH_WARN_BEFORE_S=0, DISPATCH_STOP_GRACE_S=2)
def test_a_private_image_is_pulled_before_its_window_and_starts_at_it_with_its_secret(
    agent_node: dict[str, Any],  # noqa: F811
    docker_client: Any,
    oci_registry: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    image = f"{oci_registry.host}/team/trainer:v1"
    forget_image(docker_client, image)
    from django.contrib.auth import get_user_model

    owner = get_user_model().objects.create_user("byo-owner", password="x")
    proj = project(owner=owner)
    vault.registry_set(
        project=proj, registry=oci_registry.host, username="reader", password=oci_registry.users["reader"], actor=owner
    )
    vault.secret_set(project=proj, name="HF_TOKEN", value=SECRET, actor=owner)
    r = book_ahead(proj, image, start_in=25)

    # Told by a heartbeat, the agent pulls it ahead: the image is on the node before the window opens.
    pull = wait_for(
        lambda: ImagePull.objects.filter(reservation=r, state=ImagePull.State.PRESENT).first(),
        timeout=30,
        what="the pre-pull",
    )
    assert pull.reported_at < r.starts_at
    assert pull.digest == oci_registry.pushed[image]
    assert docker_client.images.get(image) is not None
    wait_for(
        lambda: any(
            "image" in e.data and e.data["image"]["state"] == "present"
            for e in ReservationEvent.objects.filter(reservation=r)  # r's own events are those of its booking
        ),
        what="the pull's event",
    )

    # The container starts when the window opens (never before), from the image already on the node: how soon after
    # the opening is bench/images.py's figure, not a test's.
    launch = wait_for(
        lambda: Launch.objects.filter(reservation=r, started_at__isnull=False).first(), timeout=40, what="the start"
    )
    assert launch.started_at >= r.starts_at - timedelta(seconds=0.5)  # the agent's clock against ours
    assert ImagePull.objects.filter(reservation=r).count() == 1  # pulled once, ahead
    assert launch.image_digest == oci_registry.pushed[image]
    wait_for(lambda: Reservation.objects.get(pk=r.pk).state == ReservationState.RUNNING, what="running")
    digest = hashlib.md5(SECRET.encode()).hexdigest()  # noqa: S324 - a fingerprint the job prints, not security
    [container] = docker_client.containers.list(all=True, filters={"label": f"gpucp.launch_id={launch.launch_id}"})
    wait_for(lambda: f"file={digest}" in container.logs().decode(), timeout=10, what="the job's output")
    output = container.logs().decode()
    assert f"env={digest}" in output and f"file={digest}" in output

    # Nowhere the control plane speaks: API answers, events, notifications, its logs.
    api = APIClient()
    api.force_authenticate(owner)
    answers = [
        api.get(f"/api/v1/reservations/{r.public_id}/").content,
        api.get(f"/api/v1/reservations/{r.public_id}/launches/").content,
        api.get(f"/api/v1/reservations/{r.public_id}/images/").content,
        api.get(f"/api/v1/projects/{proj.slug}/secrets/").content,
        api.get(f"/api/v1/projects/{proj.slug}/registries/").content,
        api.get("/api/v1/notifications/").content,
    ]
    password = oci_registry.users["reader"]
    for body in answers:
        assert SECRET.encode() not in body and password.encode() not in body
    for event in ReservationEvent.objects.filter(reservation=r):
        assert SECRET not in str(event.data) + event.reason and password not in str(event.data) + event.reason
    for note in Event.objects.filter(project=proj):
        assert SECRET not in str(note.payload) and password not in str(note.payload)
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert SECRET not in logged and password not in logged
    reservations.reservation_release(reservation=r, actor=None, reason="done")


@NO_ETA
def test_wrong_registry_credentials_are_told_before_the_window(
    agent_node: dict[str, Any],  # noqa: F811
    docker_client: Any,
    oci_registry: Any,
) -> None:
    image = f"{oci_registry.host}/team/trainer:v1"
    forget_image(docker_client, image)
    proj = project()
    vault.registry_set(project=proj, registry=oci_registry.host, username="reader", password=WRONG_PASSWORD, actor=None)
    vault.secret_set(project=proj, name="HF_TOKEN", value=SECRET, actor=None)
    r = book_ahead(proj, image, start_in=120)
    failed = wait_for(
        lambda: ImagePull.objects.filter(reservation=r, state=ImagePull.State.FAILED).first(),
        timeout=30,
        what="the failed pre-pull",
    )
    assert failed.reported_at < r.starts_at
    assert "unauthorized" in failed.error.lower()
    assert WRONG_PASSWORD not in failed.error
    [note] = Event.objects.filter(type=EventType.IMAGE_FAILED, reservation=r)
    assert "unauthorized" in note.payload["error"].lower() and note.occurred_at < r.starts_at
    reservations.reservation_cancel(reservation=r, actor=None, reason="fixing the credentials")
