"""The agent applies the MIG layouts a heartbeat reply asks for: only while no container of its own uses the
GPU or its MIG devices, once per request generation, and reports each outcome as a "mig" event."""

from __future__ import annotations

from test_agent_loop import RecordingRuntime, make_agent, run_for

from nodeagent import schema


def mig_events(control_plane):  # type: ignore[no-untyped-def]
    return [e for e in control_plane.accepted_events() if e["kind"] == "mig"]


def test_a_requested_layout_is_applied_reported_and_shows_in_the_next_facts(control_plane, clock, tmp_path):
    agent = make_agent(control_plane, clock, tmp_path, spec="2xH100-80GB")
    agent.step()
    uuid = control_plane.accepted[0]["gpus"][0]["uuid"]
    assert control_plane.accepted[0]["gpus"][0]["mig"]["current"] is False
    control_plane.mig = [{"uuid": uuid, "enabled": True, "layout": ["3g.40gb", "3g.40gb"], "generation": 1}]
    run_for(agent, clock, 11)
    (event,) = mig_events(control_plane)
    assert (event["uuid"], event["generation"], event["outcome"]) == (uuid, 1, "applied")
    gpu = next(g for g in control_plane.accepted[-1]["gpus"] if g["uuid"] == uuid)
    assert gpu["mig"]["current"] is True
    assert sorted(d["profile"] for d in gpu["mig"]["devices"]) == ["3g.40gb", "3g.40gb"]
    assert all(d["uuid"].startswith("MIG-") for d in gpu["mig"]["devices"])


def test_an_impossible_layout_is_reported_refused_with_the_reason(control_plane, clock, tmp_path):
    agent = make_agent(control_plane, clock, tmp_path, spec="1xH100-80GB")
    agent.step()
    uuid = control_plane.accepted[0]["gpus"][0]["uuid"]
    control_plane.mig = [{"uuid": uuid, "enabled": True, "layout": ["4g.40gb", "4g.40gb"], "generation": 3}]
    run_for(agent, clock, 11)
    (event,) = mig_events(control_plane)
    assert event["outcome"] == "refused" and "INSUFFICIENT_RESOURCES" in event["message"]


def test_a_gpu_in_use_is_not_reconfigured_until_its_container_is_gone(control_plane, clock, tmp_path):
    runtime = RecordingRuntime()
    agent = make_agent(control_plane, clock, tmp_path, spec="1xH100-80GB", runtime=runtime)
    agent.step()
    uuid = control_plane.accepted[0]["gpus"][0]["uuid"]
    runtime.running = {
        "l1": schema.DesiredContainer.model_validate(
            {
                "launch_id": "l1",
                "reservation": "r1",
                "project": "p",
                "image": "busybox",
                "gpu_uuids": [uuid],
                "window_start": "2026-05-01T12:00:00Z",
                "window_end": "2026-05-01T13:00:00Z",
            }
        )
    }
    control_plane.desired = [runtime.running["l1"].model_dump(mode="json")]
    control_plane.mig = [{"uuid": uuid, "enabled": True, "layout": ["7g.80gb"], "generation": 1}]
    run_for(agent, clock, 11)
    assert mig_events(control_plane) == []
    control_plane.desired = []
    run_for(agent, clock, 11)
    (event,) = mig_events(control_plane)
    assert event["outcome"] == "applied"


def test_a_resent_request_is_answered_once_and_a_layout_already_there_is_left_alone(control_plane, clock, tmp_path):
    agent = make_agent(control_plane, clock, tmp_path, spec="1xH100-80GB:mig=7g.80gb")
    agent.step()
    gpu = control_plane.accepted[0]["gpus"][0]
    before = [d["uuid"] for d in gpu["mig"]["devices"]]
    control_plane.mig = [{"uuid": gpu["uuid"], "enabled": True, "layout": ["7g.80gb"], "generation": 2}]
    run_for(agent, clock, 21)
    (event,) = mig_events(control_plane)
    assert event["message"] == "the GPU already has this MIG layout"
    after = [d["uuid"] for d in control_plane.accepted[-1]["gpus"][0]["mig"]["devices"]]
    assert after == before  # the MIG device kept its uuid
