"""A partitioned node does not run its job twice (DESIGN invariant 8).

A real agent (the Docker runtime, simulated GPUs) talks to the live control plane only through TCP proxies: its
heartbeats through one, the control plane's pushes through another. The test stops both, a partition: connections
refused, the open ones reset. The agent fences itself after its lease (notice, SIGTERM, SIGKILL after the grace),
before the control plane even calls its server offline; the control plane requeues the reservation on a second
agent's server only after the lease, the grace and the margin. Docker's own timestamps order it all: the old
container's State.FinishedAt before the follow-up's State.StartedAt. Healed, the agent reports the fenced stop and
starts nothing of the lost launch again.

Timeline (settings below): heartbeats every 1 s; lease 4 s; offline after 6 s; grace 2 s; margin 2 s; so the
requeue comes 8 s after the last heartbeat. Not shorter: an agent's loop waits for the engine to start a container
(up to MAX_START_WAIT_S), and on a loaded machine with the vfs storage driver that has taken 5 s, in which it
sends no heartbeat; a threshold below that would call the healthy server offline too.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from controlplane.dispatch.choices import LaunchState
from controlplane.dispatch.models import Launch, Requeue
from controlplane.fleet import services as fleet
from controlplane.inventory.choices import EventKind, ServerState
from controlplane.inventory.models import Server, ServerEvent
from controlplane.reservations import services as reservations
from controlplane.reservations.choices import ReservationState
from controlplane.reservations.models import Reservation
from controlplane.reservations.specs import ContainerSpec, GpuSpec, Window
from nodeagent.runtime.containers import LABEL_LAUNCH, LABEL_NODE, parse_docker_time
from nodeagent.runtime.localimage import DEFAULT_TAG, ensure_busybox_image
from tests.dispatch.test_end_to_end import eager_celery  # noqa: F401 - fixture
from tests.faults.partition_support import Beat, ProxiedAgent
from tests.reservations.fleet import project
from tests.runtime.support import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]

HEARTBEAT_S = 1.0
SETTINGS = {
    "FLEET_OFFLINE_AFTER_INTERVALS": 6,
    "FLEET_FENCE_AFTER_INTERVALS": 4,
    "DISPATCH_STOP_GRACE_S": 2,
    "FLEET_REQUEUE_MARGIN_S": 2.0,
    "DISPATCH_WARN_BEFORE_S": 0,
    "DISPATCH_REQUEUE_MIN_S": 5,
    # The detector's grace after its first pass (controlplane/fleet/nodeloss.py) would hold the partition's
    # detection for a minute; the beat here starts with the test, so there is no outage of ours to wait out.
    "FLEET_STARTUP_GRACE_S": 0,
}
# Says when warned (with the notice) and when told to stop, and does not stop: only the SIGKILL ends it.
JOB = [
    "sh",
    "-c",
    'echo started; trap \'echo "USR1 $(cat $GPUCP_WARN_FILE)"\' USR1; trap "echo TERM" TERM; '
    "while true; do sleep 0.1; done",
]


def containers(docker_client: Any, hostname: str) -> list[Any]:
    return docker_client.containers.list(all=True, filters={"label": f"{LABEL_NODE}={hostname}"})


def log_times(container: Any) -> dict[str, datetime]:
    """When each line was first written, as Docker stamped it."""
    seen: dict[str, datetime] = {}
    for line in container.logs(timestamps=True).decode().splitlines():
        stamp, _, text = line.partition(" ")
        moment = parse_docker_time(stamp)
        assert moment is not None
        seen.setdefault(text.split(" ", 1)[0], moment)
    return seen


@pytest.fixture
def fleet_of_two(transactional_db, live_server, docker_client, tmp_path: Path, eager_celery) -> Iterator[Any]:  # type: ignore[no-untyped-def]  # noqa: F811
    ensure_busybox_image(docker_client, DEFAULT_TAG)
    agents: list[ProxiedAgent] = []
    beat: Beat | None = None
    settings = override_settings(**SETTINGS)  # for the fixture too: the agents learn their lease while it waits
    settings.enable()
    try:
        for proxied in (True, False):
            hostname = f"part-{uuid.uuid4().hex[:8]}"
            _, token = fleet.join_token_create(actor=None, note="partition")
            agents.append(
                ProxiedAgent(
                    url=live_server.url,
                    docker_client=docker_client,
                    state=tmp_path / hostname,
                    hostname=hostname,
                    join_token=token,
                    proxied=proxied,
                )
            )
        hosts = [a.hostname for a in agents]
        wait_for(
            lambda: Server.objects.filter(hostname__in=hosts, gpus__isnull=False).distinct().count() == 2,
            timeout=30,
            what="enrollment and GPU discovery",
        )
        Server.objects.filter(hostname__in=hosts).update(heartbeat_interval_s=HEARTBEAT_S)
        # The first server alone is ready, so the booking lands there; the second one joins once it runs.
        Server.objects.filter(hostname=hosts[0]).update(state=ServerState.READY)
        Server.objects.filter(hostname=hosts[1]).update(state=ServerState.MAINTENANCE)
        wait_for(
            lambda: all(a.agent.lease_s == 4 * HEARTBEAT_S for a in agents),
            timeout=15,
            what="both agents holding the 4 s lease",
        )
        beat = Beat(lambda: fleet.detect_lost_servers())
        yield agents, beat
    finally:
        if beat is not None:
            beat.stop()
        for agent in agents:
            agent.stop()
            for container in containers(docker_client, agent.hostname):
                container.remove(force=True)
        settings.disable()


def test_a_partitioned_node_fences_itself_before_its_job_is_started_elsewhere(fleet_of_two, docker_client):
    (partitioned, survivor), beat = fleet_of_two
    proj = project()
    proj.requeue_on_interrupt = True
    proj.save(update_fields=["requeue_on_interrupt"])
    now = timezone.now()
    with transaction.atomic():
        r = reservations.reservation_create(
            project=proj,
            name="partition",
            spec=GpuSpec(min_memory_mib=1024, gpu_count=2),  # a whole server's worth: the follow-up needs the other
            window=Window(now, now + timedelta(seconds=90)),
            container=ContainerSpec(image=DEFAULT_TAG, command=JOB),
            actor=None,
            now=now,
        )
    wait_for(lambda: Reservation.objects.get(pk=r.pk).state == ReservationState.RUNNING, timeout=20, what="running")
    launch = Launch.objects.select_related("server").get(reservation=r)
    assert launch.server.hostname == partitioned.hostname
    [old] = containers(docker_client, partitioned.hostname)
    wait_for(lambda: b"started" in old.logs(), timeout=10, what="the job's traps")
    Server.objects.filter(hostname=survivor.hostname).update(state=ServerState.READY)

    partitioned.partition()

    follow_up = wait_for(
        lambda: Requeue.objects.filter(interrupted=r).select_related("follow_up").first(),
        timeout=30,
        what="the requeue",
    ).follow_up
    wait_for(
        lambda: Reservation.objects.get(pk=follow_up.pk).state == ReservationState.RUNNING,
        timeout=20,
        what="the follow-up running on the other server",
    )
    [new] = containers(docker_client, survivor.hostname)
    assert new.labels[LABEL_LAUNCH] == Launch.objects.get(reservation=follow_up).launch_id

    # Docker's own record. The old container is still there: a fenced node removes nothing until it reports.
    old.reload()
    new.reload()
    old_finished = parse_docker_time(old.attrs["State"]["FinishedAt"])
    new_started = parse_docker_time(new.attrs["State"]["StartedAt"])
    assert old.attrs["State"]["Status"] == "exited" and old.attrs["State"]["ExitCode"] == 137  # killed after grace
    assert old_finished is not None and new_started is not None
    assert old_finished < new_started, f"the old copy ended at {old_finished}, the new one started at {new_started}"

    # The notice, then SIGTERM, both before the control plane called the server offline; the SIGKILL a grace later.
    server = Server.objects.get(hostname=partitioned.hostname)
    offline = ServerEvent.objects.get(server=server, kind=EventKind.STATE, to_state=ServerState.OFFLINE)
    lines = log_times(old)
    assert "fenced: no reply from the control plane" in old.logs().decode()
    assert lines["USR1"] <= lines["TERM"] < offline.at
    assert old_finished - lines["TERM"] >= timedelta(seconds=SETTINGS["DISPATCH_STOP_GRACE_S"] - 0.1)
    interrupted = r.events.get(to_state=ReservationState.INTERRUPTED, from_state=ReservationState.RUNNING)
    assert old_finished < interrupted.at  # the requeue came after the old copy was gone
    last_heartbeat = datetime.fromisoformat(offline.data["last_heartbeat_at"])
    print(
        "\npartition timeline, seconds after the last heartbeat the control plane recorded: "
        f"SIGTERM (fence) {(lines['TERM'] - last_heartbeat).total_seconds():.2f}, "
        f"offline {(offline.at - last_heartbeat).total_seconds():.2f}, "
        f"old container gone {(old_finished - last_heartbeat).total_seconds():.2f}, "
        f"requeued {(interrupted.at - last_heartbeat).total_seconds():.2f}, "
        f"new container started {(new_started - last_heartbeat).total_seconds():.2f}"
    )

    partitioned.heal()

    # Back: the server returns to its state, the fenced stop is reported (it fills the lost launch's exit code and
    # log), the old container is removed, and nothing of the lost launch runs again anywhere.
    wait_for(
        lambda: Launch.objects.get(pk=launch.pk).exit_code == 137, timeout=20, what="the fenced stop to be reported"
    )
    lost = Launch.objects.get(pk=launch.pk)
    assert lost.state == LaunchState.LOST and "USR1" in lost.log_tail and "TERM" in lost.log_tail
    assert Server.objects.get(pk=server.pk).state == ServerState.READY
    wait_for(lambda: containers(docker_client, partitioned.hostname) == [], timeout=20, what="the fenced container")
    assert partitioned.agent.fenced is None
    assert Launch.objects.filter(reservation=r).count() == 1
    assert [c.labels[LABEL_LAUNCH] for c in containers(docker_client, survivor.hostname)] == [new.labels[LABEL_LAUNCH]]
    new.reload()
    assert new.attrs["State"]["Status"] == "running"
    assert beat.errors == []
