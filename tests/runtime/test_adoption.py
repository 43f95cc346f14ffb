"""A restarted agent adopts what runs, never launches twice, and cleans up only after reporting."""

from __future__ import annotations

from datetime import timedelta

import pytest

from .support import T0, logs_of, ours, status_of, wait_for

pytestmark = pytest.mark.docker

RECORDER = 'echo started; trap "echo USR1" USR1; trap "echo TERM; exit 0" TERM; while :; do sleep 0.1; done'


def test_restarted_runtime_adopts_the_running_container_and_its_warning(
    make_runtime, make_desired, docker_client, node
):  # type: ignore[no-untyped-def]
    end = T0 + timedelta(minutes=10)
    spec = make_desired(command=["sh", "-c", RECORDER], window_end=end, warn_before_s=120)
    before = make_runtime()
    before.reconcile([spec], [], T0)
    [container] = ours(docker_client, node)
    wait_for(lambda: "started" in logs_of(container), what="the job's traps")
    before.reconcile([spec], [], end - timedelta(seconds=100))
    wait_for(lambda: "USR1" in logs_of(container), what="the warning")
    started_at = container.attrs["State"]["StartedAt"]

    after = make_runtime()  # the agent restarted: same engine, same state directory
    assert after.busy_gpus() == set(spec.gpu_uuids)
    after.reconcile([spec], [], end - timedelta(seconds=50))

    [same] = ours(docker_client, node)
    assert same.id == container.id
    assert status_of(same) == "running"
    assert same.attrs["State"]["StartedAt"] == started_at  # not restarted
    assert logs_of(same).count("USR1") == 1  # the warning is not sent twice
    [report] = after.report()
    assert report.state == "running" and report.container_id == container.id

    after.reconcile([spec], [], end)
    wait_for(lambda: status_of(same) == "exited", what="the stop at the window's end")
    assert logs_of(same).splitlines() == ["started", "USR1", "TERM"]


def test_restarted_runtime_keeps_the_kill_deadline_of_a_stop_in_progress(
    make_runtime, make_desired, docker_client, node
):  # type: ignore[no-untyped-def]
    spec = make_desired(
        command=["sh", "-c", 'echo started; trap "" TERM; while :; do sleep 0.1; done'], stop_grace_s=30
    )
    before = make_runtime()
    before.reconcile([spec], [], T0)
    [container] = ours(docker_client, node)
    wait_for(lambda: "started" in logs_of(container), what="the job's trap")
    before.reconcile([], [], T0 + timedelta(seconds=1))  # SIGTERM, kill due at +31 s

    after = make_runtime()
    after.reconcile([], [], T0 + timedelta(seconds=20))
    assert status_of(container) == "running"
    assert [r.state for r in after.report()] == ["stopping"]

    after.reconcile([], [], T0 + timedelta(seconds=31))
    wait_for(lambda: status_of(container) == "exited", what="SIGKILL at the adopted deadline")
    assert container.attrs["State"]["ExitCode"] == 137


def test_finished_container_is_removed_after_two_reports_and_never_relaunched(
    make_runtime, make_desired, docker_client, node
):  # type: ignore[no-untyped-def]
    spec = make_desired(command=["sh", "-c", "echo done early; exit 0"])
    runtime = make_runtime()
    runtime.reconcile([spec], [], T0)
    [container] = ours(docker_client, node)
    wait_for(lambda: status_of(container) == "exited", what="the job to finish")

    first = runtime.report()
    runtime.reconcile([spec], [], T0 + timedelta(seconds=1))
    assert len(ours(docker_client, node)) == 1  # reported once: kept
    second = runtime.report()
    runtime.reconcile([spec], [], T0 + timedelta(seconds=2))

    assert ours(docker_client, node) == []  # reported twice: removed
    assert [r.state for r in first] == [r.state for r in second] == ["exited"]
    # Still in its window and still desired, but it ran: the final report stands in for it, no second run.
    [third] = runtime.report()
    assert third.state == "exited" and third.container_id == container.id
    assert "done early" in third.log_tail

    restarted = make_runtime()
    restarted.reconcile([spec], [], T0 + timedelta(seconds=3))
    assert ours(docker_client, node) == []
    assert [r.state for r in restarted.report()] == ["exited"]

    # Once the control plane lets go of it, the launch is forgotten.
    restarted.reconcile([], [], T0 + timedelta(seconds=4))
    assert restarted.report() == []
    assert list(restarted.launch_root.iterdir()) == []


def test_failed_launch_is_not_retried_after_a_restart(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    spec = make_desired(image="127.0.0.1:9/gpucp/no-such-image:2")  # nothing listens there: the pull fails
    runtime = make_runtime()
    for _ in range(3):
        runtime.reconcile([spec], [], T0)
        runtime.wait_idle(30)
    [report] = runtime.report()
    assert report.state == "failed"

    docker_client.images.get("gpucp-busybox:test").tag("127.0.0.1:9/gpucp/no-such-image", "2")
    try:
        restarted = make_runtime()
        restarted.reconcile([spec], [], T0 + timedelta(seconds=1))
        restarted.wait_idle(30)
        assert ours(docker_client, node) == []
        [again] = restarted.report()
        assert again.error == report.error
    finally:
        docker_client.images.remove("127.0.0.1:9/gpucp/no-such-image:2")


def test_container_removed_behind_the_agents_back_is_reported_missing_not_relaunched(
    make_runtime, make_desired, docker_client, node
):  # type: ignore[no-untyped-def]
    spec = make_desired()
    runtime = make_runtime()
    runtime.reconcile([spec], [], T0)
    [container] = ours(docker_client, node)

    container.remove(force=True)
    runtime.reconcile([spec], [], T0 + timedelta(seconds=1))

    assert ours(docker_client, node) == []
    [report] = runtime.report()
    assert report.state == "missing"
    assert runtime.busy_gpus() == set()


def test_agents_sharing_an_engine_leave_each_others_containers_alone(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    mine = make_runtime()
    other = make_runtime(node=f"{node}-other")
    try:
        mine.reconcile([make_desired(launch_id="mine")], [], T0)
        other.reconcile([make_desired(launch_id="theirs")], [], T0)

        mine.reconcile([], [], T0 + timedelta(seconds=1))  # mine stops its own, and only its own

        theirs = docker_client.containers.get("gpucp-theirs")
        assert status_of(theirs) == "running"
        assert [r.launch_id for r in other.report()] == ["theirs"]
    finally:
        for c in ours(docker_client, f"{node}-other"):
            c.remove(force=True)


def test_engine_outage_keeps_the_last_report_and_says_so_in_the_facts(make_runtime, make_desired, docker_client):  # type: ignore[no-untyped-def]
    import docker

    runtime = make_runtime()
    spec = make_desired()
    runtime.reconcile([spec], [], T0)
    [before] = runtime.report()

    unreachable = docker.DockerClient(base_url="unix:///nonexistent/docker.sock", version="1.41", timeout=2)
    runtime.client = unreachable
    runtime._version = None
    for launch in runtime._launches.values():
        launch.container.client = unreachable

    [during] = runtime.report()
    assert during.state == before.state == "running"
    assert during.container_id == before.container_id
    facts = runtime.facts()
    assert facts.gpu_mode == "none"
    assert facts.detail.startswith("the Docker engine is not reachable")
