"""The end of a window on a real engine: warning file and SIGUSR1, then SIGTERM, then SIGKILL after the grace."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from nodeagent.runtime.containers import LOG_TAIL_CHARS, LOG_TAIL_LINES

from .support import T0, logs_of, ours, status_of, wait_for

pytestmark = pytest.mark.docker

# A job that records, in order, the signals it receives; it exits on TERM.
SIGNAL_RECORDER = (
    'echo started; trap \'echo "USR1 $(cat $GPUCP_WARN_FILE)"\' USR1; trap "echo TERM; exit 0" TERM; '
    "while :; do sleep 0.1; done"
)
# A job that ignores SIGTERM, as a hung one would.
STUBBORN = 'echo started; trap "echo TERM-ignored" TERM; while :; do sleep 0.1; done'


def the_report(runtime, launch_id):  # type: ignore[no-untyped-def]
    [report] = [r for r in runtime.report() if r.launch_id == launch_id]
    return report


def test_warning_file_and_sigusr1_come_once_then_sigterm_at_the_end(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    end = T0 + timedelta(minutes=10)
    spec = make_desired(command=["sh", "-c", SIGNAL_RECORDER], window_end=end, warn_before_s=60, stop_grace_s=20)

    runtime.reconcile([spec], [], T0)
    [container] = ours(docker_client, node)
    wait_for(lambda: "started" in logs_of(container), what="the job's traps")

    runtime.reconcile([spec], [], end - timedelta(seconds=61))
    assert "USR1" not in logs_of(container)

    runtime.reconcile([spec], [], end - timedelta(seconds=60))
    wait_for(lambda: "USR1" in logs_of(container), what="the warning signal")
    runtime.reconcile([spec], [], end - timedelta(seconds=30))
    runtime.reconcile([spec], [], end - timedelta(seconds=1))
    assert the_report(runtime, spec.launch_id).state == "running"

    runtime.reconcile([spec], [], end)
    wait_for(lambda: status_of(container) == "exited", what="the job to exit on SIGTERM")

    lines = logs_of(container).splitlines()
    assert lines[0] == "started"
    assert [line.split(" ", 1)[0] for line in lines[1:]] == ["USR1", "TERM"]
    warning = json.loads(lines[1].split(" ", 1)[1])
    assert warning["window_end"] == "2030-01-01T12:10:00Z"
    assert warning["stop_at"] == "2030-01-01T12:10:00Z"
    report = the_report(runtime, spec.launch_id)
    assert report.state == "exited"
    assert report.exit_code == 0
    assert report.finished_at is not None and report.started_at is not None
    assert report.finished_at >= report.started_at
    assert "TERM" in report.log_tail


def test_job_ignoring_sigterm_is_killed_once_the_grace_is_over(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    end = T0 + timedelta(minutes=1)
    spec = make_desired(command=["sh", "-c", STUBBORN], window_end=end, warn_before_s=0, stop_grace_s=30)

    runtime.reconcile([spec], [], T0)
    [container] = ours(docker_client, node)
    wait_for(lambda: "started" in logs_of(container), what="the job's trap")

    runtime.reconcile([spec], [], end)
    wait_for(lambda: "TERM-ignored" in logs_of(container), what="SIGTERM to arrive")
    assert status_of(container) == "running"
    assert the_report(runtime, spec.launch_id).state == "stopping"

    runtime.reconcile([spec], [], end + timedelta(seconds=29))
    assert status_of(container) == "running"

    runtime.reconcile([spec], [], end + timedelta(seconds=30))
    wait_for(lambda: status_of(container) == "exited", what="SIGKILL")
    report = the_report(runtime, spec.launch_id)
    assert report.state == "exited"
    assert report.exit_code == 137


def test_container_the_desired_state_no_longer_holds_is_stopped_and_reported(
    make_runtime, make_desired, docker_client, node
):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    kept = make_desired(launch_id="kept", gpu_uuids=["GPU-kept"])
    dropped = make_desired(launch_id="dropped", gpu_uuids=["GPU-dropped"], command=["sh", "-c", SIGNAL_RECORDER])
    runtime.reconcile([kept, dropped], [], T0)
    [container] = [c for c in ours(docker_client, node) if c.name.endswith("dropped")]
    wait_for(lambda: "started" in logs_of(container), what="the job's traps")

    runtime.reconcile([kept], [], T0 + timedelta(seconds=1))
    wait_for(lambda: status_of(container) == "exited", what="the dropped job to stop")

    reports = {r.launch_id: r for r in runtime.report()}
    assert reports["dropped"].state == "exited"
    assert reports["dropped"].exit_code == 0
    assert "TERM" in reports["dropped"].log_tail
    assert "USR1" not in reports["dropped"].log_tail
    assert reports["kept"].state == "running"
    assert runtime.busy_gpus() == {"GPU-kept"}


def test_stop_list_ends_a_container_inside_its_window(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    spec = make_desired(command=["sh", "-c", SIGNAL_RECORDER])
    runtime.reconcile([spec], [], T0)
    [container] = ours(docker_client, node)
    wait_for(lambda: "started" in logs_of(container), what="the job's traps")

    # A cancel: still in the desired list (the reply may lag) but named in stop, which wins.
    runtime.reconcile([spec], [spec.launch_id], T0 + timedelta(seconds=1))
    wait_for(lambda: status_of(container) == "exited", what="the cancelled job to stop")
    runtime.reconcile([spec], [spec.launch_id], T0 + timedelta(seconds=2))

    assert len(ours(docker_client, node)) == 1
    assert the_report(runtime, spec.launch_id).state == "exited"


def test_zero_grace_kills_at_once(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    spec = make_desired(command=["sh", "-c", STUBBORN], stop_grace_s=0)
    runtime.reconcile([spec], [], T0)
    [container] = ours(docker_client, node)

    runtime.reconcile([], [], T0 + timedelta(seconds=1))

    wait_for(lambda: status_of(container) == "exited", what="SIGKILL")
    assert container.attrs["State"]["ExitCode"] == 137


def test_non_zero_exit_is_reported_with_its_log_tail(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    spec = make_desired(command=["sh", "-c", "echo step one; echo 'boom: out of memory' >&2; exit 3"])
    runtime.reconcile([spec], [], T0)
    [container] = ours(docker_client, node)
    wait_for(lambda: status_of(container) == "exited", what="the job to fail")

    report = the_report(runtime, spec.launch_id)

    assert report.state == "exited"
    assert report.exit_code == 3
    assert "step one" in report.log_tail
    assert "boom: out of memory" in report.log_tail
    assert runtime.busy_gpus() == set()


def test_log_tail_is_bounded_in_lines_and_characters(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    # 120 lines of 500 characters: both the line and the character bound apply.
    script = "i=0; while [ $i -lt 120 ]; do printf 'line-%03d %0500d\\n' $i 0; i=$((i+1)); done; exit 1"
    spec = make_desired(command=["sh", "-c", script])
    runtime.reconcile([spec], [], T0)
    [container] = ours(docker_client, node)
    wait_for(lambda: status_of(container) == "exited", what="the job to end")

    tail = the_report(runtime, spec.launch_id).log_tail

    assert len(tail) <= LOG_TAIL_CHARS
    assert len(tail.splitlines()) <= LOG_TAIL_LINES
    assert tail.rstrip().endswith("0" * 20)
    assert "line-119" in tail and "line-000" not in tail
    assert tail.startswith("line-")  # cut at a line boundary


def test_extended_window_is_warned_again_before_its_new_end_and_not_stopped_early(
    make_runtime, make_desired, docker_client, node
):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    end = T0 + timedelta(minutes=10)
    spec = make_desired(command=["sh", "-c", SIGNAL_RECORDER], window_end=end, warn_before_s=60)
    runtime.reconcile([spec], [], T0)
    [container] = ours(docker_client, node)
    wait_for(lambda: "started" in logs_of(container), what="the job's traps")
    runtime.reconcile([spec], [], end - timedelta(seconds=30))
    wait_for(lambda: "USR1" in logs_of(container), what="the first warning")

    extended = spec.model_copy(update={"window_end": end + timedelta(minutes=30)})
    runtime.reconcile([extended], [], end)
    runtime.reconcile([extended], [], end + timedelta(minutes=29))
    wait_for(lambda: logs_of(container).count("USR1") == 2, what="the second warning")

    assert status_of(container) == "running"
    assert "TERM" not in logs_of(container)
    assert '"window_end": "2030-01-01T12:40:00Z"' in logs_of(container).splitlines()[-1]
