"""A control-plane outage with real agent processes and a real engine: the agent is SIGKILLed mid-outage and started
again; the container nothing would replace runs on untouched, the replaceable one is stopped at the lease (by its
watchdog and the restarted agent), and once the control plane answers, the journal of both processes arrives."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from nodeagent.backends.simulated import SimulatedBackend
from nodeagent.runtime.containers import LABEL_LAUNCH, parse_docker_time
from tests.nodeagent.control_plane_double import ControlPlaneDouble

from .support import logs_of, ours, status_of, wait_for

pytestmark = pytest.mark.docker

JOB = "echo started; trap 'echo TERM; exit 0' TERM; while :; do sleep 0.2; done"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def double() -> Iterator[ControlPlaneDouble]:
    cp = ControlPlaneDouble(heartbeat_interval_s=1.0, lease_s=3.0, outage_tolerance_s=600.0)
    yield cp
    cp.close()


def start_agent(double: ControlPlaneDouble, node: str, state: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "nodeagent", "run", "--server", double.url, "--join-token", "join-token-123"]
    argv += ["--simulate", "2xH100-80GB", "--hostname", node, "--state-dir", str(state), "--runtime", "docker"]
    argv += ["--no-listen", "--no-ssh", "--no-live-logs", "--interval", "1"]
    log = (state.parent / f"agent-{time.monotonic_ns()}.log").open("wb")
    return subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})


def launch(launch_id: str, gpu: str, image: str, **extra: Any) -> dict[str, Any]:
    now = datetime.now(UTC)
    return {
        "launch_id": launch_id,
        "reservation": f"res-{launch_id}",
        "project": "p",
        "image": image,
        "command": ["sh", "-c", JOB],
        "gpu_uuids": [gpu],
        "window_start": (now - timedelta(minutes=1)).isoformat(),
        "window_end": (now + timedelta(minutes=10)).isoformat(),
        "stop_grace_s": 2,
        **extra,
    }


def test_a_sigkilled_agent_restarted_mid_outage_keeps_unreplaceable_work_running_and_replays_its_journal(
    double, docker_client, node, busybox_image, tmp_path
):  # type: ignore[no-untyped-def]
    gpus = [g.uuid for g in SimulatedBackend("2xH100-80GB", hostname=node).discover()]
    double.desired = [
        launch("kept", gpus[0], busybox_image),
        launch("requeued", gpus[1], busybox_image, replaceable=True),
    ]
    state = tmp_path / "state"
    agent = start_agent(double, node, state)
    restarted: subprocess.Popen[bytes] | None = None
    try:
        containers = wait_for(lambda: len(ours(docker_client, node)) == 2 and ours(docker_client, node), timeout=30)
        by_launch = {c.labels[LABEL_LAUNCH]: c for c in containers}
        kept, requeued = by_launch["kept"], by_launch["requeued"]
        wait_for(lambda: "started" in logs_of(kept) and "started" in logs_of(requeued), what="both jobs")
        kept.reload()
        kept_started = kept.attrs["State"]["StartedAt"]

        double.fail(100000)  # the control plane goes away: every heartbeat is answered 503
        outage_at = time.time()
        time.sleep(1.5)
        agent.send_signal(signal.SIGKILL)
        agent.wait(10)
        killed_at = time.time()
        time.sleep(1.0)
        restarted = start_agent(double, node, state)

        # The replaceable job is stopped at the lease (3 s after the last answered heartbeat), whoever comes first.
        wait_for(lambda: status_of(requeued) == "exited", timeout=15, what="the replaceable job to stop")
        requeued.reload()
        finished = parse_docker_time(requeued.attrs["State"]["FinishedAt"])
        # The lease (3 s), the watchdog's rounding, second more and poll (3 s), the grace (2 s), and slack: well before
        # the control plane would requeue (the lease, the grace and its 10 s margin).
        assert finished is not None and finished.timestamp() <= outage_at + 3.0 + 3 + 2 + 1.5
        time.sleep(4)
        kept.reload()
        assert kept.attrs["State"]["Status"] == "running"
        assert kept.attrs["State"]["StartedAt"] == kept_started  # never stopped nor restarted
        assert "TERM" not in logs_of(kept)

        answered = len(double.accepted)
        double.script.clear()  # the control plane is back
        wait_for(lambda: len(double.accepted) >= answered + 3, timeout=20, what="answered heartbeats")
        after = double.accepted[answered:]
        sampled = {ts for hb in after for series in hb["samples"] for ts in series["ts"]}
        # What the killed process sampled during the outage came back from its journal.
        assert any(outage_at < ts < killed_at for ts in sampled)
        reports = {c["launch_id"]: c for hb in after for c in hb["containers"]}
        assert reports["requeued"]["state"] == "exited" and reports["requeued"]["fenced"] is True
        assert reports["kept"]["state"] == "running"
        messages = [e["message"] for hb in after for e in hb["events"]]
        assert any("replaceable containers are being stopped" in m for m in messages)
        everything = [(s["uuid"], ts) for hb in double.accepted for s in hb["samples"] for ts in s["ts"]]
        assert len(everything) == len(set(everything))  # each sample once
    finally:
        for process in (agent, restarted):
            if process is not None and process.poll() is None:
                process.terminate()
                process.wait(15)


def test_with_no_reply_the_runtime_still_warns_and_stops_work_at_its_windows_end(
    double, docker_client, node, busybox_image, tmp_path
):  # type: ignore[no-untyped-def]
    gpus = [g.uuid for g in SimulatedBackend("1xH100-80GB", hostname=node).discover()]
    end = datetime.now(UTC) + timedelta(seconds=12)
    recorder = "echo started; trap 'echo USR1' USR1; trap 'echo TERM; exit 0' TERM; while :; do sleep 0.1; done"
    double.desired = [
        {**launch("kept", gpus[0], busybox_image), "window_end": end.isoformat(), "warn_before_s": 4}
        | {"command": ["sh", "-c", recorder]}
    ]
    state = tmp_path / "state"
    agent = start_agent(double, node, state)
    try:
        [container] = wait_for(lambda: ours(docker_client, node), timeout=30, what="the container")
        wait_for(lambda: "started" in logs_of(container), what="the job")
        double.fail(100000)  # from here on, no reply at all: the control plane is down
        wait_for(lambda: status_of(container) == "exited", timeout=25, what="the stop at the window's end")
        container.reload()
        finished = parse_docker_time(container.attrs["State"]["FinishedAt"])
        assert finished is not None and end <= finished <= end + timedelta(
            seconds=2
        )  # at the window's end, from the held desired state
        assert [line for line in logs_of(container).splitlines()] == ["started", "USR1", "TERM"]
        assert container.attrs["State"]["ExitCode"] == 0
    finally:
        agent.terminate()
        agent.wait(15)
