"""MIG and vendors in the heartbeat: reported MIG devices become MigDevice rows under their GPU, the vendor
is stored, a steady MIG report costs no statement, and the agent's "mig" outcome ends a reconfiguration."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from rest_framework.test import APIClient

from controlplane.core.errors import Conflict
from controlplane.fleet import mig as fleet_mig
from controlplane.inventory.choices import EventKind, MigChange, ServerState, Vendor
from controlplane.inventory.models import Gpu, GpuModel, MigDevice, Server, ServerEvent
from controlplane.inventory.services import server_set_state
from controlplane.reservations.models import Reservation
from controlplane.reservations.services import reservation_cancel, reservation_create, reservation_extend
from controlplane.reservations.specs import GpuSpec
from nodeagent.backends.simulated import SimulatedBackend
from tests.factories import UserFactory
from tests.fleet.helpers import T0, enroll, heartbeat, ingest
from tests.reservations.fleet import CONTAINER, project, window

pytestmark = pytest.mark.django_db


def facts_of(spec: str, hostname: str = "node-a") -> list[dict[str, Any]]:
    """What a simulated agent reports for ``spec``: the agent's own facts, MIG included."""
    return [g.model_dump(mode="json") for g in SimulatedBackend(spec, hostname=hostname).discover()]


def test_reported_mig_devices_are_stored_under_their_gpu_with_profiles_and_placement(node: Any) -> None:
    server, _ = node
    gpus = facts_of("2xH100-80GB:mig=3g.40gb+2x2g.20gb")
    ingest(server, heartbeat("node-a", gpus=gpus))
    gpu = Gpu.objects.get(uuid=gpus[0]["uuid"])
    assert gpu.mig is not None and gpu.mig["current"] is True
    devices = list(MigDevice.objects.filter(gpu=gpu).order_by("placement_start"))
    assert [(d.profile, d.placement_start, d.memory_slices, d.memory_mib) for d in devices] == [
        ("2g.20gb", 0, 2, 19968),
        ("2g.20gb", 2, 2, 19968),
        ("3g.40gb", 4, 4, 40448),
    ]
    assert {d.uuid for d in devices} == {d["uuid"] for d in gpus[0]["mig"]["devices"]}
    assert MigDevice.objects.count() == 6
    assert ServerEvent.objects.filter(kind=EventKind.MIG_CHANGED).count() == 2


def test_a_changed_layout_replaces_the_devices_and_says_so(node: Any) -> None:
    server, _ = node
    ingest(server, heartbeat("node-a", gpus=facts_of("1xH100-80GB:mig=7g.80gb")), now=T0)
    before = set(MigDevice.objects.values_list("uuid", flat=True))
    later = T0.replace(minute=5)
    ingest(server, heartbeat("node-a", seq=2, start=later, gpus=facts_of("1xH100-80GB:mig=4x1g.10gb")), now=later)
    after = set(MigDevice.objects.present().values_list("uuid", flat=True))
    assert len(after) == 4 and not before & after
    # The old device is kept, marked gone: history may name it.
    (old,) = MigDevice.objects.filter(uuid__in=before)
    assert (old.present, old.gone_at) == (False, later)
    event = ServerEvent.objects.filter(kind=EventKind.MIG_CHANGED).first()
    assert event is not None and "1g.10gb + 1g.10gb + 1g.10gb + 1g.10gb" in event.reason
    assert sorted(event.data["removed"]) == sorted(before)


def test_mig_disabled_leaves_no_devices_and_a_gpu_without_mig_has_no_state(node: Any) -> None:
    server, _ = node
    ingest(server, heartbeat("node-a", gpus=facts_of("1xH100-80GB:mig=7g.80gb")))
    ingest(server, heartbeat("node-a", seq=2, start=T0.replace(minute=5), gpus=facts_of("1xH100-80GB")))
    assert MigDevice.objects.present().count() == 0 and MigDevice.objects.count() == 1
    assert Gpu.objects.get().mig["current"] is False  # type: ignore[index]
    l40s, _ = enroll("node-l")
    ingest(l40s, heartbeat("node-l", gpus=facts_of("1xL40S", "node-l")))
    assert Gpu.objects.get(server=l40s).mig is None


def test_an_amd_gpu_is_stored_with_vendor_amd_and_a_new_amd_model_too(node: Any) -> None:
    amd, _ = enroll("node-amd")
    ingest(amd, heartbeat("node-amd", gpus=facts_of("2xMI300X", "node-amd")))
    gpus = Gpu.objects.filter(server=amd)
    assert {g.vendor for g in gpus} == {Vendor.AMD}
    assert GpuModel.objects.get(product_name="AMD Instinct MI300X").vendor == Vendor.AMD
    assert all(len(g.nvlink_peers) == 1 for g in gpus)  # XGMI peers


def test_a_steady_mig_report_costs_no_statement_beyond_a_plain_one(node: Any) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    server, _ = node
    other, _ = enroll("node-b")
    plain, mig = facts_of("2xH100-80GB"), facts_of("2xH100-80GB:mig=3g.40gb+3g.40gb", "node-b")
    ingest(server, heartbeat("node-a", gpus=plain))
    ingest(other, heartbeat("node-b", gpus=mig))

    def count(srv: Any, host: str, gpus: list[dict[str, Any]], seq: int) -> int:
        with CaptureQueriesContext(connection) as captured:
            ingest(srv, heartbeat(host, seq=seq, start=T0.replace(minute=seq), gpus=gpus))
        return len(captured)

    assert count(server, "node-a", plain, 2) == count(other, "node-b", mig, 2)


def test_the_agents_outcome_ends_a_reconfiguration_with_an_event(node: Any, operator: Any) -> None:
    server, _ = node
    gpus = facts_of("1xH100-80GB")
    ingest(server, heartbeat("node-a", gpus=gpus))
    server_set_state(server=server, to=ServerState.MAINTENANCE, actor=operator, reason="re-slicing")
    gpu = fleet_mig.gpu_request_mig(
        gpu=Gpu.objects.get(), enabled=True, layout=["3g.40gb", "3g.40gb"], actor=operator, reason="two halves"
    )
    reply = ingest(server, heartbeat("node-a", seq=2, start=T0.replace(minute=2), gpus=gpus))
    (wanted,) = reply.mig
    assert (wanted.uuid, wanted.enabled, wanted.layout, wanted.generation) == (
        gpu.uuid,
        True,
        ["3g.40gb", "3g.40gb"],
        gpu.mig_generation,
    )
    # An answer to an older request changes nothing.
    stale = {"kind": "mig", "ts": T0.isoformat(), "uuid": gpu.uuid, "generation": 0, "outcome": "applied"}
    ingest(server, heartbeat("node-a", seq=3, start=T0.replace(minute=3), gpus=gpus, events=[stale]))
    assert Gpu.objects.get().mig_change == MigChange.APPLYING
    done = facts_of("1xH100-80GB:mig=3g.40gb+3g.40gb")
    event = {**stale, "generation": gpu.mig_generation, "message": "MIG layout 3g.40gb + 3g.40gb applied"}
    reply = ingest(server, heartbeat("node-a", seq=4, start=T0.replace(minute=4), gpus=done, events=[event]))
    assert reply.mig == []
    after = Gpu.objects.get()
    assert (after.mig_change, after.mig_desired) == (MigChange.NONE, None)
    assert MigDevice.objects.filter(gpu=after).count() == 2
    applied = ServerEvent.objects.get(kind=EventKind.MIG_APPLIED)
    assert applied.actor_label == "agent:node-a" and "applied" in applied.reason


def test_a_refusal_is_kept_with_nvmls_reason(node: Any, operator: Any) -> None:
    server, _ = node
    gpus = facts_of("1xH100-80GB")
    ingest(server, heartbeat("node-a", gpus=gpus))
    server_set_state(server=server, to=ServerState.MAINTENANCE, actor=operator, reason="re-slicing")
    gpu = fleet_mig.gpu_request_mig(gpu=Gpu.objects.get(), enabled=True, layout=["7g.80gb"], actor=operator, reason="")
    event = {
        "kind": "mig",
        "ts": T0.isoformat(),
        "uuid": gpu.uuid,
        "generation": gpu.mig_generation,
        "outcome": "refused",
        "message": "NVML refused GPU instance 7g.80gb of 7g.80gb: NVML_ERROR_INSUFFICIENT_RESOURCES",
    }
    reply = ingest(server, heartbeat("node-a", seq=2, start=T0.replace(minute=2), gpus=gpus, events=[event]))
    assert reply.mig == []  # not resent: the operator decides what next
    assert Gpu.objects.get().mig_change == MigChange.REFUSED
    refused = ServerEvent.objects.get(kind=EventKind.MIG_REFUSED)
    assert "NVML_ERROR_INSUFFICIENT_RESOURCES" in refused.reason


# -- devices that go: history keeps them (issue 22) ---------------------------------------------------------

URL = "/api/v1/agent/heartbeat"


def post(agent: Any, body: dict[str, Any]) -> Any:
    return agent.generic("POST", URL, json.dumps(body), content_type="application/json")


def book_slice(profile: str = "1g.10gb") -> Reservation:
    return reservation_create(
        project=project(),
        name="slice",
        spec=GpuSpec(mig_profile=profile, gpu_count=1),
        window=window(start_in=timedelta(hours=1)),
        container=CONTAINER,
        actor=UserFactory(),
    )


def without_devices(gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a GPU reports after a reboot without a MIG manager: MIG mode kept, its instances gone."""
    return [{**g, "mig": {**g["mig"], "devices": []}} for g in gpus]


@pytest.mark.parametrize("how", ["reconfigured by the operator", "restarted while booked"])
def test_a_layout_change_after_a_slice_was_booked_is_taken_and_history_keeps_the_device(
    node: Any, agent: Any, operator: Any, how: str
) -> None:
    """The MIG blocker of issue 22: past allocations reference the MigDevice rows of the old layout, which the
    heartbeat used to delete (ProtectedError, a 500 on every heartbeat: the server went offline for good)."""
    server, _ = node
    seven = facts_of("1xH100-80GB:mig=7x1g.10gb")
    assert post(agent, heartbeat("node-a", gpus=seven)).status_code == 200
    server_set_state(server=server, to=ServerState.READY, actor=operator, reason="burn-in passed")
    reservation = book_slice()
    (allocation,) = reservation.allocations.all()
    booked = allocation.mig_device
    assert booked is not None and booked.present

    if how == "reconfigured by the operator":
        # The documented way: nothing booked now or later, drain, ask, the agent applies and reports.
        reservation_cancel(reservation=reservation, actor=operator, reason="making room")
        server_set_state(server=server, to=ServerState.MAINTENANCE, actor=operator, reason="re-slicing")
        gpu = fleet_mig.gpu_request_mig(
            gpu=Gpu.objects.get(), enabled=True, layout=["3g.40gb", "3g.40gb"], actor=operator, reason="halves"
        )
        done = {"kind": "mig", "ts": T0.isoformat(), "uuid": gpu.uuid, "generation": gpu.mig_generation,
                "outcome": "applied", "message": "applied"}  # fmt: skip
        after = facts_of("1xH100-80GB:mig=3g.40gb+3g.40gb")
        response = post(agent, heartbeat("node-a", seq=2, start=T0.replace(minute=2), gpus=after, events=[done]))
    else:
        # Rebooted with no MIG manager: MIG on, no devices, while the slice is still booked.
        response = post(agent, heartbeat("node-a", seq=2, start=T0.replace(minute=2), gpus=without_devices(seven)))
    assert response.status_code == 200, response.content
    assert post(agent, heartbeat("node-a", seq=3, start=T0.replace(minute=3), gpus=json.loads(
        json.dumps(after if how.startswith("reconf") else without_devices(seven))))).status_code == 200  # fmt: skip

    server.refresh_from_db()
    assert server.state != ServerState.OFFLINE and server.last_heartbeat_seq == 3
    allocation.refresh_from_db()
    gone = MigDevice.objects.get(pk=booked.pk)
    assert allocation.mig_device_id == booked.pk and gone.uuid == booked.uuid
    assert not gone.present and gone.gone_at is not None
    event = ServerEvent.objects.filter(kind=EventKind.MIG_CHANGED).first()
    assert event is not None and booked.uuid in event.data["removed"]
    # A gone device is no longer bookable, nor shown as the GPU's.
    if how == "reconfigured by the operator":
        server_set_state(server=server, to=ServerState.READY, actor=operator, reason="re-sliced")
        assert {d.profile for d in MigDevice.objects.filter(present=True)} == {"3g.40gb"}
        assert book_slice("3g.40gb").allocations.get().mig_device.present  # type: ignore[union-attr]
    with pytest.raises(Conflict) as refused:
        book_slice("1g.10gb")
    assert refused.value.code == "no_capacity"
    client = APIClient()
    client.force_authenticate(operator)
    shown = client.get(f"/api/v1/gpus/{Gpu.objects.get().pk}").json()["mig_devices"]
    assert booked.uuid not in {d["uuid"] for d in shown}


def test_a_device_reported_again_under_its_uuid_comes_back(node: Any, agent: Any, operator: Any) -> None:
    """A MIG manager that recreates the layout, or a GPU that went missing and returns: the same uuid is the
    same device (what a container was given), so its row, and the history pointing at it, come back."""
    server, _ = node
    seven = facts_of("1xH100-80GB:mig=7x1g.10gb")
    assert post(agent, heartbeat("node-a", gpus=seven)).status_code == 200
    server_set_state(server=server, to=ServerState.READY, actor=operator, reason="burn-in passed")
    booked = book_slice().allocations.get().mig_device
    assert booked is not None
    bodies = [without_devices(seven), [], seven]  # instances gone, then the whole GPU missing, then all back
    for seq, gpus in enumerate(bodies, start=2):
        response = post(agent, heartbeat("node-a", seq=seq, start=T0.replace(minute=seq), gpus=gpus))
        assert response.status_code == 200, response.content
    back = MigDevice.objects.get(pk=booked.pk)
    assert back.present and back.gone_at is None
    assert MigDevice.objects.filter(present=True).count() == 7 == MigDevice.objects.count()
    assert book_slice().allocations.get().mig_device.present  # type: ignore[union-attr]
    returned = ServerEvent.objects.filter(kind=EventKind.MIG_CHANGED).first()
    assert returned is not None and booked.uuid in returned.data["added"]


def test_a_slice_whose_device_is_gone_is_not_extended(node: Any, agent: Any, operator: Any) -> None:
    server, _ = node
    seven = facts_of("1xH100-80GB:mig=7x1g.10gb")
    assert post(agent, heartbeat("node-a", gpus=seven)).status_code == 200
    server_set_state(server=server, to=ServerState.READY, actor=operator, reason="burn-in passed")
    reservation = book_slice()
    later = reservation.ends_at + timedelta(hours=1)
    reservation_extend(reservation=reservation, ends_at=later, actor=operator)  # while the device is there
    assert post(agent, heartbeat("node-a", seq=2, gpus=without_devices(seven))).status_code == 200
    with pytest.raises(Conflict) as refused:
        reservation_extend(reservation=reservation, ends_at=later + timedelta(hours=1), actor=operator)
    assert refused.value.code == "gpu_unavailable"
    assert reservation.allocations.get().mig_device.uuid in refused.value.message  # type: ignore[union-attr]


@pytest.mark.parametrize("before", [ServerState.READY, ServerState.DRAINING, ServerState.MAINTENANCE])
def test_an_offline_server_reporting_a_changed_layout_returns_to_its_previous_state(
    node: Any, agent: Any, operator: Any, before: str
) -> None:
    """Node loss marked it offline (as ``fleet.services._mark_offline`` writes it); it comes back rebooted,
    its MIG instances gone: the heartbeat is taken and the server is what it was."""
    server, _ = node
    seven = facts_of("1xH100-80GB:mig=7x1g.10gb")
    assert post(agent, heartbeat("node-a", gpus=seven)).status_code == 200
    server_set_state(server=server, to=ServerState.READY, actor=operator, reason="burn-in passed")
    booked = book_slice().allocations.get()
    if before != ServerState.READY:
        server_set_state(server=server, to=before, actor=operator, reason="kernel update")
    Server.objects.filter(pk=server.pk).update(state=ServerState.OFFLINE, state_before_offline=before)

    response = post(agent, heartbeat("node-a", seq=0, start=T0.replace(minute=9), gpus=without_devices(seven)))
    assert response.status_code == 200, response.content
    assert response.json()["server_state"] == before
    server.refresh_from_db()
    assert (server.state, server.state_before_offline) == (before, "")
    back = ServerEvent.objects.filter(kind=EventKind.STATE, from_state=ServerState.OFFLINE).get()
    assert back.to_state == before and back.actor_label == "agent:node-a"
    booked.refresh_from_db()
    assert booked.mig_device is not None and not booked.mig_device.present
    # And again after the layout is back: still its state, the device present again.
    response = post(agent, heartbeat("node-a", seq=1, start=T0.replace(minute=10), gpus=seven))
    assert response.status_code == 200 and response.json()["server_state"] == before
    assert MigDevice.objects.get(pk=booked.mig_device_id).present
