"""The image check at booking against a real OCI registry (Debian's docker-registry, htpasswd users): found, not
found, wrong credentials, no credentials, a registry stopped (accepted with a warning, remembered for a while);
and every log line of the control plane through a booking and a heartbeat, grepped for the values."""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from controlplane.reservations.models import Reservation
from controlplane.vault import registry, services
from tests.registry_support import start_registry
from tests.vault.test_vault_api import BOOKINGS, PASSWORD, SECRET_VALUE, World

pytestmark = pytest.mark.django_db


@pytest.fixture
def w(db: Any, settings: Any) -> World:
    settings.IMAGES_CHECK_AT_BOOKING = "verify"
    settings.IMAGES_CHECK_TIMEOUT_S = 3.0
    registry.forget()
    yield World()
    registry.forget()


def book(w: World, image: str) -> Any:
    return w.client(w.owner).post(BOOKINGS, w.body(image=image), format="json")


def creds(w: World, host: str, user: str, password: str) -> None:
    services.registry_set(project=w.project, registry=host, username=user, password=password, actor=w.owner)


def test_found_with_the_projects_credentials(w, oci_registry):
    creds(w, oci_registry.host, "reader", "reader-pw")
    res = book(w, f"{oci_registry.host}/team/trainer:v1")
    assert res.status_code == 201, res.content
    assert res.json()["warnings"] == []
    # By digest too.
    digest = oci_registry.pushed[f"{oci_registry.host}/team/trainer:v1"]
    assert book(w, f"{oci_registry.host}/team/trainer@{digest}").status_code == 201


def test_not_found_is_400_naming_container_image_with_the_registrys_words(w, oci_registry):
    creds(w, oci_registry.host, "reader", "reader-pw")
    res = book(w, f"{oci_registry.host}/team/trainer:v9")
    assert res.status_code == 400, res.content
    [message] = res.json()["error"]["fields"]["container.image"]
    assert "was not found" in message and "MANIFEST_UNKNOWN" in message
    res = book(w, f"{oci_registry.host}/team/nope:v1")
    assert res.status_code == 400 and "container.image" in res.json()["error"]["fields"]
    assert not Reservation.objects.exists()


def test_wrong_credentials_are_400_saying_so_without_the_password(w, oci_registry):
    creds(w, oci_registry.host, "reader", "wrong-" + PASSWORD)
    res = book(w, f"{oci_registry.host}/team/trainer:v1")
    assert res.status_code == 400, res.content
    [message] = res.json()["error"]["fields"]["container.image"]
    assert "refused the project's credentials" in message and "reader" in message
    assert PASSWORD not in res.content.decode()
    assert res.json()["error"]["code"] == "image_unauthorized"


def test_no_credentials_is_400_saying_the_project_has_none(w, oci_registry):
    res = book(w, f"{oci_registry.host}/team/trainer:v1")
    assert res.status_code == 400, res.content
    [message] = res.json()["error"]["fields"]["container.image"]
    assert f"the project has no credentials for {oci_registry.host}" in message


def test_a_registry_that_cannot_be_reached_accepts_with_a_warning_and_is_remembered(w, tmp_path):
    stopped = start_registry(tmp_path / "gone", {})
    host = stopped.host
    stopped.stop()
    started = time.monotonic()
    res = book(w, f"{host}/team/trainer:v1")
    assert res.status_code == 201, res.content
    [warning] = res.json()["warnings"]
    assert warning["code"] == "image_not_checked" and warning["registry"] == host
    assert "pre-pull" in warning["message"]
    assert time.monotonic() - started < 3.0 + 2
    # Remembered: the next booking does not ask again, and says so.
    res = book(w, f"{host}/team/trainer:v1")
    assert res.status_code == 201 and "a moment ago" in res.json()["warnings"][0]["message"]


def test_a_registry_without_auth_answers_found_and_not_found(w, tmp_path, docker_client):
    from nodeagent.runtime.localimage import DEFAULT_TAG

    open_registry = start_registry(tmp_path / "open", {})
    try:
        # Pushing needs no user on this one.
        open_registry.users = {"anyone": "x"}
        open_registry.push(docker_client, DEFAULT_TAG, "pub/img", "1")
        assert book(w, f"{open_registry.host}/pub/img:1").status_code == 201
        assert book(w, f"{open_registry.host}/pub/img:2").status_code == 400
    finally:
        open_registry.stop()


def test_syntax_mode_never_reaches_out(w, settings):
    settings.IMAGES_CHECK_AT_BOOKING = "syntax"
    # A public name: in "syntax" mode nothing is asked of any registry (the sandbox has no network).
    res = book(w, "nvcr.io/nvidia/pytorch:24.01-py3")
    assert res.status_code == 201 and res.json()["warnings"] == []


def test_no_log_line_holds_a_secret_or_a_password_through_booking_and_heartbeat(w, oci_registry, caplog):
    from rest_framework.test import APIClient

    from controlplane.inventory.models import Server
    from tests.fleet.helpers import enroll, gpu_facts, h100_model, heartbeat

    caplog.set_level(logging.DEBUG)
    for name in list(logging.root.manager.loggerDict):
        logging.getLogger(name).setLevel(logging.DEBUG)
    logging.getLogger().setLevel(logging.DEBUG)
    from controlplane.inventory.models import GpuModel
    from tests.fleet.helpers import H100

    # The world's GPUs are out of reach: the booking goes to the enrolled node, whose heartbeat then carries it.
    GpuModel.objects.filter(pk=w.model.pk).update(product_name=H100)
    Server.objects.filter(pk=w.server.pk).update(state="maintenance")
    h100_model()
    srv, credential = enroll("node-v")
    agent = APIClient()
    agent.credentials(HTTP_AUTHORIZATION=f"Bearer {credential}")
    body = heartbeat("node-v", gpus=gpu_facts("node-v", count=2))
    assert agent.post("/api/v1/agent/heartbeat", body, format="json").status_code == 200
    Server.objects.filter(pk=srv.pk).update(state="ready")

    owner = w.client(w.owner)
    res = owner.post(
        f"/api/v1/projects/{w.project.slug}/secrets/", {"name": "HF_TOKEN", "value": SECRET_VALUE}, format="json"
    )
    assert res.status_code == 201
    password = oci_registry.users["ci-pusher"]
    res = owner.post(
        f"/api/v1/projects/{w.project.slug}/registries/",
        {"registry": oci_registry.host, "username": "ci-pusher", "password": password},
        format="json",
    )
    assert res.status_code == 201
    booking = w.body(image=f"{oci_registry.host}/team/trainer:v1", secrets=[{"name": "HF_TOKEN", "file": True}])
    booking["spec"] = {"gpu_model": "H100-80GB", "gpu_count": 1}
    booking["window"] = {"start": "now", "duration": "10m"}
    res = owner.post(BOOKINGS, booking, format="json")
    assert res.status_code == 201, res.content
    later = heartbeat("node-v", seq=2, gpus=gpu_facts("node-v", count=2), start=timezone.now() + timedelta(seconds=1))
    reply = agent.post("/api/v1/agent/heartbeat", later, format="json")
    assert reply.status_code == 200, reply.content
    [desired] = reply.json()["desired"]
    # The agent gets them, inside the launch only.
    assert desired["registry_auth"]["password"] == password
    assert desired["secrets"] == [{"name": "HF_TOKEN", "value": SECRET_VALUE, "env": None, "file": True}]
    logged = "\n".join(f"{r.name} {r.getMessage()} {r.args!r} {r.exc_text or ''}" for r in caplog.records)
    assert caplog.records, "the test captured nothing"
    assert SECRET_VALUE not in logged and password not in logged
