"""The lease watchdog on a real engine: a replaceable container stops by itself once the lease its agent renews has
run out, with no agent running at all (invariant 8 when the agent is dead or frozen); work nothing would replace is
not wrapped and runs on. The wrapper forwards the notice and the stop, and exits with the job's own status."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from nodeagent.runtime import watchdog
from nodeagent.runtime.containers import LABEL_LAUNCH, parse_docker_time

from .support import T0, logs_of, ours, status_of, wait_for
from .test_stop import SIGNAL_RECORDER, STUBBORN, the_report

pytestmark = pytest.mark.docker


def container_of(docker_client, node, launch_id):  # type: ignore[no-untyped-def]
    [container] = [c for c in ours(docker_client, node) if c.labels[LABEL_LAUNCH] == launch_id]
    return container


@pytest.mark.parametrize("busybox", [True, False], ids=["host-busybox", "image-sh"])
def test_a_replaceable_container_stops_itself_when_the_lease_runs_out_with_no_agent(
    make_runtime, make_desired, docker_client, node, busybox
):  # type: ignore[no-untyped-def]
    runtime = make_runtime(busybox=busybox)
    if busybox:
        assert runtime.busybox is not None, "the host has no static busybox to test with"
    grace = 2
    replaceable = make_desired(command=["sh", "-c", STUBBORN], replaceable=True, stop_grace_s=grace)
    kept = make_desired(command=["sh", "-c", STUBBORN], stop_grace_s=grace)
    deadline = datetime.now(UTC) + timedelta(seconds=4)
    watchdog.write_deadline(runtime.lease_dir, deadline)
    runtime.reconcile([replaceable, kept], [], T0)
    wrapped = container_of(docker_client, node, replaceable.launch_id)
    plain = container_of(docker_client, node, kept.launch_id)
    wait_for(lambda: "started" in logs_of(wrapped) and "started" in logs_of(plain), what="both jobs")
    assert wrapped.attrs["Config"]["Entrypoint"][-1] == watchdog.SCRIPT_MOUNT
    assert plain.attrs["Config"]["Entrypoint"] is None

    # From here no agent runs: nothing renews the lease, nothing reconciles, nothing signals.
    del runtime
    wait_for(lambda: status_of(wrapped) == "exited", timeout=20, what="the watchdog to stop the job")
    wrapped.reload()
    finished = parse_docker_time(wrapped.attrs["State"]["FinishedAt"])
    assert finished is not None
    # Stopped after the lease's end (a second after it: a live agent would have fenced first, with its notice) and
    # gone within the grace, plus the rounding, the watchdog's one-second poll and the engine's own time.
    assert deadline + timedelta(seconds=1 + grace) <= finished <= deadline + timedelta(seconds=grace + 3.5)
    assert wrapped.attrs["State"]["ExitCode"] == 137  # the stubborn job ignored SIGTERM and was killed
    assert "TERM-ignored" in logs_of(wrapped) and "lease ran out" in logs_of(wrapped)
    time.sleep(1)
    assert status_of(plain) == "running"  # not replaceable: runs through the outage

    # The agent back (a new process): the exit after the lease's end was the watchdog's, and is reported as a
    # fence, so the control plane requeues the work rather than take the exit for the job's own end.
    restarted = make_runtime(busybox=busybox)
    report = the_report(restarted, replaceable.launch_id)
    assert (report.state, report.fenced) == ("exited", True)
    assert report.error is not None and "lease watchdog" in report.error
    assert the_report(restarted, kept.launch_id).fenced is False


def test_a_renewed_lease_keeps_the_job_running(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    spec = make_desired(command=["sh", "-c", SIGNAL_RECORDER], replaceable=True)
    runtime.renew_lease(datetime.now(UTC) + timedelta(seconds=5))
    runtime.reconcile([spec], [], T0)
    container = container_of(docker_client, node, spec.launch_id)
    ends = []
    for _ in range(8):  # the agent's heartbeats, each renewing the lease long before it runs out
        time.sleep(1)
        ends.append(datetime.now(UTC) + timedelta(seconds=5))
        runtime.renew_lease(ends[-1])
    assert status_of(container) == "running" and "lease ran out" not in logs_of(container)
    assert the_report(runtime, spec.launch_id).state == "running"
    wait_for(lambda: status_of(container) == "exited", timeout=15, what="the watchdog, once renewals stop")
    assert (container.attrs["State"]["ExitCode"], "TERM" in logs_of(container)) == (0, True)  # the job's own
    report = the_report(runtime, spec.launch_id)
    assert (
        report.fenced is True
        and report.finished_at is not None
        and report.finished_at >= ends[-1] - timedelta(seconds=1)
    )


def test_the_wrapper_forwards_the_notice_and_the_stop_and_keeps_the_exit_code(
    make_runtime, make_desired, docker_client, node
):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    end = T0 + timedelta(minutes=10)
    spec = make_desired(command=["sh", "-c", SIGNAL_RECORDER], replaceable=True, window_end=end, warn_before_s=60)
    short = make_desired(command=["sh", "-c", "echo done; exit 7"], replaceable=True)
    watchdog.write_deadline(runtime.lease_dir, datetime.now(UTC) + timedelta(hours=1))
    runtime.reconcile([spec, short], [], T0)
    container = container_of(docker_client, node, spec.launch_id)
    wait_for(lambda: "started" in logs_of(container), what="the job's traps")
    runtime.reconcile([spec, short], [], end - timedelta(seconds=60))
    wait_for(lambda: "USR1" in logs_of(container), what="the warning, through the wrapper")
    runtime.reconcile([spec, short], [], end)
    wait_for(lambda: status_of(container) == "exited", what="SIGTERM, through the wrapper")
    assert [line.split(" ", 1)[0] for line in logs_of(container).splitlines()] == ["started", "USR1", "TERM"]
    assert the_report(runtime, spec.launch_id).exit_code == 0
    exited = container_of(docker_client, node, short.launch_id)
    wait_for(lambda: status_of(exited) == "exited", what="the short job")
    assert the_report(runtime, short.launch_id).exit_code == 7


def test_without_a_command_the_wrapper_runs_the_images_own(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    spec = make_desired(command=[], replaceable=True, env={"GPUCP_JOB_SECONDS": "1", "GPUCP_JOB_EXIT": "3"})
    watchdog.write_deadline(runtime.lease_dir, datetime.now(UTC) + timedelta(hours=1))
    runtime.reconcile([spec], [], T0)
    container = container_of(docker_client, node, spec.launch_id)
    wait_for(lambda: status_of(container) == "exited", what="the image's job")
    assert "job done" in logs_of(container)
    assert the_report(runtime, spec.launch_id).exit_code == 3


def test_image_argv_follows_dockers_rule() -> None:
    assert watchdog.image_argv({"Entrypoint": ["/init"], "Cmd": ["serve"]}, []) == ["/init", "serve"]
    assert watchdog.image_argv({"Entrypoint": ["/init"], "Cmd": ["serve"]}, ["train"]) == ["/init", "train"]
    assert watchdog.image_argv({"Entrypoint": None, "Cmd": ["job"]}, []) == ["job"]
    assert watchdog.image_argv({}, ["python", "x.py"]) == ["python", "x.py"]


def test_the_deadline_is_written_whole_and_withdrawn(tmp_path: Path) -> None:
    directory = tmp_path / "watchdog"
    watchdog.write_deadline(directory, datetime(2030, 1, 1, 12, 0, 0, 100000, tzinfo=UTC))
    # The whole second after the lease's end, and one more: a live agent fences first, with its notice.
    assert (directory / "deadline").read_text() == f"{int(datetime(2030, 1, 1, 12, 0, 2, tzinfo=UTC).timestamp())}\n"
    assert watchdog.read_deadline(directory) == datetime(2030, 1, 1, 12, 0, 2, tzinfo=UTC)
    watchdog.write_deadline(directory, None)
    assert not (directory / "deadline").exists()
