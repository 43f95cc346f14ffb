"""A control-plane outage in the agent loop (DESIGN invariant 12): at the lease only replaceable work is fenced; the
rest runs on the desired state the agent holds, ends at its window's end with no reply, and is stopped only once the
silence outlasts the outage tolerance. A restarted agent keeps the desired state and the journal, and replays it once.
Driven with the test clock against the control plane double; tests/runtime/test_outage.py does it with real Docker
and a SIGKILLed agent process."""

from __future__ import annotations

import itertools
from datetime import timedelta

from control_plane_double import ControlPlaneDouble, FakeClock
from test_agent_fencing import LEASE, FencingRuntime, desired
from test_agent_loop import make_agent, run_for

from nodeagent.agent import OUTAGE_RETRY_S
from nodeagent.client import Backoff

TOLERANCE = 60.0


def outage_agent(control_plane: ControlPlaneDouble, clock: FakeClock, tmp_path, **windows):  # type: ignore[no-untyped-def]
    """An agent running a replaceable launch ("requeued") and one nothing would replace ("kept"), just answered."""
    control_plane.lease_s, control_plane.outage_tolerance_s = LEASE, TOLERANCE
    runtime = FencingRuntime()
    agent = make_agent(control_plane, clock, tmp_path, runtime=runtime)
    gpus = [g.uuid for g in agent.backend.discover()]
    control_plane.desired = [
        desired(gpus[0], launch_id="requeued", reservation="res-r", replaceable=True),
        desired(gpus[1], launch_id="kept", reservation="res-k", **windows),
    ]
    agent.step()
    assert sorted(runtime.running) == ["kept", "requeued"] and agent.outage_tolerance_s == TOLERANCE
    return agent


def test_every_heartbeat_says_the_agent_runs_through_outages(control_plane, clock, tmp_path):
    run_for(make_agent(control_plane, clock, tmp_path), clock, 5.5)
    assert [hb["node"]["outage_tolerant"] for hb in control_plane.accepted] == [True, True]


def test_at_the_lease_only_replaceable_work_is_fenced(control_plane, clock, tmp_path):
    agent = outage_agent(control_plane, clock, tmp_path)
    runtime: FencingRuntime = agent.runtime
    control_plane.fail(100000)
    run_for(agent, clock, LEASE + 0.01)
    [(_, reason)] = runtime.fences
    assert runtime.fence_scopes == ["replaceable"]
    assert reason == f"fenced: no reply from the control plane for {LEASE:.1f} s (lease {LEASE:g} s)"
    assert list(runtime.running) == ["kept"] and list(runtime.kill_at) == ["requeued"]
    run_for(agent, clock, 5)
    assert list(runtime.killed) == ["requeued"] and list(runtime.running) == ["kept"]
    assert not (tmp_path / "state" / "desired.json").stat().st_mode & 0o077  # it may hold a project's secrets


def test_work_nothing_would_replace_ends_at_its_window_end_with_no_reply(control_plane, clock, tmp_path):
    end = clock.now() + timedelta(seconds=40)
    agent = outage_agent(control_plane, clock, tmp_path, window_end=end.isoformat(), warn_before_s=10)
    runtime: FencingRuntime = agent.runtime
    control_plane.fail(100000)
    run_for(agent, clock, 39)
    assert list(runtime.running) == ["kept"]
    run_for(agent, clock, 2)
    assert runtime.ended == {"kept": end}  # at the window's end itself: the timer, not a heartbeat, woke the loop
    assert any(now == end - timedelta(seconds=10) for _, _, now in runtime.calls)  # and at the warning
    assert runtime.fence_scopes == ["replaceable"]  # its stop is the window's, not a fence's


def test_past_the_outage_tolerance_everything_is_stopped(control_plane, clock, tmp_path):
    agent = outage_agent(control_plane, clock, tmp_path)
    runtime: FencingRuntime = agent.runtime
    control_plane.fail(100000)
    run_for(agent, clock, TOLERANCE - 0.5)
    assert runtime.fence_scopes == ["replaceable"] and list(runtime.running) == ["kept"]
    run_for(agent, clock, 1)
    assert runtime.fence_scopes == ["replaceable", "all"]
    reason = runtime.fences[-1][1]
    assert reason == f"fenced: no reply from the control plane for {TOLERANCE:.1f} s (outage tolerance {TOLERANCE:g} s)"
    assert runtime.running == {} and "kept" in runtime.kill_at
    assert agent.fenced == reason and agent.fenced_all


def test_the_control_plane_back_within_the_tolerance_lifts_the_fence_and_hears_everything_once(
    control_plane, clock, tmp_path
):
    agent = outage_agent(control_plane, clock, tmp_path)
    runtime: FencingRuntime = agent.runtime
    sampled_before = len(control_plane.accepted_samples())
    control_plane.fail(100000)
    run_for(agent, clock, 40)
    control_plane.script.clear()
    run_for(agent, clock, 6)
    assert agent.fenced is None and runtime.unfences == 1 and list(runtime.running) == ["kept"]
    samples = control_plane.accepted_samples()
    assert len(samples) == len(set(samples))  # nothing twice
    # Every second's sample of both GPUs, from before the outage to now, arrived, each GPU's in time order.
    assert len(samples) > sampled_before + 40 * 2
    for uuid in {u for u, _ in samples}:
        times = [ts for u, ts in samples if u == uuid]
        assert times == [times[0] + i for i in range(len(times))]
    messages = [e["message"] for e in control_plane.accepted_events()]
    assert any("replaceable containers are being stopped" in m for m in messages)
    back = control_plane.accepted[-1]
    [fenced] = [c for c in back["containers"] if c["launch_id"] == "requeued"]
    assert fenced["state"] == "exited" and fenced["fenced"] is True


def test_a_restarted_agent_mid_outage_keeps_its_work_and_replays_its_journal_once(control_plane, clock, tmp_path):
    end = clock.now() + timedelta(seconds=50)
    agent = outage_agent(control_plane, clock, tmp_path, window_end=end.isoformat(), warn_before_s=0)
    control_plane.fail(100000)
    run_for(agent, clock, 20)
    assert agent.runtime.fence_scopes == ["replaceable"]
    before_kill = {ts for hb in control_plane.accepted for s in hb["samples"] for ts in s["ts"]}
    journaled = agent.buffer.pending("samples")
    assert journaled >= 2 * 19
    # SIGKILL: the process is gone without a word; what it wrote is on disk. The new process adopts the
    # containers still running (the engine is the record of them) and knows nothing else but the state directory.
    clock.advance(3)
    runtime = FencingRuntime()
    runtime.running = {"kept": agent.runtime.running["kept"]}
    runtime.specs.update(runtime.running)
    restarted = make_agent(control_plane, clock, tmp_path, runtime=runtime, join_token=None)
    assert restarted.buffer.pending("samples") == journaled
    run_for(restarted, clock, 20)
    # Past its lease, with the tolerance it was told before the restart: only replaceable work would be fenced.
    assert runtime.fence_scopes == ["replaceable"] and list(runtime.running) == ["kept"]
    run_for(restarted, clock, 10)
    assert runtime.ended == {"kept": end}  # the held desired state ended it on time, with no reply
    control_plane.script.clear()
    run_for(restarted, clock, 6)
    sent = control_plane.accepted_samples()
    assert len(sent) == len(set(sent))  # replayed once
    # What both processes sampled during the outage arrived: every second but the 3 s the agent was dead.
    outage = sorted(ts for u, ts in sent if ts not in before_kill and u == sent[0][0])
    gaps = [b - a for a, b in itertools.pairwise(outage) if b - a != 1]
    assert len(outage) >= 20 + 30 and gaps == [4.0]
    events = [e["message"] for e in control_plane.accepted_events()]
    assert sum("replaceable containers are being stopped" in m for m in events) == 2  # one per process
    [report] = [c for c in control_plane.accepted[-1]["containers"] if c["launch_id"] == "kept"]
    assert report["state"] == "exited" and report["finished_at"] is not None and not report.get("fenced")


def test_the_held_desired_state_waits_for_a_silent_control_plane(control_plane, clock, tmp_path):
    agent = outage_agent(control_plane, clock, tmp_path)
    # Restarted while the control plane answers: it acts on the reply, not on what it held (a cancelled launch
    # must not start again from the disk).
    control_plane.desired = control_plane.desired[1:]
    runtime = FencingRuntime()
    restarted = make_agent(control_plane, clock, tmp_path, runtime=runtime, join_token=None)
    restarted.step()
    assert [ids for ids, _, _ in runtime.calls] == [["kept"]]
    assert agent.state.desired() is not None
    assert [d.launch_id for d in agent.state.desired()[0]] == ["kept"]


def test_past_the_lease_retries_back_off_to_at_most_fifteen_seconds(control_plane, clock, tmp_path):
    control_plane.lease_s, control_plane.outage_tolerance_s = LEASE, TOLERANCE * 10
    agent = make_agent(control_plane, clock, tmp_path, backoff=Backoff(base_s=2, cap_s=60, rng=lambda: 1.0))
    agent.step()
    control_plane.fail(100000)
    run_for(agent, clock, 300)
    tries = [i for i, r in enumerate(control_plane.received) if r.path.endswith("heartbeat")]
    assert agent.backoff.failures == len(tries) - 1
    # The backoff alone would wait 2, 4, ... 60 s; the control plane back from an outage hears from the agent
    # within 15 s, inside its startup grace.
    assert len(tries) - 1 >= 300 / OUTAGE_RETRY_S
