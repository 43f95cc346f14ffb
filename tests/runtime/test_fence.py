"""Fencing on a real engine: the node lost the control plane for its lease, so the runtime stops every running
container as at the end of a window (notice, SIGTERM, SIGKILL after the grace), starts nothing and removes nothing
until the control plane answers, and reports each stop as fenced, also after a restart."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from nodeagent.runtime.containers import LABEL_LAUNCH

from .support import T0, logs_of, ours, status_of, wait_for
from .test_stop import SIGNAL_RECORDER, STUBBORN, the_report

pytestmark = pytest.mark.docker

REASON = "fenced: no reply from the control plane for 10.0 s (lease 10 s)"


def running(runtime, docker_client, node, spec):  # type: ignore[no-untyped-def]
    runtime.reconcile([spec], [], T0)
    [container] = [c for c in ours(docker_client, node) if c.labels[LABEL_LAUNCH] == spec.launch_id]
    wait_for(lambda: "started" in logs_of(container), what="the job's traps")
    return container


def test_the_fence_gives_the_notice_then_sigterm_and_the_stop_is_reported_fenced(
    make_runtime, make_desired, docker_client, node
):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    spec = make_desired(command=["sh", "-c", SIGNAL_RECORDER], warn_before_s=60, stop_grace_s=20)
    container = running(runtime, docker_client, node, spec)
    fenced_at = T0 + timedelta(minutes=1)  # well inside the window, long before its warning

    runtime.fence(fenced_at, REASON)
    wait_for(lambda: status_of(container) == "exited", what="the job to exit on SIGTERM")

    lines = logs_of(container).splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == ["started", "USR1", "TERM"]
    notice = json.loads(lines[1].split(" ", 1)[1])
    assert notice == {
        "window_end": "2030-01-01T12:10:00Z",
        "stop_at": "2030-01-01T12:01:00Z",
        "kill_at": "2030-01-01T12:01:20Z",
        "reason": REASON,
    }
    report = the_report(runtime, spec.launch_id)
    assert (report.state, report.exit_code, report.fenced, report.error) == ("exited", 0, True, REASON)
    assert report.finished_at is not None and "TERM" in (report.log_tail or "")
    assert '"fenced":true' in report.model_dump_json()


def test_a_fenced_job_that_ignores_sigterm_is_killed_when_its_grace_is_over(
    make_runtime, make_desired, docker_client, node
):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    spec = make_desired(command=["sh", "-c", STUBBORN], stop_grace_s=5)
    container = running(runtime, docker_client, node, spec)
    fenced_at = T0 + timedelta(minutes=1)

    runtime.fence(fenced_at, REASON)
    wait_for(lambda: "TERM-ignored" in logs_of(container), what="SIGTERM to arrive")
    assert runtime.next_kill_at() == fenced_at + timedelta(seconds=5)  # the agent's timer for the SIGKILL
    runtime.reconcile([spec], [], fenced_at + timedelta(seconds=4))
    assert status_of(container) == "running"
    assert the_report(runtime, spec.launch_id).state == "stopping"

    runtime.reconcile([spec], [], fenced_at + timedelta(seconds=5))
    wait_for(lambda: status_of(container) == "exited", what="SIGKILL")
    assert runtime.next_kill_at() is None
    report = the_report(runtime, spec.launch_id)
    assert (report.state, report.exit_code, report.fenced) == ("exited", 137, True)


def test_fenced_nothing_starts_and_nothing_is_removed_until_the_control_plane_answers(
    make_runtime, make_desired, docker_client, node
):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    old = make_desired(launch_id="old", command=["sh", "-c", SIGNAL_RECORDER])
    later = make_desired(launch_id="later", window_start=T0 + timedelta(minutes=2))
    container = running(runtime, docker_client, node, old)
    runtime.reconcile([old, later], [], T0 + timedelta(seconds=1))

    runtime.fence(T0 + timedelta(seconds=10), REASON)
    wait_for(lambda: status_of(container) == "exited", what="the fenced job to stop")
    for minute in range(2, 6):  # the later window opens while fenced; heartbeats keep failing
        runtime.report()
        runtime.reconcile([old, later], [], T0 + timedelta(minutes=minute))
    assert [c.labels[LABEL_LAUNCH] for c in ours(docker_client, node)] == ["old"]  # kept, and nothing new
    assert the_report(runtime, "later").state == "pending"

    runtime.unfence()
    # The control plane's answer: the fenced launch is lost (no longer desired), the later one still is.
    now = T0 + timedelta(minutes=6)
    runtime.reconcile([later], [], now)
    runtime.report()
    runtime.reconcile([later], [], now + timedelta(seconds=1))
    assert [c.labels[LABEL_LAUNCH] for c in ours(docker_client, node)] == ["later"]
    assert the_report(runtime, "later").state == "running"


def test_a_fenced_launch_never_runs_again_even_while_still_desired(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    spec = make_desired(command=["sh", "-c", SIGNAL_RECORDER])
    container = running(runtime, docker_client, node, spec)
    runtime.fence(T0 + timedelta(seconds=5), REASON)
    wait_for(lambda: status_of(container) == "exited", what="the fenced job to stop")
    runtime.report()

    runtime.unfence()
    for second in range(6, 10):  # a reply that still lists it (the control plane has not seen the report yet)
        runtime.reconcile([spec], [], T0 + timedelta(seconds=second))
        runtime.report()
    # Removed once reported, as any finished container; its final report stands in for it, and no second runs.
    assert ours(docker_client, node) == []
    report = the_report(runtime, spec.launch_id)
    assert (report.state, report.fenced, report.container_id) == ("exited", True, container.id)


def test_a_container_already_stopping_at_its_window_end_is_not_the_fences(
    make_runtime, make_desired, docker_client, node
):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    end = T0 + timedelta(minutes=1)
    spec = make_desired(command=["sh", "-c", STUBBORN], window_end=end, warn_before_s=0, stop_grace_s=30)
    container = running(runtime, docker_client, node, spec)
    runtime.reconcile([spec], [], end)
    wait_for(lambda: "TERM-ignored" in logs_of(container), what="SIGTERM at the end")

    runtime.fence(end + timedelta(seconds=5), REASON)
    assert runtime.next_kill_at() == end + timedelta(seconds=30)  # its own deadline, unchanged
    report = the_report(runtime, spec.launch_id)
    assert (report.state, report.fenced, report.error) == ("stopping", False, None)


def test_a_restarted_runtime_still_reports_the_stop_as_fenced(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    spec = make_desired(command=["sh", "-c", STUBBORN], stop_grace_s=30)
    container = running(runtime, docker_client, node, spec)
    runtime.fence(T0 + timedelta(seconds=5), REASON)
    wait_for(lambda: "TERM-ignored" in logs_of(container), what="SIGTERM")

    restarted = make_runtime()  # the agent restarted mid-grace: it adopts the container, mark and deadline
    report = the_report(restarted, spec.launch_id)
    assert (report.state, report.fenced, report.error) == ("stopping", True, REASON)
    assert restarted.next_kill_at() == T0 + timedelta(seconds=35)
