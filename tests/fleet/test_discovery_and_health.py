"""Discovery keeps the inventory true; the health rule and its acknowledgement."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import override_settings

from controlplane.core.errors import Conflict
from controlplane.fleet import health
from controlplane.fleet.services import gpu_acknowledge
from controlplane.inventory.choices import EventKind, GpuHealth
from controlplane.inventory.models import Gpu, GpuModel, ServerEvent
from controlplane.inventory.selectors import placeable_gpus
from nodeagent import schema
from tests.fleet.helpers import T0, gpu_facts, gpu_uuid, heartbeat, ingest

pytestmark = pytest.mark.django_db
UUID0 = gpu_uuid("node-a", 0)


class Beats:
    """Successive heartbeats of node-a, each a few seconds after the last."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.seq = 0

    def send(self, **kwargs: Any) -> Any:
        self.seq += 1
        kwargs.setdefault("start", T0 + timedelta(seconds=10 * self.seq))
        return ingest(self.server, heartbeat("node-a", seq=self.seq, **kwargs))


@pytest.fixture
def beats(node: Any) -> Beats:
    return Beats(node[0])


def gpu0() -> Gpu:
    return Gpu.objects.get(uuid=UUID0)


def events(kind: str) -> list[ServerEvent]:
    return list(ServerEvent.objects.filter(kind=kind).order_by("id"))


# --- discovery ----------------------------------------------------------------------------------------------


def test_new_gpus_appear_mapped_to_the_catalog(beats: Beats, h100: GpuModel) -> None:
    beats.send(gpus=gpu_facts("node-a", count=4))
    assert list(Gpu.objects.order_by("index").values_list("index", "model__name", "numa_node")) == [
        (0, "H100-80GB", 0),
        (1, "H100-80GB", 0),
        (2, "H100-80GB", 0),
        (3, "H100-80GB", 0),
    ]
    assert len(events(EventKind.GPU_ADDED)) == 4


def test_unknown_product_gets_a_catalog_entry_at_price_zero_and_says_so(beats: Beats) -> None:
    beats.send(gpus=gpu_facts("node-a", count=2, product="NVIDIA B200"))
    model = GpuModel.objects.get(product_name="NVIDIA B200")
    assert (model.name, model.price_per_gpu_hour, model.billing_weight) == ("B200", 0, 1)
    [event] = events(EventKind.GPU_MODEL_ADDED)
    assert "price 0" in event.reason


def test_gpu_no_longer_reported_is_flagged_missing_and_comes_back(beats: Beats) -> None:
    beats.send()
    beats.send(gpus=gpu_facts("node-a", count=2)[1:])
    gpu = gpu0()
    assert (gpu.present, gpu.health, gpu.health_reasons) == (False, GpuHealth.UNHEALTHY, [health.MISSING])
    assert not gpu.needs_acknowledgement
    assert gpu not in placeable_gpus()
    assert len(events(EventKind.GPU_MISSING)) == 1

    beats.send()
    gpu = gpu0()
    assert (gpu.present, gpu.health, gpu.health_reasons) == (True, GpuHealth.HEALTHY, [])
    assert len(events(EventKind.GPU_RETURNED)) == 1
    assert [e.to_state for e in events(EventKind.GPU_HEALTH)] == [GpuHealth.UNHEALTHY, GpuHealth.HEALTHY]


def test_replacement_card_takes_the_index_of_the_missing_one(beats: Beats) -> None:
    beats.send()
    replacement = gpu_facts("node-a", count=2)
    replacement[0]["uuid"] = "GPU-replacement"
    beats.send(gpus=replacement)
    assert Gpu.objects.get(uuid="GPU-replacement").index == 0
    assert gpu0().present is False


def test_replayed_samples_are_not_counted_twice(beats: Beats) -> None:
    from controlplane.fleet.models import GpuTelemetryMinute

    beats.send(samples_per_gpu=5, start=T0)
    # The agent restarted: seq back to 0 and the same buffer sent again, then fresh samples.
    ingest(beats.server, heartbeat("node-a", seq=0, samples_per_gpu=5, start=T0))
    ingest(beats.server, heartbeat("node-a", seq=1, samples_per_gpu=8, start=T0))
    row = GpuTelemetryMinute.objects.get(gpu=gpu0())
    assert row.samples == 8


# --- health -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("xid", sorted(schema.APPLICATION_XIDS))
def test_application_xids_never_make_a_gpu_unhealthy(beats: Beats, xid: int) -> None:
    beats.send(events=[{"kind": "xid", "ts": T0.isoformat(), "uuid": UUID0, "xid": xid}])
    assert gpu0().health == GpuHealth.HEALTHY


def test_critical_xid_needs_acknowledgement(beats: Beats, operator: Any) -> None:
    beats.send(events=[{"kind": "xid", "ts": T0.isoformat(), "uuid": UUID0, "xid": 79}])
    gpu = gpu0()
    assert (gpu.health, gpu.health_reasons, gpu.needs_acknowledgement) == (GpuHealth.UNHEALTHY, ["xid:79"], True)
    beats.send()  # the cause does not repeat, yet the fault stays until acknowledged
    assert gpu0().health == GpuHealth.UNHEALTHY

    gpu = gpu_acknowledge(gpu=gpu0(), actor=operator, reason="reseated the card")
    assert (gpu.health, gpu.health_reasons, gpu.needs_acknowledgement) == (GpuHealth.HEALTHY, [], False)
    beats.send()
    assert gpu0().health == GpuHealth.HEALTHY
    [ack] = events(EventKind.GPU_ACKNOWLEDGED)
    assert ack.actor == operator and ack.reason == "reseated the card" and ack.data["cleared"] == ["xid:79"]


def test_rising_double_bit_ecc_count_is_a_fault(beats: Beats, operator: Any) -> None:
    beats.send(fields={UUID0: {schema.ECC_DBE_VOL: 0.0}})
    assert gpu0().health == GpuHealth.HEALTHY
    beats.send(fields={UUID0: {schema.ECC_DBE_VOL: 2.0}})
    assert gpu0().health_reasons == [health.ECC_DBE]
    gpu_acknowledge(gpu=gpu0(), actor=operator, reason="memory test clean")
    beats.send(fields={UUID0: {schema.ECC_DBE_VOL: 2.0}})  # the count stays: nothing new
    assert gpu0().health == GpuHealth.HEALTHY
    beats.send(fields={UUID0: {schema.ECC_DBE_VOL: 3.0}})
    assert gpu0().health_reasons == [health.ECC_DBE]


@pytest.mark.parametrize(
    ("field", "reason"),
    [(schema.RETIRED_PENDING, health.RETIRED_PAGES_PENDING), (schema.ROW_REMAP_FAILURE, health.ROW_REMAP_FAILURE)],
)
def test_fault_still_present_after_acknowledgement_comes_back(
    beats: Beats, operator: Any, field: str, reason: str
) -> None:
    beats.send(fields={UUID0: {field: 1.0}})
    assert gpu0().health_reasons == [reason] and gpu0().needs_acknowledgement
    gpu_acknowledge(gpu=gpu0(), actor=operator, reason="looked at it")
    assert gpu0().health == GpuHealth.HEALTHY
    beats.send(fields={UUID0: {field: 1.0}})
    assert gpu0().health_reasons == [reason] and gpu0().needs_acknowledgement
    gpu_acknowledge(gpu=gpu0(), actor=operator, reason="card replaced")
    beats.send(fields={UUID0: {field: 0.0}})
    assert gpu0().health == GpuHealth.HEALTHY


@override_settings(FLEET_GPU_TEMP_LIMIT_C=85.0)
def test_over_temperature_recovers_on_its_own(beats: Beats) -> None:
    beats.send(fields={UUID0: {schema.GPU_TEMP: 85.0}})
    assert gpu0().health == GpuHealth.HEALTHY  # at the limit is fine; over it is not
    beats.send(fields={UUID0: {schema.GPU_TEMP: 91.0}})
    gpu = gpu0()
    assert (gpu.health_reasons, gpu.needs_acknowledgement) == ([health.TEMPERATURE], False)
    beats.send(fields={UUID0: {schema.GPU_TEMP: 60.0}})
    assert gpu0().health == GpuHealth.HEALTHY
    health_events = events(EventKind.GPU_HEALTH)
    assert [(e.to_state, e.data["raised"], e.data["cleared"]) for e in health_events] == [
        (GpuHealth.UNHEALTHY, [health.TEMPERATURE], []),
        (GpuHealth.HEALTHY, [], [health.TEMPERATURE]),
    ]


def test_acknowledging_keeps_a_transient_cause(beats: Beats, operator: Any) -> None:
    beats.send(
        events=[{"kind": "xid", "ts": T0.isoformat(), "uuid": UUID0, "xid": 48}],
        fields={UUID0: {schema.GPU_TEMP: 99.0}},
    )
    gpu = gpu_acknowledge(gpu=gpu0(), actor=operator, reason="known")
    assert (gpu.health, gpu.health_reasons) == (GpuHealth.UNHEALTHY, [health.TEMPERATURE])


def test_acknowledging_a_healthy_gpu_is_a_conflict(beats: Beats, operator: Any) -> None:
    beats.send()
    with pytest.raises(Conflict):
        gpu_acknowledge(gpu=gpu0(), actor=operator, reason="just because")


def test_health_rule_without_samples_keeps_temperature() -> None:
    verdict = health.evaluate(
        current_reasons=[health.TEMPERATURE],
        present=True,
        previous_fields={},
        dbe_readings=[],
        latest=None,
        xids=[],
        temp_limit_c=90,
    )
    assert verdict.reasons == (health.TEMPERATURE,)


def test_card_moved_from_another_server_keeps_its_row(beats: Beats) -> None:
    from tests.fleet.helpers import enroll

    beats.send()
    original = gpu0()
    other, _ = enroll("node-b")
    moved = gpu_facts("node-b", count=1)
    moved[0]["uuid"] = UUID0
    ingest(other, heartbeat("node-b", gpus=moved, start=T0 + timedelta(minutes=5)))
    gpu = gpu0()
    assert gpu.pk == original.pk and gpu.server == other and gpu.present
    assert ServerEvent.objects.filter(server=other, kind=EventKind.GPU_ADDED, data__from_server="node-a").exists()
