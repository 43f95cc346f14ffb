"""No agent report can break the heartbeat (issue 22, item 4).

Hypothesis drives a node through the real endpoint (``POST /api/v1/agent/heartbeat`` with its node credential)
with reports that are valid but unusual: GPUs missing and returning, indexes swapped, MIG layouts appearing,
disappearing and changing after slices and whole GPUs were booked, MIG devices reported again, a card moving to
another node with its layout, container reports duplicated, out of order or for launches the node does not
have, clocks far ahead or behind (``sent_at``, samples, events, container times), ``seq`` restarting, both wire
versions in turn. Between heartbeats an operator drains, reconfigures and readies, and node loss marks the
server offline.

After every heartbeat: the answer is 200 (never a 5xx, and nothing valid refused), the server is not offline
and its last heartbeat is the control plane's now whatever the agent's clock says (so node loss cannot take
it for what it reported), an offline server is back in its previous state, the GPUs and MIG devices are what
was reported, and every allocation still names the GPU and MIG device it was booked on (nothing deleted).
"""

from __future__ import annotations

import json
import uuid as uuidlib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from controlplane.access.models import Volume
from controlplane.core.errors import DomainError
from controlplane.fleet import mig as fleet_mig
from controlplane.inventory.choices import ServerState
from controlplane.inventory.models import Gpu, MigDevice, Server
from controlplane.inventory.services import server_set_state
from controlplane.reservations.models import Allocation
from controlplane.reservations.services import reservation_create
from controlplane.reservations.specs import GpuSpec, Window
from nodeagent import schema
from nodeagent.backends.simulated import SimulatedBackend
from tests.factories import OperatorFactory, UserFactory
from tests.fleet.helpers import enroll, sample_fields, to_wire
from tests.reservations.fleet import CONTAINER, project

pytestmark = pytest.mark.django_db

URL = "/api/v1/agent/heartbeat"

# The layouts a GPU of the pool may report; devices keep their uuid wherever the same instance comes back
# (the simulated backend derives it from the GPU, the start and the profile), so layouts share some.
LAYOUTS = ["7x1g.10gb", "3g.40gb+2x2g.20gb", "7g.80gb", "4g.40gb+3g.40gb", "2x1g.20gb+3g.40gb", ""]

SKEWS = [0, 1, -1, 59, -3600, 3600, 86400 * 30, -86400 * 30, 86400 * 365 * 20, -86400 * 365 * 20]
# Clocks gone wrong outright: an RTC reset to the epoch, one set to the far future.
ABSOLUTE = [
    datetime(1970, 1, 1, 0, 1, tzinfo=UTC),
    datetime(2000, 1, 1, tzinfo=UTC),
    datetime(2099, 12, 31, tzinfo=UTC),
]
READINGS = [0.0, 1.0, 50.0, -1.0, 1e9, schema.MAX_READING, -schema.MAX_READING, None]
SEQS = ["next", "same", "restart", "back", "huge"]


@pytest.fixture(autouse=True)
def wire_version() -> int:
    """Instead of the fleet's two runs of each test, each heartbeat here draws its wire version."""
    return 0


@dataclass
class PoolGpu:
    uuid: str
    name: str
    memory_mib: int
    layouts: dict[str, list[dict[str, Any]]]  # layout -> the devices the simulated backend reports for it


def _pool(hostname: str) -> list[PoolGpu]:
    """Three MIG-capable H100s and an L40S that cannot do MIG, as a simulated agent reports them."""
    pool: list[PoolGpu] = []
    for i in range(4):
        spec = "4xH100-80GB" if i < 3 else "4xL40S"
        layouts: dict[str, list[dict[str, Any]]] = {}
        for layout in LAYOUTS if i < 3 else []:
            facts = SimulatedBackend(f"{spec}:mig={layout}" if layout else f"{spec}:mig=", hostname=hostname)
            layouts[layout] = facts.discover()[i].model_dump(mode="json")["mig"]["devices"]
        first = SimulatedBackend(spec, hostname=hostname).discover()[i]
        pool.append(PoolGpu(first.uuid, first.name, first.memory_total_mib, layouts))
    return pool


@dataclass
class Node:
    server: Server
    client: APIClient
    pool: list[PoolGpu]
    seq: int = 0


@dataclass
class World:
    a: Node
    b: Node
    operator: Any
    launches: dict[str, tuple[str, list[str]]] = field(default_factory=dict)  # launch -> (reservation, GPUs)
    booked: dict[int, tuple[int, int | None]] = field(default_factory=dict)  # allocation -> (GPU, MIG device)
    devices_seen: int = 0
    volumes: set[str] = field(default_factory=set)  # projects with a volume "data"


def _node(hostname: str) -> Node:
    server, credential = enroll(hostname)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {credential}")
    return Node(server=server, client=client, pool=_pool(hostname))


def _clock(data: st.DataObject, label: str) -> datetime:
    now = timezone.now()
    if data.draw(st.booleans(), label=f"{label} absolute"):
        return data.draw(st.sampled_from(ABSOLUTE), label=label)
    return now + timedelta(seconds=data.draw(st.sampled_from(SKEWS), label=label))


def _mig(data: st.DataObject, gpu: PoolGpu, label: str) -> dict[str, Any] | None:
    if not gpu.layouts:
        return None
    kind = data.draw(st.sampled_from(["layout", "subset", "changed", "off", "none"]), label=f"{label} mig")
    if kind == "none":
        return None  # a driver that stopped answering MIG queries
    if kind == "off":
        return {"current": False, "pending": data.draw(st.booleans()), "devices": []}
    devices = [dict(d) for d in gpu.layouts[data.draw(st.sampled_from(LAYOUTS), label=f"{label} layout")]]
    if kind == "subset" and devices:
        devices = data.draw(st.lists(st.sampled_from(devices), unique_by=lambda d: d["uuid"]), label=f"{label} some")
    if kind == "changed" and devices:
        # The same uuid with other facts: a driver that answers some calls and not others, or moved placement.
        d = devices[0]
        d.update(placement_start=data.draw(st.sampled_from([None, 0, 3, 7])), profile=None, memory_slices=None)
        d["memory_mib"] = data.draw(st.sampled_from([None, 0, schema.MAX_INT32]))
    devices = data.draw(st.permutations(devices), label=f"{label} order")
    return {"current": True, "pending": True, "devices": devices, "profiles": {"1g.10gb": 7, "7g.80gb": 1}}


def _gpus(data: st.DataObject, node: Node, extra: list[PoolGpu], *, every: bool = False) -> list[dict[str, Any]]:
    chosen = (
        node.pool
        if every
        else data.draw(
            st.lists(st.sampled_from(node.pool + extra), unique_by=lambda g: g.uuid, max_size=5), label="gpus"
        )
    )
    indexes = data.draw(
        st.one_of(
            st.permutations(range(len(chosen))),
            st.lists(st.integers(0, 255), min_size=len(chosen), max_size=len(chosen), unique=True),
        ),
        label="indexes",
    )
    out = []
    for gpu, index in zip(chosen, indexes, strict=True):
        facts: dict[str, Any] = {
            "uuid": gpu.uuid,
            "index": index,
            "name": gpu.name,
            "memory_total_mib": data.draw(st.sampled_from([gpu.memory_mib, 0, schema.MAX_INT32])),
            "pci_bus_id": f"00000000:{0x18 + index:02X}:00.0",
            "numa_node": data.draw(st.sampled_from([None, -1, 0, 1])),
            "nvlink_peers": [g.uuid for g in chosen if g is not gpu][: data.draw(st.integers(0, 2))],
        }
        mig = _mig(data, gpu, gpu.uuid[-4:])
        if mig is not None:
            facts["mig"] = mig
        out.append(facts)
    return out


def _samples(data: st.DataObject, gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    samples = []
    for g in gpus:
        start = _clock(data, "sample clock")
        for i in range(data.draw(st.integers(0, 3), label="samples")):
            reading = {f: data.draw(st.sampled_from(READINGS)) for f in (schema.GPU_UTIL, schema.TOTAL_ENERGY)}
            fields = sample_fields(**{schema.GPU_UTIL: reading[schema.GPU_UTIL]})
            fields[schema.TOTAL_ENERGY] = reading[schema.TOTAL_ENERGY]
            ts = start + timedelta(seconds=data.draw(st.sampled_from([i, -i, 0])))
            samples.append({"uuid": g["uuid"], "ts": ts.isoformat(), "fields": fields})
    return samples


def _events(data: st.DataObject, world: World, node: Node, gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    events = []
    uuids = [g["uuid"] for g in gpus] + [g.uuid for g in node.pool]
    for _ in range(data.draw(st.integers(0, 3), label="events")):
        kind = data.draw(st.sampled_from(["xid", "mig", "agent", "error", "container", "session"]), label="event")
        item: dict[str, Any] = {"kind": kind, "ts": _clock(data, "event clock").isoformat(), "message": "x"}
        if kind == "session":
            # Gateway sessions of the node's reservations: phases repeated, a close before its open, times skewed.
            reservations = sorted({r for r, _ in world.launches.values()}) or ["r-unknown"]
            item["reservation"] = data.draw(st.sampled_from(reservations), label="session of")
            item["session"] = {
                "session_id": f"s{data.draw(st.integers(0, 2))}",
                "phase": data.draw(st.sampled_from(["open", "close"])),
                "user": "ada",
                "fingerprint": "SHA256:x",
                "source": "198.51.100.7:50022",
                "started_at": _clock(data, "session start").isoformat(),
                "ended_at": _clock(data, "session end").isoformat() if data.draw(st.booleans()) else None,
                "kinds": ["shell"],
            }
        if uuids:
            item["uuid"] = data.draw(st.sampled_from(uuids))
        if kind == "xid":
            item["xid"] = data.draw(st.sampled_from([13, 31, 43, 79, 100000]))  # application XIDs count for nothing
        if kind == "mig":
            generations = list(Gpu.objects.filter(uuid__in=uuids).values_list("mig_generation", flat=True))
            item["generation"] = data.draw(st.sampled_from([0, 1, 2**40, *generations]))
            item["outcome"] = data.draw(st.sampled_from(["applied", "refused", "reset_required"]))
        events.append(item)
    return events


def _containers(data: st.DataObject, world: World, gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    known = sorted(world.launches)
    reports = []
    for _ in range(data.draw(st.integers(0, 4), label="containers")):
        ours = data.draw(st.booleans(), label="a launch of the node's") if known else False
        if ours:
            launch = data.draw(st.sampled_from(known), label="launch")
            reservation, uuids = world.launches[launch]
        else:
            launch, reservation, uuids = f"l-{uuidlib.uuid4().hex[:8]}", "r-unknown", [g["uuid"] for g in gpus][:1]
        state = data.draw(
            st.sampled_from(["pending", "creating", "running", "stopping", "exited", "failed", "missing"]),
            label="state",
        )
        started = _clock(data, "container start") if data.draw(st.booleans()) else None
        finished = _clock(data, "container end") if state in ("exited", "failed") else None
        report: dict[str, Any] = {"launch_id": launch, "reservation": reservation, "state": state, "gpu_uuids": uuids}
        if started is not None:
            report["started_at"] = started.isoformat()
        if finished is not None:
            report["finished_at"] = finished.isoformat()
            report["exit_code"] = data.draw(st.sampled_from([0, 1, 137, -9, schema.MAX_INT32, -schema.MAX_INT32 - 1]))
        if data.draw(st.booleans(), label="fenced"):
            report["fenced"] = True
        reports.append(report)
        if data.draw(st.booleans(), label="duplicate"):
            reports.append(dict(report))  # the same report twice in one heartbeat
    if data.draw(st.booleans(), label="reversed"):
        reports.reverse()
    return reports


def _seq(data: st.DataObject, node: Node) -> int:
    how = data.draw(st.sampled_from(SEQS), label="seq")
    return {
        "next": min(node.seq + 1, schema.MAX_INT64),
        "same": node.seq,
        "restart": 0,
        "back": max(0, node.seq - 5),
        "huge": schema.MAX_INT64,
    }[how]


def _volumes(data: st.DataObject, world: World) -> list[dict[str, Any]]:
    projects = sorted(world.volumes) or ["nobody"]
    return [
        {
            "project": data.draw(st.sampled_from(projects)),
            "name": "data",
            "used_bytes": data.draw(st.sampled_from([0, 10**12, schema.MAX_INT64])),
            "measured_at": _clock(data, "measured").isoformat(),
        }
        for _ in range(data.draw(st.integers(0, 2), label="volumes"))
    ]


def _send(data: st.DataObject, world: World, node: Node, other: Node, *, first: bool = False) -> None:
    moved = [g for g in other.pool if data.draw(st.integers(0, 9), label="move") == 0]  # a card moved here
    gpus = _gpus(data, node, moved, every=first)
    seq = _seq(data, node)
    facts = {"hostname": node.server.hostname, "agent_version": "0.1.0", "backend": "simulated", "simulated": True}
    body: dict[str, Any] = {
        "schema_version": 1,
        "seq": seq,
        "sent_at": _clock(data, "sent_at").isoformat(),
        "node": {**facts, "fencing": data.draw(st.booleans(), label="fencing")},
        "gpus": gpus,
        "samples": _samples(data, gpus),
        "events": [] if first else _events(data, world, node, gpus),
        "containers": _containers(data, world, gpus),
    }
    version = data.draw(st.sampled_from([1, 2]), label="wire version")
    wire = to_wire(body, version)
    if version == 2:
        wire["volumes"] = _volumes(data, world)  # version 2 only
    raw = json.dumps(wire)
    before = Server.objects.get(pk=node.server.pk)
    sent_at = timezone.now()
    try:
        response = node.client.generic("POST", URL, raw, content_type="application/json")
    except Exception as exc:  # the test client raises what the view raised: a 500 to the agent
        raise AssertionError(f"heartbeat failed with {exc!r}: {raw}") from exc
    assert response.status_code == 200, (response.status_code, response.content[:2000], raw)
    node.seq = seq
    reply = response.json()
    for launch in reply["desired"]:
        world.launches[launch["launch_id"]] = (launch["reservation"], launch["gpu_uuids"])
    if any(c["launch_id"] in world.launches for c in body["containers"]):
        event("reported a launch of its own")

    after = Server.objects.get(pk=node.server.pk)
    expected = before.state
    if before.state == ServerState.OFFLINE:
        event("came back from offline")
        expected = before.state_before_offline or ServerState.COMMISSIONING
    assert after.state == expected == reply["server_state"]
    assert after.state != ServerState.OFFLINE
    assert after.last_heartbeat_at is not None and after.last_heartbeat_at >= sent_at  # the control plane's clock
    assert after.last_heartbeat_seq == seq
    _check_inventory(world, node, other, gpus)


def _check_inventory(world: World, node: Node, other: Node, gpus: list[dict[str, Any]]) -> None:
    reported = {g["uuid"]: g for g in gpus}
    rows = {g.uuid: g for g in Gpu.objects.filter(uuid__in=[g.uuid for g in node.pool + other.pool])}
    for uuid, facts in reported.items():
        gpu = rows[uuid]
        assert (gpu.server_id, gpu.present, gpu.index) == (node.server.pk, True, facts["index"])
        present = set(MigDevice.objects.present().filter(gpu=gpu).values_list("uuid", flat=True))
        assert present == {d["uuid"] for d in (facts.get("mig") or {}).get("devices", [])}
    for gpu in rows.values():
        if gpu.server_id == node.server.pk and gpu.uuid not in reported:
            assert not gpu.present
    # Nothing is ever deleted, and history names what it was booked on.
    assert MigDevice.objects.count() >= world.devices_seen
    world.devices_seen = MigDevice.objects.count()
    now = Allocation.objects.filter(pk__in=list(world.booked)).values_list("pk", "gpu_id", "mig_device_id")
    assert {pk: (gpu, device) for pk, gpu, device in now} == world.booked


def _book(data: st.DataObject, world: World) -> None:
    slice_profiles = sorted(set(MigDevice.objects.present().exclude(profile="").values_list("profile", flat=True)))
    choice = data.draw(st.sampled_from(["whole", *slice_profiles]), label="book")
    spec = GpuSpec(min_memory_mib=1, gpu_count=1) if choice == "whole" else GpuSpec(mig_profile=choice, gpu_count=1)
    start = timezone.now() + timedelta(seconds=data.draw(st.sampled_from([0, 0, 600])))
    window = Window(start, start + timedelta(hours=1))
    try:
        reservation = reservation_create(
            project=project(), name="p", spec=spec, window=window, container=CONTAINER, actor=UserFactory()
        )
    except DomainError:
        return  # nothing free of that kind: a refusal, not a failure
    for allocation in reservation.allocations.all():
        world.booked[allocation.pk] = (allocation.gpu_id, allocation.mig_device_id)
    Volume.objects.create(project=reservation.project, name="data", size_limit_gib=1, charged_until=timezone.now())
    world.volumes.add(reservation.project.slug)
    event("booked " + ("a whole GPU" if choice == "whole" else "a slice"))


def _operate(data: st.DataObject, world: World, node: Node) -> None:
    server = Server.objects.get(pk=node.server.pk)
    what = data.draw(st.sampled_from(["ready", "drain", "maintenance", "offline", "reconfigure"]), label="operator")
    try:
        if what == "offline":
            # What node loss writes (fleet.services._mark_offline): the next heartbeat must bring it back.
            if server.state not in (ServerState.OFFLINE, ServerState.RETIRED):
                Server.objects.filter(pk=server.pk).update(state=ServerState.OFFLINE, state_before_offline=server.state)
        elif what == "reconfigure":
            gpu = Gpu.objects.filter(server=server, mig__isnull=False).order_by("index").first()
            if gpu is not None:
                layout = data.draw(st.sampled_from([["7g.80gb"], ["3g.40gb", "3g.40gb"], []]), label="ask")
                fleet_mig.gpu_request_mig(gpu=gpu, enabled=bool(layout), layout=layout, actor=world.operator, reason="")
        else:
            to = {"ready": ServerState.READY, "drain": ServerState.DRAINING, "maintenance": ServerState.MAINTENANCE}
            server_set_state(server=server, to=to[what], actor=world.operator, reason="property test")
    except DomainError:
        pass  # not allowed from where it stands: the operator is told, nothing changes


@settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_no_valid_report_breaks_the_heartbeat_or_loses_the_server(data: st.DataObject) -> None:
    with transaction.atomic():
        run = uuidlib.uuid4().hex[:6]
        world = World(a=_node(f"prop-{run}-a"), b=_node(f"prop-{run}-b"), operator=OperatorFactory())
        steps = data.draw(
            st.lists(st.sampled_from(["a", "a", "a", "b", "book", "book", "operate"]), min_size=3, max_size=12)
        )
        _send(data, world, world.a, world.b, first=True)
        server_set_state(server=world.a.server, to=ServerState.READY, actor=world.operator, reason="burn-in")
        for step in steps:
            if step == "a":
                _send(data, world, world.a, world.b)
            elif step == "b":
                _send(data, world, world.b, world.a)
            elif step == "book":
                _book(data, world)
            else:
                _operate(data, world, world.a)
        transaction.set_rollback(True)
