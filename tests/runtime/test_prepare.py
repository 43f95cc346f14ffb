"""Launch latency: a container is created ahead of its window and only started when the window opens."""

from __future__ import annotations

import threading
from datetime import timedelta

from nodeagent.runtime.containers import LABEL_LAUNCH

from .support import T0, ours, status_of, wait_for


def test_a_launch_sent_ahead_is_created_before_its_window_and_started_at_it(
    make_runtime, make_desired, docker_client, node
):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    woken = threading.Event()
    runtime.set_waker(woken.set)
    spec = make_desired(launch_id="ahead")

    runtime.reconcile([spec], [], T0 - timedelta(seconds=2))  # what DISPATCH_LEAD_S sends early
    assert woken.wait(30), "the runtime never said its background create finished"
    [container] = ours(docker_client, node)
    assert status_of(container) == "created"  # exists, but runs nothing before the window
    runtime.reconcile([spec], [], T0 - timedelta(seconds=1))
    [report] = runtime.report()
    assert (report.state, report.started_at) == ("pending", None)
    assert runtime.busy_gpus() == set()

    runtime.reconcile([spec], [], T0)

    assert [c.id for c in ours(docker_client, node)] == [container.id]  # the same container, now started
    assert status_of(container) == "running"
    [report] = runtime.report()
    assert (report.state, report.container_id) == ("running", container.id)
    assert report.started_at is not None


def test_a_window_far_ahead_is_not_prepared_yet(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime(prepare_ahead_s=5)
    runtime.reconcile([make_desired(window_start=T0 + timedelta(seconds=6))], [], T0)
    assert ours(docker_client, node) == []
    assert [r.state for r in runtime.report()] == ["pending"]


def test_a_prepared_launch_dropped_before_its_window_is_removed_unstarted(
    make_runtime, make_desired, docker_client, node
):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    spec = make_desired(launch_id="dropped")
    runtime.reconcile([spec], [], T0 - timedelta(seconds=2))
    assert runtime.wait_idle(30)
    runtime.reconcile([spec], [], T0 - timedelta(seconds=1))
    assert len(ours(docker_client, node)) == 1

    runtime.reconcile([], [], T0 - timedelta(milliseconds=500))  # cancelled before the window

    wait_for(lambda: ours(docker_client, node) == [], what="the unstarted container to go")


def test_launches_opening_together_start_in_parallel_earliest_window_first(
    make_runtime, make_desired, docker_client, node
):  # type: ignore[no-untyped-def]
    runtime = make_runtime(workers=4)
    specs = [make_desired(launch_id=f"batch-{i}", gpu_uuids=[f"GPU-batch-{i}"]) for i in range(4)]
    later = make_desired(launch_id="later", gpu_uuids=["GPU-later"], window_start=T0 + timedelta(seconds=1))
    runtime.reconcile([later, *specs], [], T0 - timedelta(seconds=2))
    assert runtime.wait_idle(60)

    runtime.reconcile([later, *specs], [], T0)

    running = {c.labels[LABEL_LAUNCH] for c in ours(docker_client, node) if status_of(c) == "running"}
    assert running == {f"batch-{i}" for i in range(4)}  # "later" waits for its own window
    runtime.reconcile([later, *specs], [], T0 + timedelta(seconds=1))
    assert {r.launch_id: r.state for r in runtime.report()}["later"] == "running"
