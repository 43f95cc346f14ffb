"""Images ahead of their windows, the control plane's side (controlplane/dispatch/images.py): what each server is
told to pre-pull, what its agent's image reports become (rows, events, a notification on failure), and what a
launch records of its own pull, digest and out-of-memory end."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from controlplane.dispatch import images, reports
from controlplane.dispatch.models import ImagePull, Launch
from controlplane.notifications.choices import EventType
from controlplane.notifications.models import Event
from nodeagent import schema
from tests.dispatch.support import book, report
from tests.dispatch.test_services import opened
from tests.factories import UserFactory
from tests.reservations.fleet import gpu_model, project, server

pytestmark = pytest.mark.django_db

IMAGE = "gpucp-busybox:test"


def image_report(reservations: list[str], state: str, **fields: object) -> schema.ImageReport:
    return schema.ImageReport(
        image=IMAGE, state=state, reservations=reservations, at=fields.pop("at", timezone.now()), **fields
    )


@override_settings(IMAGES_PREPULL_LEAD_S=1800)
def test_a_server_is_told_the_images_of_its_windows_opening_within_the_lead() -> None:
    h100 = gpu_model()
    srv, other = server(h100, gpus=2), server(h100, gpus=2)
    proj = project()
    now = timezone.now()
    soon = book(proj, h100, count=2, start_in=600, now=now)
    also_soon = book(proj, h100, count=2, start_in=900, now=now)
    later = book(proj, h100, count=2, start_in=3 * 3600, now=now)
    placed = {r.pk: r.allocations.first().gpu.server_id for r in (soon, also_soon, later)}
    for srv_ in (srv, other):
        pulls = images.prepull_for(server=srv_, now=now)
        expected = sorted(str(r.public_id) for r in (soon, also_soon) if placed[r.pk] == srv_.pk)
        if not expected:
            assert pulls == []
            continue
        [pull] = pulls  # one image of one project: one entry naming both reservations
        assert pull.image == IMAGE and sorted(pull.reservations) == expected
        assert pull.registry_auth is None
        assert pull.needed_at == min(r.starts_at for r in (soon, also_soon) if placed[r.pk] == srv_.pk)
    # Past the lead, the later window is in its server's answer too.
    host = srv if placed[later.pk] == srv.pk else other
    later_pulls = images.prepull_for(server=host, now=now + timedelta(hours=3) - timedelta(minutes=5))
    assert any(str(later.public_id) in p.reservations for p in later_pulls)


def test_each_project_pulls_with_its_own_credentials(django_assert_max_num_queries) -> None:  # type: ignore[no-untyped-def]
    from controlplane.vault import services as vault

    h100 = gpu_model()
    srv = server(h100, gpus=2)
    a, b = project(), project()
    now = timezone.now()
    ra = book(a, h100, count=1, start_in=300, now=now)
    rb = book(b, h100, count=1, start_in=300, now=now)
    vault.registry_set(project=a, registry="docker.io", username="a-bot", password="a-secret", actor=None)
    with django_assert_max_num_queries(2):  # the reservations, then every project's credentials at once
        pulls = {tuple(p.reservations): p for p in images.prepull_for(server=srv, now=now)}
    auth = pulls[(str(ra.public_id),)].registry_auth
    assert auth is not None and (auth.registry, auth.username, auth.password) == ("docker.io", "a-bot", "a-secret")
    assert pulls[(str(rb.public_id),)].registry_auth is None
    assert "a-secret" not in repr(pulls)


def test_image_reports_become_events_and_a_failure_notifies_before_the_window() -> None:
    h100 = gpu_model()
    srv = server(h100, gpus=1)
    owner = UserFactory()
    r = book(project(owner=owner), h100, start_in=1200, user=owner)
    rid = [str(r.public_id)]
    t = timezone.now()
    progress = schema.PullProgress(layers_done=1, layers_total=3, bytes_done=10, bytes_total=100, seconds=1.5)
    images.images_reported(server=srv, reports=[image_report(rid, "pulling", progress=progress, at=t)], now=t)
    # Repeated until answered: the same state again writes no second event.
    images.images_reported(server=srv, reports=[image_report(rid, "pulling", progress=progress, at=t)], now=t)
    pull = ImagePull.objects.get(reservation=r)
    assert (pull.state, pull.progress["layers_done"], pull.server_id) == ("pulling", 1, srv.pk)
    failed = image_report(rid, "failed", error="unauthorized: authentication required", at=t + timedelta(seconds=2))
    images.images_reported(server=srv, reports=[failed], now=t)
    # An older report arriving late changes nothing.
    images.images_reported(server=srv, reports=[image_report(rid, "pulling", at=t)], now=t)
    pull.refresh_from_db()
    assert (pull.state, pull.error) == ("failed", "unauthorized: authentication required")
    notes = [e for e in r.events.order_by("id") if "image" in e.data]
    assert [e.data["image"]["state"] for e in notes] == ["pulling", "failed"]
    assert "unauthorized" in notes[-1].reason and srv.hostname in notes[-1].reason
    [event] = Event.objects.filter(type=EventType.IMAGE_FAILED, reservation=r)
    assert event.payload["image"] == IMAGE and "unauthorized" in event.payload["error"]
    assert event.occurred_at < r.starts_at
    # The agent retries and succeeds: the row and the trail say so.
    done = image_report(
        rid,
        "present",
        digest="sha256:" + "b" * 64,
        size_bytes=52_000_000,
        progress=schema.PullProgress(layers_done=3, layers_total=3, bytes_done=100, bytes_total=100, seconds=4.2),
        at=t + timedelta(seconds=9),
    )
    images.images_reported(server=srv, reports=[done], now=t)
    pull.refresh_from_db()
    assert (pull.state, pull.digest, pull.size_bytes) == ("present", "sha256:" + "b" * 64, 52_000_000)
    last = r.events.order_by("id").last()
    assert "4.2 s" in last.reason and "52.0 MB" in last.reason and "3 layers" in last.reason


def test_an_agent_cannot_report_images_for_another_servers_reservation() -> None:
    h100 = gpu_model()
    srv, intruder = server(h100, gpus=1), server(h100, gpus=1)
    r = book(project(), h100, start_in=600)
    other = intruder if r.allocations.first().gpu.server_id == srv.pk else srv
    images.images_reported(
        server=other,
        reports=[image_report([str(r.public_id), "not-a-uuid"], "failed", error="no space left on device")],
        now=timezone.now(),
    )
    assert not ImagePull.objects.exists()
    assert not Event.objects.filter(type=EventType.IMAGE_FAILED).exists()


def test_a_launch_records_its_pull_its_digest_and_an_out_of_memory_end() -> None:
    h100 = gpu_model()
    srv = server(h100, gpus=1)
    r = book(project(), h100)
    [launch] = opened(r)
    now = timezone.now()
    progress = schema.PullProgress(layers_done=2, layers_total=5, bytes_done=1 << 20, bytes_total=5 << 20, seconds=3)
    reports.containers_reported(server=srv, reports=[report(launch, "creating", pull=progress)], now=now)
    launch.refresh_from_db()
    assert launch.pull == progress.model_dump(mode="json")
    digest = "sha256:" + "c" * 64
    reports.containers_reported(
        server=srv, reports=[report(launch, "running", started_at=now, image_digest=digest)], now=now
    )
    launch.refresh_from_db()
    assert (launch.state, launch.image_digest, launch.pull) == ("running", digest, None)
    reports.containers_reported(
        server=srv,
        reports=[
            report(
                launch,
                "exited",
                started_at=now,
                finished_at=now + timedelta(seconds=5),
                exit_code=137,
                oom_killed=True,
                error="out of memory: the container went over its memory limit of 512 MiB and was killed",
                image_digest=digest,
            )
        ],
        now=now + timedelta(seconds=5),
    )
    launch = Launch.objects.get(pk=launch.pk)
    assert launch.oom_killed is True and launch.error.startswith("out of memory")
    r.refresh_from_db()
    assert r.state == "failed"
    assert any("out of memory" in e.reason for e in r.events.all())


def test_the_api_shows_pulls_and_launch_digests_to_the_project_only(api_client) -> None:  # type: ignore[no-untyped-def]
    h100 = gpu_model()
    srv = server(h100, gpus=1)
    owner, stranger = UserFactory(), UserFactory()
    r = book(project(owner=owner), h100, start_in=600, user=owner)
    images.images_reported(
        server=srv,
        reports=[image_report([str(r.public_id)], "present", digest="sha256:" + "d" * 64, size_bytes=10)],
        now=timezone.now(),
    )
    api_client.force_authenticate(owner)
    answer = api_client.get(f"/api/v1/reservations/{r.public_id}/images/")
    assert answer.status_code == 200, answer.content
    [row] = answer.json()["results"] if isinstance(answer.json(), dict) else answer.json()
    assert (row["server"], row["state"], row["digest"]) == (srv.hostname, "present", "sha256:" + "d" * 64)
    api_client.force_authenticate(stranger)
    assert api_client.get(f"/api/v1/reservations/{r.public_id}/images/").status_code == 404


def test_the_heartbeat_of_an_agent_that_pulls_carries_the_pre_pulls_and_takes_its_reports() -> None:
    from controlplane.inventory.choices import ServerState
    from controlplane.inventory.models import Server
    from tests.fleet.helpers import enroll, h100_model, heartbeat, ingest

    srv, _ = enroll("pull-node")
    now = timezone.now()
    ingest(srv, heartbeat("pull-node", start=now))
    Server.objects.filter(pk=srv.pk).update(state=ServerState.READY)
    r = book(project(), h100_model(), count=2, start_in=900)
    # An older agent (no ``pulls`` in its facts) is never sent the field it would refuse.
    old = ingest(srv, heartbeat("pull-node", seq=2, start=now))
    assert old.prepull == [] and "prepull" not in old.model_dump(mode="json")
    body = heartbeat("pull-node", seq=3, start=now)
    body["node"]["pulls"] = True
    reply = ingest(srv, body)
    [pull] = reply.prepull
    assert pull.image == IMAGE and pull.reservations == [str(r.public_id)]
    body = heartbeat("pull-node", seq=4, start=now)
    body["node"]["pulls"] = True
    body["images"] = [image_report([str(r.public_id)], "failed", error="manifest unknown").model_dump(mode="json")]
    ingest(srv, body)
    assert ImagePull.objects.get(reservation=r).error == "manifest unknown"
    assert Event.objects.filter(type=EventType.IMAGE_FAILED, reservation=r).count() == 1
