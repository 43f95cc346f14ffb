"""The NVML backend against a fake pynvml: per-field fault tolerance, discovery, NUMA, NVLink, XID events."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pynvml
import pytest
from nvml_fakes import SWITCH, FakeGpu, FakeNvml, hgx_pair

from nodeagent import schema
from nodeagent.backends.base import BackendUnavailable, GpuBackend
from nodeagent.backends.nvml import NvmlBackend, normalize_bus_id
from nodeagent.collectors import EventCollector, GpuCollector

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def backend_for(*gpus: FakeGpu, **kwargs) -> tuple[NvmlBackend, FakeNvml]:  # type: ignore[no-untyped-def]
    fake = FakeNvml(list(gpus), **kwargs)
    return NvmlBackend(nvml=fake), fake


def test_backend_follows_the_interface_and_reports_driver_and_cuda():
    backend, _ = backend_for(*hgx_pair())
    assert isinstance(backend, GpuBackend)
    assert (backend.name, backend.simulated) == ("nvml", False)
    assert backend.driver_version == "570.86.15"
    assert backend.cuda_version == "12.8"


def test_missing_driver_is_a_clear_unavailable_error_suggesting_simulate():
    with pytest.raises(BackendUnavailable, match="--simulate"):
        NvmlBackend(nvml=FakeNvml([], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED))


def test_sample_reads_every_field_with_dcgm_names_and_units():
    gpu = FakeGpu(
        uuid="GPU-aaaaaaaa-0000-0000-0000-000000000001",
        bus_id="00000000:18:00.0",
        ecc={
            (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC): 3,
            (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC): 1,
            (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC): 2,
        },
        retired_dbe_pages=[0x1000, 0x2000],
        remapped=(5, 1, 1, 0),
    )
    backend, _ = backend_for(gpu)
    backend.discover()
    [sample] = backend.sample(NOW)
    f = sample.fields
    assert sample.uuid == gpu.uuid and sample.ts == NOW
    assert set(f) == set(schema.SAMPLE_FIELDS)
    assert f[schema.GPU_UTIL] == 42 and f[schema.MEM_COPY_UTIL] == 17
    assert f[schema.FB_USED] == 1024 and f[schema.FB_TOTAL] == 143771
    assert f[schema.GPU_TEMP] == 51
    assert f[schema.POWER_USAGE] == pytest.approx(312.456)  # W from mW
    assert f[schema.TOTAL_ENERGY] == 987_654_321  # mJ, as NVML counts it
    assert f[schema.SM_CLOCK] == 1980
    assert (f[schema.ECC_SBE_VOL], f[schema.ECC_DBE_VOL], f[schema.ECC_DBE_AGG]) == (3, 1, 2)
    assert (f[schema.RETIRED_PENDING], f[schema.RETIRED_DBE]) == (0, 2)
    assert (f[schema.ROW_REMAP_PENDING], f[schema.ROW_REMAP_FAILURE]) == (1, 0)
    assert f[schema.CLOCK_THROTTLE_REASONS] == 0x4
    assert f[schema.XID_ERRORS] == 0  # events are registered and none arrived


def test_unsupported_and_failing_fields_become_null_and_keep_the_rest():
    gpu = FakeGpu(
        uuid="GPU-aaaaaaaa-0000-0000-0000-000000000001",
        bus_id="00000000:18:00.0",
        unsupported={
            "nvmlDeviceGetRetiredPages",
            "nvmlDeviceGetRetiredPagesPendingStatus",
            "nvmlDeviceGetTotalEnergyConsumption",
        },
        broken={"nvmlDeviceGetPowerUsage", "nvmlDeviceGetRemappedRows"},
    )
    backend, _ = backend_for(gpu)
    backend.discover()
    [sample] = backend.sample(NOW)
    f = sample.fields
    for name in (
        schema.RETIRED_DBE,
        schema.RETIRED_PENDING,
        schema.TOTAL_ENERGY,
        schema.POWER_USAGE,
        schema.ROW_REMAP_PENDING,
        schema.ROW_REMAP_FAILURE,
    ):
        assert f[name] is None, name
    assert f[schema.GPU_UTIL] == 42 and f[schema.GPU_TEMP] == 51 and f[schema.FB_USED] == 1024
    assert schema.TOTAL_ENERGY in backend.unsupported[gpu.uuid]
    schema.GpuSample.model_validate(sample.model_dump())  # still a valid wire sample


def test_a_gpu_with_nothing_but_a_uuid_still_yields_a_sample_of_nulls():
    everything = {
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRetiredPagesPendingStatus",
        "nvmlDeviceGetRetiredPages",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        "nvmlDeviceGetName",
        "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetSerial",
        "nvmlDeviceRegisterEvents",
    }
    gpu = FakeGpu(uuid="GPU-aaaaaaaa-0000-0000-0000-000000000001", bus_id="00000000:18:00.0", unsupported=everything)
    other = FakeGpu(uuid="GPU-bbbbbbbb-0000-0000-0000-000000000002", bus_id="00000000:2A:00.0")
    backend, _ = backend_for(gpu, other)
    facts = backend.discover()
    assert [g.uuid for g in facts] == [gpu.uuid, other.uuid]
    assert facts[0].name == "Unknown NVIDIA GPU" and facts[0].memory_total_mib == 0
    samples = {s.uuid: s for s in backend.sample(NOW)}
    assert set(samples) == {gpu.uuid, other.uuid}
    assert all(samples[gpu.uuid].fields[k] is None for k in schema.SAMPLE_FIELDS if k != schema.XID_ERRORS)
    assert samples[other.uuid].fields[schema.GPU_UTIL] == 42


def test_older_pynvml_without_clocks_event_reasons_uses_throttle_reasons():
    gpu = FakeGpu(uuid="GPU-aaaaaaaa-0000-0000-0000-000000000001", bus_id="00000000:18:00.0", throttle=0x40)
    backend, fake = backend_for(gpu, missing=("nvmlDeviceGetCurrentClocksEventReasons",))
    backend.discover()
    [sample] = backend.sample(NOW)
    assert sample.fields[schema.CLOCK_THROTTLE_REASONS] == 0x40
    assert "nvmlDeviceGetCurrentClocksThrottleReasons" in fake.calls


def test_discovery_maps_nvlink_peers_to_uuids_and_reads_numa():
    a, b = hgx_pair()
    lonely = FakeGpu(
        uuid="GPU-cccccccc-0000-0000-0000-000000000003", bus_id="00000000:3A:00.0", numa=1, name="NVIDIA L40S"
    )
    backend, _ = backend_for(a, b, lonely)
    facts = {g.uuid: g for g in backend.discover()}
    assert facts[a.uuid].nvlink_peers == [b.uuid]
    assert facts[b.uuid].nvlink_peers == [a.uuid]
    assert facts[lonely.uuid].nvlink_peers == []
    assert (facts[a.uuid].numa_node, facts[b.uuid].numa_node) == (0, 1)
    assert facts[a.uuid].pci_bus_id == "00000000:18:00.0"
    assert facts[a.uuid].index == 0 and facts[lonely.uuid].index == 2
    assert facts[a.uuid].memory_total_mib == 143771 and facts[a.uuid].name == "NVIDIA H200"


def test_gpus_behind_nvswitches_are_all_peers():
    gpus = [
        FakeGpu(
            uuid=f"GPU-{i}000000-0000-0000-0000-00000000000{i}",
            bus_id=f"00000000:{0x18 + i:02X}:00.0",
            nvlinks={link: SWITCH for link in range(18)},
        )
        for i in range(4)
    ]
    backend, _ = backend_for(*gpus)
    facts = backend.discover()
    for gpu in facts:
        assert sorted(gpu.nvlink_peers) == sorted(g.uuid for g in gpus if g.uuid != gpu.uuid)


def test_numa_node_falls_back_to_sysfs_when_nvml_lacks_it(tmp_path: Path):
    a, b = hgx_pair(sysfs_numa=True)
    for bus, node in (("0000:18:00.0", "0"), ("0000:2a:00.0", "1")):
        d = tmp_path / "bus" / "pci" / "devices" / bus
        d.mkdir(parents=True)
        (d / "numa_node").write_text(node + "\n")
    backend = NvmlBackend(nvml=FakeNvml([a, b]), sysfs_root=tmp_path)
    assert [g.numa_node for g in backend.discover()] == [0, 1]


def test_normalize_bus_id_matches_sysfs_spelling():
    assert normalize_bus_id("00000000:2A:00.0") == "0000:2a:00.0"
    assert normalize_bus_id("0000:2a:00.0") == "0000:2a:00.0"


def test_xid_events_are_read_without_blocking_and_application_xids_are_tagged():
    a, b = hgx_pair()
    backend, fake = backend_for(a, b)
    backend.discover()
    assert backend.events_supported and fake.registered == [a, b]
    fake.push_xid(a, 79)
    fake.push_xid(b, 13)
    events = backend.poll_events(NOW)
    assert [(e.kind, e.uuid, e.xid) for e in events] == [("xid", a.uuid, 79), ("xid", b.uuid, 13)]
    assert events[0].message.startswith("XID 79") and "fallen off the bus" in events[0].message
    assert events[1].message.startswith("application XID 13")
    assert backend.poll_events(NOW) == []
    samples = {s.uuid: s for s in backend.sample(NOW)}
    assert samples[a.uuid].fields[schema.XID_ERRORS] == 79


def test_without_event_support_the_agent_says_so_once_and_xid_field_is_null():
    backend, _ = backend_for(*hgx_pair(), events=False)
    gpus = GpuCollector(backend)
    events = EventCollector(backend)
    gpus.collect(NOW)
    first, second = events.collect(NOW), events.collect(NOW)
    assert not backend.events_supported
    assert [e.kind for e in first] == ["agent"] and "XID events are not collected" in first[0].message
    assert second == []
    assert all(s.fields[schema.XID_ERRORS] is None for s in backend.sample(NOW))


def test_a_lost_gpu_loses_its_sample_and_is_reported_once():
    a, b = hgx_pair()
    backend, _ = backend_for(a, b)
    collector = GpuCollector(backend)
    assert len(collector.collect(NOW).samples) == 2
    a.lost = True
    reading = collector.collect(NOW)
    assert [s.uuid for s in reading.samples] == [b.uuid]
    assert [(e.kind, e.uuid) for e in reading.events] == [("gpu_lost", a.uuid)]
    assert collector.collect(NOW).events == []


def test_close_shuts_nvml_down():
    backend, fake = backend_for(*hgx_pair())
    backend.close()
    assert fake.shut_down


def test_a_reading_that_is_not_a_finite_number_becomes_null_and_the_sample_stays_valid():
    # The wire format refuses NaN and infinity, so a driver answering one must not cost the GPU its sample.
    gpu = FakeGpu(uuid="GPU-aaaaaaaa-0000-0000-0000-000000000001", bus_id="00000000:18:00.0")
    gpu.temp = float("nan")  # type: ignore[assignment]
    gpu.power_mw = float("inf")  # type: ignore[assignment]
    backend, _ = backend_for(gpu)
    backend.discover()
    (sample,) = backend.sample(NOW)
    assert sample.fields[schema.GPU_TEMP] is None and sample.fields[schema.POWER_USAGE] is None
    assert sample.fields[schema.GPU_UTIL] == 42
