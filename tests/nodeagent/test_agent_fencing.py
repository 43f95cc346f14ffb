"""Fencing in the agent loop: no answered heartbeat for the lease -> the runtime stops every container; the stop is
reported, fenced, once the control plane answers again. Driven with the test clock against the control plane double;
tests/runtime/test_fence.py proves the runtime's side on the real engine, tests/faults/test_partition.py the whole."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

from control_plane_double import ControlPlaneDouble, FakeClock
from test_agent_loop import RecordingRuntime, make_agent, run_for

from nodeagent import schema
from nodeagent.agent import MIN_REQUEST_TIMEOUT_S

INTERVAL, LEASE, OFFLINE = 5.0, 10.0, 15.0  # the control plane's defaults: 5 s heartbeats, lease 2 and offline 3 x


class FencingRuntime(RecordingRuntime):
    """Plays the Docker runtime's fence: what it fences is stopping (fenced) until the SIGKILL at the end of its grace,
    then exited, and nothing fenced starts. Fenced for replaceable work only, the other launches go on being
    converged: a launch whose window has ended is stopped and reported exited."""

    def __init__(self) -> None:
        super().__init__()
        self.reason: str | None = None
        self.everything = True
        self.kill_at: dict[str, datetime] = {}
        self.killed: dict[str, schema.DesiredContainer] = {}
        self.ended: dict[str, datetime] = {}  # stopped at the end of the window, and when
        self.specs: dict[str, schema.DesiredContainer] = {}

    def reconcile(self, desired: list[schema.DesiredContainer], stop: list[str], now: datetime) -> None:
        self.calls.append(([d.launch_id for d in desired], list(stop), now))
        for launch_id, due in list(self.kill_at.items()):
            if now >= due:
                del self.kill_at[launch_id]
                self.killed[launch_id] = self.specs[launch_id]
        gone = set(self.kill_at) | set(self.killed) | set(self.ended)
        wanted = {d.launch_id: d for d in desired if d.launch_id not in stop and d.launch_id not in gone}
        for launch_id, spec in list(wanted.items()):
            if now >= spec.window_end:
                self.specs[launch_id] = spec
                self.ended[launch_id] = now
                del wanted[launch_id]
        if self.reason is None:
            self.running = wanted
        elif not self.everything:
            self.running = {k: v for k, v in wanted.items() if not v.replaceable}
        else:
            self.running = {k: v for k, v in self.running.items() if k in wanted}
        self.specs.update(self.running)

    def fence(self, now: datetime, reason: str, *, replaceable_only: bool = False) -> None:
        super().fence(now, reason, replaceable_only=replaceable_only)
        self.reason, self.everything = reason, not replaceable_only
        for launch_id, spec in list(self.running.items()):
            if replaceable_only and not spec.replaceable:
                continue
            self.kill_at[launch_id] = now + timedelta(seconds=spec.stop_grace_s)
            del self.running[launch_id]

    def unfence(self) -> None:
        super().unfence()
        self.reason = None

    def next_kill_at(self) -> datetime | None:
        return min(self.kill_at.values(), default=None)

    def report(self) -> list[schema.ContainerReport]:
        reports = super().report()
        for launch_id, state in [(i, "stopping") for i in self.kill_at] + [(i, "exited") for i in self.killed]:
            spec = self.specs[launch_id]
            reports.append(
                schema.ContainerReport(
                    launch_id=launch_id,
                    reservation=spec.reservation,
                    state=state,  # type: ignore[arg-type]
                    gpu_uuids=spec.gpu_uuids,
                    exit_code=137 if state == "exited" else None,
                    fenced=True,
                    error="fenced: as the agent said",
                )
            )
        for launch_id, at in self.ended.items():
            spec = self.specs[launch_id]
            reports.append(
                schema.ContainerReport(
                    launch_id=launch_id,
                    reservation=spec.reservation,
                    state="exited",
                    gpu_uuids=spec.gpu_uuids,
                    started_at=spec.window_start,
                    finished_at=at,
                    exit_code=0,
                )
            )
        return reports


def desired(gpu: str, **overrides: Any) -> dict[str, Any]:
    return {
        "launch_id": "launch-1",
        "reservation": "res-1",
        "project": "p",
        "image": "cuda:12",
        "gpu_uuids": [gpu],
        "window_start": "2026-05-01T11:00:00Z",
        "window_end": "2026-05-01T14:00:00Z",
        "stop_grace_s": 3,
        **overrides,
    }


def running_agent(control_plane: ControlPlaneDouble, clock: FakeClock, tmp_path: Any, **kwargs: Any) -> Any:
    """An agent with one running launch, just answered (the lease starts now), and the control plane given a lease."""
    control_plane.lease_s = LEASE
    runtime = kwargs.pop("runtime", None) or FencingRuntime()
    agent = make_agent(control_plane, clock, tmp_path, runtime=runtime, **kwargs)
    control_plane.desired = [desired(agent.backend.discover()[0].uuid)]
    agent.step()
    assert list(runtime.running) == ["launch-1"] and agent.lease_s == LEASE
    return agent


def test_every_heartbeat_says_the_agent_fences(control_plane, clock, tmp_path):
    run_for(make_agent(control_plane, clock, tmp_path), clock, 5.5)
    assert [hb["node"]["fencing"] for hb in control_plane.accepted] == [True, True]


def test_no_answered_heartbeat_for_the_lease_fences_before_the_offline_threshold(control_plane, clock, tmp_path):
    agent = running_agent(control_plane, clock, tmp_path)
    runtime: FencingRuntime = agent.runtime
    start = clock.monotonic()
    control_plane.fail(1000)  # every heartbeat from here on is answered 503: no reply that counts
    run_for(agent, clock, LEASE - 0.01)
    assert runtime.fences == [] and agent.fenced is None
    run_for(agent, clock, 0.02)
    [(at, reason)] = runtime.fences
    assert at == clock.now() - timedelta(seconds=0.01)  # the loop woke for the lease, not for a heartbeat
    assert clock.monotonic() - start < OFFLINE
    assert reason == f"fenced: no reply from the control plane for {LEASE:.1f} s (lease {LEASE:g} s)"
    assert agent.fenced == reason
    # This control plane tells no outage tolerance (it predates it): every container is fenced, as before.
    assert runtime.fence_scopes == ["all"] and runtime.running == {}


def test_the_fence_sigkills_after_the_grace_with_no_reply_to_wake_the_loop(control_plane, clock, tmp_path):
    agent = running_agent(control_plane, clock, tmp_path)
    runtime: FencingRuntime = agent.runtime
    control_plane.fail(1000)
    run_for(agent, clock, LEASE + 0.001)
    [(fenced_at, _)] = runtime.fences
    run_for(agent, clock, 3.5)
    assert list(runtime.killed) == ["launch-1"]
    kill_reconciles = [now for _, _, now in runtime.calls if now >= fenced_at + timedelta(seconds=3)]
    assert kill_reconciles[0] == fenced_at + timedelta(seconds=3)  # at the deadline itself
    assert runtime.running == {}  # and nothing started again while fenced


def test_a_reconnected_agent_reports_its_fenced_containers_and_lifts_the_fence(control_plane, clock, tmp_path):
    agent = running_agent(control_plane, clock, tmp_path)
    runtime: FencingRuntime = agent.runtime
    control_plane.fail(1000)
    run_for(agent, clock, LEASE + 4)
    answered = len(control_plane.accepted)
    # The control plane comes back having lost the launch: the reply no longer holds it.
    control_plane.script.clear()
    control_plane.desired = []
    run_for(agent, clock, 8.5)  # fenced, the retries back off as usual (make_agent's cap: 8 s)
    back = control_plane.accepted[answered]
    [report] = [c for c in back["containers"] if c["launch_id"] == "launch-1"]
    assert report["state"] == "exited" and report["fenced"] is True and report["exit_code"] == 137
    messages = [e["message"] for e in back["events"]]
    assert any(m.startswith("fenced: no reply from the control plane for 10.0 s") for m in messages)
    assert runtime.unfences == 1 and agent.fenced is None
    assert runtime.running == {}  # the lost launch does not come back
    # The lease runs again from the answered heartbeat.
    control_plane.fail(1000)
    run_for(agent, clock, LEASE + 0.5)
    assert len(runtime.fences) == 2


def test_refusals_and_server_errors_do_not_renew_the_lease(control_plane, clock, tmp_path):
    agent = running_agent(control_plane, clock, tmp_path)
    refused = {"error": {"code": "validation_error", "message": "no", "fields": {}}}
    control_plane.fail(2, status=400, body=refused)
    control_plane.fail(1000, status=500)
    run_for(agent, clock, LEASE + 0.001)
    assert len(agent.runtime.fences) == 1


def test_a_heartbeat_answered_within_the_lease_keeps_the_containers_running(control_plane, clock, tmp_path):
    agent = running_agent(control_plane, clock, tmp_path)
    control_plane.fail(2)  # two heartbeats lost, the third answered within the lease
    run_for(agent, clock, 60)
    assert agent.runtime.fences == [] and list(agent.runtime.running) == ["launch-1"]


def test_while_the_lease_runs_retries_keep_the_heartbeat_cadence(control_plane, clock, tmp_path):
    control_plane.heartbeat_interval_s = 1.0
    agent = running_agent(control_plane, clock, tmp_path)
    control_plane.lease_s = 4.0
    run_for(agent, clock, 1.5)  # the reply now gives the shorter lease
    control_plane.fail(1000)
    first = len(control_plane.received)
    run_for(agent, clock, 3.4)  # the lease runs out 3.5 s from here
    # Backoff alone would wait 1 s, then 2 s (make_agent's): 2 tries. Inside the lease it keeps the 1 s cadence.
    assert len(control_plane.received) - first == 3
    assert agent.runtime.fences == []


def test_without_a_lease_from_the_control_plane_the_agent_never_fences(control_plane, clock, tmp_path):
    agent = running_agent(control_plane, clock, tmp_path)
    control_plane.lease_s = None  # an older control plane: its reply has no lease
    run_for(agent, clock, INTERVAL + 0.5)
    assert agent.lease_s is None and not (tmp_path / "state" / "lease").exists()
    control_plane.fail(1000)
    run_for(agent, clock, 120)
    assert agent.runtime.fences == [] and list(agent.runtime.running) == ["launch-1"]


def test_a_restarted_agent_keeps_the_lease_it_had_and_fences_the_adopted_containers(control_plane, clock, tmp_path):
    agent = running_agent(control_plane, clock, tmp_path)
    start = clock.monotonic()
    control_plane.fail(1000)
    run_for(agent, clock, 6)
    # A restart 6 s into the lease: the new process has a new monotonic clock, not a new lease.
    runtime = FencingRuntime()
    runtime.running = dict(agent.runtime.running)  # the containers it adopts from the engine
    runtime.specs.update(runtime.running)
    restarted = make_agent(control_plane, clock, tmp_path, runtime=runtime, join_token=None)
    run_for(restarted, clock, 10)
    [(at, _)] = runtime.fences
    assert clock.monotonic() - start >= LEASE
    assert at == clock.now() - timedelta(seconds=clock.monotonic() - start - LEASE)


def test_a_heartbeat_into_a_dead_network_returns_before_the_fence(control_plane, clock, tmp_path):
    control_plane.heartbeat_interval_s = 1.0
    agent = running_agent(control_plane, clock, tmp_path)
    control_plane.lease_s = 2.0
    run_for(agent, clock, 1.5)  # the heartbeat at 1 s brings the shorter lease; the next, at 2 s, has 1 s left
    control_plane.hang_s = 4.5  # answers come, but only after 4.5 s (the client waits 5 s)
    clock.advance(0.5)
    began = time.monotonic()
    agent.step()
    took = time.monotonic() - began
    # Half the 1 s left for connect and half for read, but at least MIN_REQUEST_TIMEOUT_S each: the request gave
    # up long before the double answered, and the loop is back in time to fence.
    assert MIN_REQUEST_TIMEOUT_S <= took < 4.0  # not a timing goal: waiting for the answer would take 4.5 s
    assert agent.backoff.failures == 1
    control_plane.hang_s = 0.0


class SlowStartRuntime(FencingRuntime):
    """A start that holds the loop up past the lease, as a loaded engine's can (the runtime waits for starts)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock
        self.slow = False

    def reconcile(self, desired: list[schema.DesiredContainer], stop: list[str], now: datetime) -> None:
        super().reconcile(desired, stop, now)
        if self.slow:
            self.slow = False
            self.clock.advance(LEASE + 2)


def test_a_loop_held_up_past_the_lease_asks_the_control_plane_before_it_fences(control_plane, clock, tmp_path):
    runtime = SlowStartRuntime(clock)
    agent = running_agent(control_plane, clock, tmp_path, runtime=runtime)
    runtime.slow = True
    run_for(agent, clock, INTERVAL + 0.5)  # the reconcile after the next reply takes 12 s of the clock
    run_for(agent, clock, 1)
    assert runtime.fences == []  # the heartbeat due went first and was answered
    assert list(runtime.running) == ["launch-1"]
    # The same hold-up with the control plane gone: the heartbeat fails, and then the agent fences.
    control_plane.fail(1000)
    runtime.slow = True
    agent._next_due = clock.monotonic()  # a timer (a window opening) runs the slow reconcile between heartbeats
    agent.step()
    agent.step()
    [(_, reason)] = runtime.fences
    assert reason.startswith("fenced: no reply from the control plane for 1")
