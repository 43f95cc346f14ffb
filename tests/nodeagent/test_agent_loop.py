"""The agent loop, driven step by step with a test clock against a control plane double on a real socket."""

from __future__ import annotations

import os
import signal
import stat
import threading
from datetime import datetime
from pathlib import Path

import pytest
from control_plane_double import ControlPlaneDouble, FakeClock, samples_of

from nodeagent import schema
from nodeagent.agent import Agent, AgentState, AgentStopped
from nodeagent.backends.simulated import SimulatedBackend
from nodeagent.client import Backoff, ControlPlaneClient
from nodeagent.collectors import HostCollector
from nodeagent.journal import Journal
from nodeagent.runtime.base import ContainerRuntime, NullRuntime

JOIN_TOKEN = "join-token-123"


class RecordingRuntime:
    """A runtime that records what it was told and reports one running container per desired launch."""

    def __init__(self, *, explode: bool = False) -> None:
        self.calls: list[tuple[list[str], list[str], datetime]] = []
        self.running: dict[str, schema.DesiredContainer] = {}
        self.explode = explode
        self.fences: list[tuple[datetime, str]] = []
        self.fence_scopes: list[str] = []
        self.unfences = 0

    def reconcile(self, desired: list[schema.DesiredContainer], stop: list[str], now: datetime) -> None:
        self.calls.append(([d.launch_id for d in desired], list(stop), now))
        if self.explode:
            raise RuntimeError("the engine went away")
        self.running = {d.launch_id: d for d in desired if d.launch_id not in stop}

    def report(self) -> list[schema.ContainerReport]:
        return [
            schema.ContainerReport(
                launch_id=d.launch_id, reservation=d.reservation, state="running", gpu_uuids=d.gpu_uuids
            )
            for d in self.running.values()
        ]

    def facts(self) -> schema.ContainerRuntimeFacts:
        return schema.ContainerRuntimeFacts(kind="docker", version="test", gpu_mode="env-only")

    def busy_gpus(self) -> set[str]:
        return {u for d in self.running.values() for u in d.gpu_uuids}

    def fence(self, now: datetime, reason: str, *, replaceable_only: bool = False) -> None:
        self.fences.append((now, reason))
        self.fence_scopes.append("replaceable" if replaceable_only else "all")

    def unfence(self) -> None:
        self.unfences += 1

    def next_kill_at(self) -> datetime | None:
        return None


def make_agent(
    control_plane: ControlPlaneDouble,
    clock: FakeClock,
    tmp_path: Path,
    *,
    runtime: ContainerRuntime | None = None,
    join_token: str | None = JOIN_TOKEN,
    spec: str = "2xH100-80GB",
    **kwargs,
) -> Agent:  # type: ignore[no-untyped-def]
    runtime = runtime or NullRuntime()
    return Agent(
        client=ControlPlaneClient(control_plane.url, timeout=5),
        backend=SimulatedBackend(spec, hostname="node-a", seed=1, busy_source=runtime.busy_gpus),
        runtime=runtime,
        state=AgentState(tmp_path / "state"),
        host=HostCollector(hostname="node-a"),
        join_token=join_token,
        clock=clock,
        backoff=kwargs.pop("backoff", Backoff(base_s=1, cap_s=8, rng=lambda: 1.0)),
        **kwargs,
    )


def run_for(agent: Agent, clock: FakeClock, seconds: float) -> None:
    """Step the agent through ``seconds`` of test time, jumping to whatever is due next."""
    end = clock.monotonic() + seconds
    while clock.monotonic() < end:
        wait = agent.step()
        clock.advance(max(min(wait, end - clock.monotonic()), 0.001))


def test_enrolls_saves_a_private_credential_then_heartbeats(control_plane, clock, tmp_path):
    agent = make_agent(control_plane, clock, tmp_path)
    agent.step()
    assert [r.path for r in control_plane.received] == ["/api/v1/agent/enroll", "/api/v1/agent/heartbeat"]
    credential = tmp_path / "state" / "credential"
    assert credential.read_text().strip() == control_plane.credential
    assert stat.S_IMODE(credential.stat().st_mode) == 0o600
    [hb] = control_plane.accepted
    assert hb["node"]["simulated"] is True and hb["node"]["backend"] == "simulated"
    assert len(hb["gpus"]) == 2 and len(samples_of(hb)) == 2
    assert hb["schema_version"] == schema.HEARTBEAT_SCHEMA_VERSION  # columns, one series per GPU
    assert [s["uuid"] for s in hb["samples"]] == [g["uuid"] for g in hb["gpus"]]
    assert hb["node"]["container_runtime"]["kind"] == "none"


def test_samples_every_second_heartbeats_every_interval_with_increasing_seq(control_plane, clock, tmp_path):
    agent = make_agent(control_plane, clock, tmp_path)
    run_for(agent, clock, 20.5)
    seqs = [hb["seq"] for hb in control_plane.accepted]
    assert seqs == [1, 2, 3, 4, 5]  # at 0, 5, 10, 15, 20 s
    assert len(control_plane.accepted_samples()) == 21 * 2
    assert len(set(control_plane.accepted_samples())) == 21 * 2


def test_seq_keeps_increasing_across_restarts(control_plane, clock, tmp_path):
    run_for(make_agent(control_plane, clock, tmp_path), clock, 6)
    restarted = make_agent(control_plane, clock, tmp_path, join_token=None)  # the saved credential suffices
    run_for(restarted, clock, 1)
    seqs = [hb["seq"] for hb in control_plane.accepted]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs) == 3
    assert [r.path for r in control_plane.received].count("/api/v1/agent/enroll") == 1


def test_the_server_sets_the_heartbeat_interval(control_plane, clock, tmp_path):
    control_plane.heartbeat_interval_s = 2.0
    agent = make_agent(control_plane, clock, tmp_path)
    run_for(agent, clock, 10.5)
    assert agent.interval == 2.0
    assert len(control_plane.accepted) == 6  # 0, 2, 4, 6, 8, 10


def test_outage_loses_nothing_within_the_buffer_and_backs_off(control_plane, clock, tmp_path):
    agent = make_agent(control_plane, clock, tmp_path)
    run_for(agent, clock, 1)
    control_plane.fail(4)
    run_for(agent, clock, 60)
    attempts = [r for r in control_plane.received if r.path.endswith("heartbeat")]
    # 1 ok, then 4 failures retried after 1, 2, 4, 8 s of backoff, then back on the 5 s interval.
    assert len(attempts) - len(control_plane.accepted) == 4
    samples = control_plane.accepted_samples()
    assert len(samples) == len(set(samples))  # nothing sent twice
    assert len(samples) + agent.buffer.pending("samples") == 61 * 2  # and nothing lost
    assert agent.buffer.dropped["samples"] == 0
    assert agent.backoff.failures == 0


def test_backoff_waits_grow_then_reset(control_plane, clock, tmp_path):
    agent = make_agent(control_plane, clock, tmp_path)
    agent.step()
    control_plane.fail(3)
    clock.advance(5)
    waits = []
    for _ in range(3):
        agent.step()  # fails
        waits.append(agent._next_heartbeat - clock.monotonic())
        clock.advance(waits[-1])
    assert waits == [1, 2, 4]
    agent.step()  # succeeds
    assert agent._next_heartbeat - clock.monotonic() == 5


def test_long_outage_drops_the_oldest_and_reports_how_many(control_plane, clock, tmp_path):
    agent = make_agent(control_plane, clock, tmp_path, buffer=Journal(tmp_path / "journal", max_bytes=8192))
    agent.step()
    control_plane.fail(1000)
    run_for(agent, clock, 30)
    control_plane.script.clear()
    run_for(agent, clock, 10)
    dropped = agent.buffer.dropped["samples"]
    assert dropped > 0
    reports = [e for e in control_plane.accepted_events() if "dropped the oldest" in e["message"]]
    assert len(reports) == 1 and f"{dropped} samples" in reports[0]["message"]
    # What arrived after the outage is the newest 20, in order.
    after = control_plane.accepted_samples()[2:]
    for uuid in {u for u, _ in after}:
        times = [ts for u, ts in after if u == uuid]
        assert times == sorted(times)


def test_a_revoked_credential_stops_the_agent_and_sets_it_aside(control_plane, clock, tmp_path):
    agent = make_agent(control_plane, clock, tmp_path)
    agent.step()
    control_plane.credential = "rotated-by-an-operator"
    clock.advance(5)
    with pytest.raises(AgentStopped, match="Re-enroll with a new --join-token"):
        agent.step()
    assert not (tmp_path / "state" / "credential").exists()
    assert (tmp_path / "state" / "credential.revoked").exists()


def test_a_rejected_heartbeat_is_dropped_and_the_agent_goes_on(control_plane, clock, tmp_path):
    agent = make_agent(control_plane, clock, tmp_path)
    agent.step()
    control_plane.fail(1, status=400, body={"error": {"code": "validation_error", "message": "no", "fields": {}}})
    run_for(agent, clock, 5.5)
    assert agent.buffer.pending("samples") == 0
    run_for(agent, clock, 5)
    assert len(control_plane.accepted) == 2
    # The 5 samples of the rejected heartbeat never come back.
    assert len(control_plane.accepted_samples()) == 2 + 5 * 2


def test_a_too_large_heartbeat_halves_the_batch_instead_of_dropping(control_plane, clock, tmp_path):
    agent = make_agent(control_plane, clock, tmp_path, max_batch_samples=8)
    agent.step()
    control_plane.fail(1, status=413)
    run_for(agent, clock, 5.5)
    assert agent.max_batch_samples == 4
    run_for(agent, clock, 30)
    samples = control_plane.accepted_samples()
    assert len(samples) == len(set(samples)) and len(samples) + agent.buffer.pending("samples") == 36 * 2


def test_desired_containers_go_to_the_runtime_and_reports_come_back(control_plane, clock, tmp_path):
    runtime = RecordingRuntime()
    agent = make_agent(control_plane, clock, tmp_path, runtime=runtime)
    gpu = agent.backend.discover()[0].uuid
    control_plane.desired = [
        {
            "launch_id": "launch-1",
            "reservation": "res-1",
            "project": "p",
            "image": "cuda:12",
            "gpu_uuids": [gpu],
            "window_start": "2026-05-01T12:00:00Z",
            "window_end": "2026-05-01T13:00:00Z",
        }
    ]
    control_plane.stop = ["launch-0"]
    agent.step()
    assert runtime.calls == [(["launch-1"], ["launch-0"], clock.now())]
    run_for(agent, clock, 5.5)
    hb = control_plane.accepted[-1]
    assert [c["launch_id"] for c in hb["containers"]] == ["launch-1"]
    assert hb["node"]["container_runtime"]["kind"] == "docker"
    # The simulated GPU reflects the runtime's busy set.
    run_for(agent, clock, 20)
    last = {s["uuid"]: s["fields"] for s in samples_of(control_plane.accepted[-1])}
    assert last[gpu][schema.GPU_UTIL] >= 80


def test_a_failing_runtime_is_reported_and_does_not_stop_reporting(control_plane, clock, tmp_path):
    agent = make_agent(control_plane, clock, tmp_path, runtime=RecordingRuntime(explode=True))
    run_for(agent, clock, 5.5)
    errors = [e for e in control_plane.accepted_events() if e["kind"] == "error"]
    assert errors and "the engine went away" in errors[0]["message"]
    assert len(control_plane.accepted) == 2


def test_null_runtime_reports_desired_launches_as_failed_with_the_reason(control_plane, clock, tmp_path):
    agent = make_agent(control_plane, clock, tmp_path)
    gpu = agent.backend.discover()[0].uuid
    control_plane.desired = [
        {
            "launch_id": "launch-1",
            "reservation": "res-1",
            "project": "p",
            "image": "cuda:12",
            "gpu_uuids": [gpu],
            "window_start": "2026-05-01T12:00:00Z",
            "window_end": "2026-05-01T13:00:00Z",
        }
    ]
    run_for(agent, clock, 5.5)
    [report] = control_plane.accepted[-1]["containers"]
    assert report["state"] == "failed" and "without a container runtime" in report["error"]
    control_plane.desired = []
    run_for(agent, clock, 10)
    assert control_plane.accepted[-1]["containers"] == []


def test_xid_and_lost_gpu_events_reach_the_control_plane(control_plane, clock, tmp_path):
    agent = make_agent(control_plane, clock, tmp_path, spec="4xA100-40GB")
    agent.step()
    backend: SimulatedBackend = agent.backend  # type: ignore[assignment]
    backend.inject(0, "xid", xid=31)
    backend.inject(3, "disappear")
    run_for(agent, clock, 5.5)
    kinds = sorted((e["kind"], e.get("xid")) for e in control_plane.accepted_events())
    assert ("xid", 31) in kinds and ("xid", 79) in kinds and ("gpu_lost", None) in kinds
    assert len(control_plane.accepted[-1]["gpus"]) == 3


def test_without_credential_or_join_token_the_agent_refuses_to_start(control_plane, clock, tmp_path):
    with pytest.raises(AgentStopped, match="no node credential") as caught:
        make_agent(control_plane, clock, tmp_path, join_token=None)
    assert caught.value.exit_code == 2


def test_a_refused_join_token_stops_the_agent(control_plane, clock, tmp_path):
    control_plane.fail(
        1, status=400, body={"error": {"code": "invalid", "message": "join token expired", "fields": {}}}
    )
    agent = make_agent(control_plane, clock, tmp_path)
    with pytest.raises(AgentStopped, match="join token expired"):
        agent.step()


def test_enrollment_is_retried_while_the_control_plane_is_down(control_plane, clock, tmp_path):
    control_plane.fail(2)
    agent = make_agent(control_plane, clock, tmp_path)
    run_for(agent, clock, 4)
    assert agent.credential == control_plane.credential
    assert len(control_plane.accepted) == 1


def test_run_stops_on_sigterm_and_closes_the_backend(control_plane, tmp_path):
    agent = Agent(
        client=ControlPlaneClient(control_plane.url),
        backend=SimulatedBackend("1xL40S", hostname="n"),
        runtime=NullRuntime(),
        state=AgentState(tmp_path),
        host=HostCollector(hostname="n"),
        join_token="join-token-123",
        sample_interval=0.05,
    )
    closed = []
    agent.backend.close = lambda: closed.append(True)  # type: ignore[method-assign]
    before = signal.getsignal(signal.SIGTERM)
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    agent.run()
    timer.join()
    assert closed == [True] and control_plane.accepted
    assert signal.getsignal(signal.SIGTERM) is before


class ReportFailsRuntime(RecordingRuntime):
    def __init__(self) -> None:
        super().__init__()
        self.fail_reports = False

    def report(self) -> list[schema.ContainerReport]:
        if self.fail_reports:
            raise ConnectionError("docker socket gone")
        return super().report()


def test_when_the_runtime_cannot_report_the_last_report_is_repeated(control_plane, clock, tmp_path):
    runtime = ReportFailsRuntime()
    agent = make_agent(control_plane, clock, tmp_path, runtime=runtime)
    gpu = agent.backend.discover()[0].uuid
    control_plane.desired = [
        {
            "launch_id": "launch-1",
            "reservation": "res-1",
            "project": "p",
            "image": "cuda:12",
            "gpu_uuids": [gpu],
            "window_start": "2026-05-01T12:00:00Z",
            "window_end": "2026-05-01T13:00:00Z",
        }
    ]
    run_for(agent, clock, 5.5)
    runtime.fail_reports = True
    run_for(agent, clock, 10)
    assert [c["launch_id"] for c in control_plane.accepted[-1]["containers"]] == ["launch-1"]
    errors = [e for e in control_plane.accepted_events() if "docker socket gone" in e["message"]]
    assert len(errors) == 2  # one per heartbeat, none lost or sent twice
