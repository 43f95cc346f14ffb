from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from controlplane.fleet import desired, fencing
from controlplane.fleet.models import GpuTelemetryMinute, NodeLossWatch
from controlplane.fleet.services import prune_telemetry
from controlplane.fleet.tasks import detect_lost_servers as detect_task
from controlplane.inventory.choices import EventKind, ServerState
from controlplane.inventory.models import Server, ServerEvent
from controlplane.inventory.services import NODE_LOSS_ACTOR, server_set_state
from nodeagent import schema
from tests.fleet.helpers import T0, gpu_uuid, heartbeat, ingest, sample_fields, to_wire
from tests.fleet.node_loss_support import steady_pass

pytestmark = pytest.mark.django_db


# The defaults: 5 s heartbeats, offline after 3 intervals, a lease of 2, a 30 s stop grace and a 10 s margin.
DEFAULTS = {
    "FLEET_OFFLINE_AFTER_INTERVALS": 3,
    "FLEET_FENCE_AFTER_INTERVALS": 2,
    "DISPATCH_STOP_GRACE_S": 30,
    "FLEET_REQUEUE_MARGIN_S": 10.0,
}


@override_settings(**DEFAULTS)
def test_silent_server_goes_offline_and_returns_to_its_state(
    node: Any, operator: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = node[0]
    monkeypatch.setattr(desired, "server_lost", lambda s, now, silent_s: 0)  # nothing runs on it
    ingest(server, heartbeat("node-a"), now=T0)
    server_set_state(server=server, to=ServerState.READY, actor=operator, reason="burn-in passed")
    server_set_state(server=server, to=ServerState.DRAINING, actor=operator, reason="kernel update")
    assert steady_pass(T0 + timedelta(seconds=14)) == 0  # 3 x 5 s not yet passed
    assert steady_pass(T0 + timedelta(seconds=16)) == 1
    server.refresh_from_db()
    assert (server.state, server.state_before_offline) == (ServerState.OFFLINE, ServerState.DRAINING)
    offline = ServerEvent.objects.filter(kind=EventKind.STATE, to_state=ServerState.OFFLINE).get()
    assert offline.actor_label == NODE_LOSS_ACTOR and "no heartbeat for 16 s" in offline.reason
    assert "requeued once it has been silent for 50 s" in offline.reason
    assert offline.data["requeue_at"] == (T0 + timedelta(seconds=50)).isoformat()
    assert steady_pass(T0 + timedelta(seconds=60)) == 0  # already offline, and nothing to requeue

    reply = ingest(server, heartbeat("node-a", seq=2, start=T0 + timedelta(seconds=61)), now=T0 + timedelta(seconds=61))
    assert reply.server_state == ServerState.DRAINING
    server.refresh_from_db()
    assert (server.state, server.state_before_offline) == (ServerState.DRAINING, "")
    back = ServerEvent.objects.filter(kind=EventKind.STATE, from_state=ServerState.OFFLINE).get()
    assert back.to_state == ServerState.DRAINING and back.actor_label == "agent:node-a"


@override_settings(**DEFAULTS)
def test_launches_are_lost_only_after_the_lease_the_grace_and_the_margin(
    node: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = node[0]
    lost: list[tuple[str, Any]] = []
    monkeypatch.setattr(desired, "server_lost", lambda s, now, silent_s: lost.append((s.hostname, now)) or 1)
    ingest(server, heartbeat("node-a"), now=T0)
    assert steady_pass(T0 + timedelta(seconds=16)) == 1  # offline: nothing new goes there
    assert lost == []  # but its agent may still be stopping its containers (lease 10 s + grace 30 s)
    assert steady_pass(T0 + timedelta(seconds=49)) == 0
    assert lost == []
    assert steady_pass(T0 + timedelta(seconds=51)) == 1
    assert lost == [("node-a", T0 + timedelta(seconds=51))]


@override_settings(**DEFAULTS)
def test_a_server_back_before_the_requeue_keeps_its_launches(node: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    server = node[0]
    lost: list[str] = []
    monkeypatch.setattr(desired, "server_lost", lambda s, now, silent_s: lost.append(s.hostname) or 1)
    ingest(server, heartbeat("node-a"), now=T0)
    assert steady_pass(T0 + timedelta(seconds=16)) == 1
    # Back 30 s in: its agent's own reports (running, or stopped by its fence) say what became of the launches.
    ingest(server, heartbeat("node-a", seq=2, start=T0 + timedelta(seconds=30)), now=T0 + timedelta(seconds=30))
    assert steady_pass(T0 + timedelta(seconds=51)) == 1  # silent again: offline again, from 30 s on
    assert steady_pass(T0 + timedelta(seconds=79)) == 0
    assert lost == []  # 50 s after the heartbeat that came back, not after the first one
    assert steady_pass(T0 + timedelta(seconds=81)) == 1 and lost == ["node-a"]


def test_the_requeue_delay_covers_the_lease_and_the_grace_and_never_precedes_offline() -> None:
    with override_settings(**DEFAULTS):
        assert (fencing.lease_s(5.0), fencing.offline_after_s(5.0), fencing.requeue_after_s(5.0)) == (10, 15, 50)
        assert fencing.requeue_after_s(20.0) == 40 + 30 + 10  # a server's own interval counts
        assert fencing.requeue_after_s(60.0) == 180  # 120 + 30 + 10, but not before it is offline
    with override_settings(**{**DEFAULTS, "DISPATCH_STOP_GRACE_S": 0, "FLEET_REQUEUE_MARGIN_S": 1.0}):
        assert fencing.requeue_after_s(5.0) == 15  # 10 + 0 + 1, but not before it is offline


@override_settings(**DEFAULTS)
def test_the_reply_gives_a_lease_only_to_an_agent_that_fences(node: Any) -> None:
    server = node[0]
    body = heartbeat("node-a")
    assert "fencing" not in body["node"]  # an agent from before fencing
    reply = ingest(server, body, now=T0)
    assert reply.lease_s is None and "lease_s" not in json.loads(reply.model_dump_json())
    fencing_agent = heartbeat("node-a", seq=2, start=T0 + timedelta(seconds=5))
    fencing_agent["node"]["fencing"] = True
    reply = ingest(server, fencing_agent, now=T0 + timedelta(seconds=5))
    assert reply.lease_s == 10.0 == 2 * reply.heartbeat_interval_s
    Server.objects.filter(pk=server.pk).update(heartbeat_interval_s=30.0)
    fencing_agent["seq"] = 3
    assert ingest(server, fencing_agent, now=T0 + timedelta(seconds=10)).lease_s == 60.0


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FLEET_FENCE_AFTER_INTERVALS": "3"}, "FLEET_FENCE_AFTER_INTERVALS (3) must be less than"),
        ({"FLEET_OFFLINE_AFTER_INTERVALS": "2"}, "FLEET_FENCE_AFTER_INTERVALS (2) must be less than"),
        ({"FLEET_REQUEUE_MARGIN_S": "0"}, "FLEET_REQUEUE_MARGIN_S must be at least 1.0"),
    ],
)
def test_settings_that_would_let_a_requeue_overtake_the_fence_are_refused_at_start(
    env: dict[str, str], message: str, tmp_path: Any
) -> None:
    # The settings module run in a fresh interpreter, as a web or worker process starts.
    result = subprocess.run(
        [sys.executable, "-c", "import controlplane.settings"],
        env={**os.environ, "CONTROLPLANE_VAR_DIR": str(tmp_path), **env},
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and message in result.stderr


def test_per_server_interval_decides_loss(node: Any) -> None:
    server = node[0]
    Server.objects.filter(pk=server.pk).update(heartbeat_interval_s=60.0)
    ingest(server, heartbeat("node-a"), now=T0)
    assert steady_pass(T0 + timedelta(seconds=100)) == 0
    assert steady_pass(T0 + timedelta(seconds=181)) == 1


def test_never_heard_and_retired_servers_are_not_lost(node: Any, operator: Any) -> None:
    assert steady_pass(T0 + timedelta(days=1)) == 0
    ingest(node[0], heartbeat("node-a"), now=T0)
    server_set_state(server=node[0], to=ServerState.RETIRED, actor=operator, reason="end of life")
    assert steady_pass(T0 + timedelta(days=1)) == 0


def test_celery_task_runs_the_detector(node: Any) -> None:
    from django.utils import timezone

    ingest(node[0], heartbeat("node-a"), now=T0)
    NodeLossWatch.objects.create(pk=1, last_pass_at=timezone.now())  # a detector running all along
    assert detect_task.apply().get() == 1


def test_rollup_arithmetic_across_heartbeats_and_minutes(node: Any) -> None:
    uuid = gpu_uuid("node-a", 0)
    first = heartbeat("node-a", seq=1, samples_per_gpu=2, start=T0 + timedelta(seconds=50), version=1)
    util = iter([10.0, 30.0, 90.0, 20.0, 40.0])
    for sample in first["samples"]:
        if sample["uuid"] == uuid:
            sample["fields"].update(
                {
                    schema.GPU_UTIL: next(util),
                    schema.POWER_USAGE: 100.0,
                    schema.TOTAL_ENERGY: 5000.0 if sample["ts"].endswith(":50+00:00") else 5100.0,
                }
            )
    ingest(node[0], to_wire(first))
    second = heartbeat("node-a", seq=2, samples_per_gpu=3, start=T0 + timedelta(seconds=58), version=1)
    energy = iter([5900.0, 6000.0, 6100.0])
    for sample in second["samples"]:
        if sample["uuid"] == uuid:
            sample["fields"].update(
                {
                    schema.GPU_UTIL: next(util) if sample["ts"] < (T0 + timedelta(seconds=60)).isoformat() else 70.0,
                    schema.POWER_USAGE: None,
                    schema.GPU_TEMP: 77.0,
                    schema.TOTAL_ENERGY: next(energy),
                }
            )
    ingest(node[0], to_wire(second))
    rows = list(GpuTelemetryMinute.objects.filter(gpu__uuid=uuid).order_by("minute"))
    assert [r.minute for r in rows] == [T0, T0 + timedelta(minutes=1)]
    minute0, minute1 = rows
    # minute 0: samples at :50, :51 (first beat) and :58, :59 (second beat)
    assert (minute0.samples, minute0.util_samples, minute0.util_sum, minute0.util_max) == (4, 4, 150.0, 90.0)
    assert (minute0.power_samples, minute0.power_sum_w) == (2, 200.0)  # null power is not a zero
    assert minute0.temp_max_c == 77.0
    assert (minute0.energy_first_mj, minute0.energy_last_mj) == (5000.0, 6000.0)
    assert minute0.util_avg == 37.5
    assert (minute1.samples, minute1.util_sum, minute1.energy_first_mj, minute1.energy_last_mj) == (
        1,
        70.0,
        6100.0,
        6100.0,
    )


def test_old_rollups_are_pruned(node: Any) -> None:
    ingest(node[0], heartbeat("node-a"))
    with override_settings(TELEMETRY_MINUTE_RETENTION_DAYS=14):
        assert prune_telemetry(T0 + timedelta(days=13)) == 0
        assert prune_telemetry(T0 + timedelta(days=15)) == 2
    assert GpuTelemetryMinute.objects.count() == 0


def test_folding_columns_at_once_equals_folding_samples_one_by_one() -> None:
    from controlplane.fleet.rollup import MinuteFold

    readings = [sample_fields(**{schema.GPU_UTIL: 10.0 * i, schema.TOTAL_ENERGY: 1000.0 + i}) for i in range(1, 6)] + [
        {schema.GPU_UTIL: None, schema.FB_USED: None},
        {schema.POWER_USAGE: 123.0, schema.GPU_TEMP: 90.0},
    ]
    one_by_one, at_once = MinuteFold(), MinuteFold()
    for fields in readings:
        one_by_one.add(fields)
    names = {name for fields in readings for name in fields}
    columns = {name: [fields.get(name) for fields in readings] for name in names}
    at_once.add_columns(columns, 0, 3)
    at_once.add_columns(columns, 3, len(readings))
    assert at_once == one_by_one
    assert at_once.util_samples == 5 and at_once.util_max == 50.0 and at_once.temp_max_c == 90.0
    assert (at_once.energy_first_mj, at_once.energy_last_mj) == (1001.0, 1005.0)
