"""The amdsmi backend against a fake amdsmi: facts, XGMI peers, DCGM-named and AMD-exporter-named fields,
per-field tolerance (NOT_SUPPORTED and "N/A" become null), and the same health inputs as NVIDIA's."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from amdsmi_fakes import AmdSmiRetCode, FakeAmdsmi, mi300x_pair

from nodeagent import schema
from nodeagent.backends.amdsmi import ECC_DEFERRED, JUNCTION_TEMP, MEMORY_TEMP, AmdsmiBackend
from nodeagent.backends.base import BackendUnavailable, GpuBackend

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def test_backend_follows_the_interface_and_reads_facts_with_vendor_amd_and_xgmi_peers():
    a, b = mi300x_pair()
    backend = AmdsmiBackend(amdsmi=FakeAmdsmi([a, b]))
    assert isinstance(backend, GpuBackend)
    assert (backend.name, backend.simulated, backend.events_supported) == ("amdsmi", False, False)
    first, second = backend.discover()
    assert first.uuid == f"GPU-{a.uuid}" and first.index == 0 and second.index == 1
    assert (first.name, first.memory_total_mib, first.vendor) == ("AMD Instinct MI300X", 196592, "amd")
    assert (first.pci_bus_id, first.numa_node, second.numa_node) == ("0000:0c:00.0", 0, 1)
    assert first.nvlink_peers == [second.uuid] and second.nvlink_peers == [first.uuid]
    assert first.mig is None
    assert backend.driver_version == "6.10.5"
    assert first.model_dump(mode="json")["vendor"] == "amd"


def test_gpus_on_pcie_only_have_no_xgmi_peers():
    backend = AmdsmiBackend(amdsmi=FakeAmdsmi(list(mi300x_pair()), xgmi=False))
    assert [g.nvlink_peers for g in backend.discover()] == [[], []]


def test_sample_uses_dcgm_names_where_they_apply_and_amd_exporter_names_elsewhere():
    a, _ = mi300x_pair()
    a.ecc = (4, 1, 2)
    backend = AmdsmiBackend(amdsmi=FakeAmdsmi([a]))
    backend.discover()
    (sample,) = backend.sample(NOW)
    f = sample.fields
    assert f[schema.GPU_UTIL] == 37 and f[schema.MEM_COPY_UTIL] == 12
    assert (f[schema.FB_USED], f[schema.FB_TOTAL]) == (2048, 196592)
    assert (f[schema.GPU_TEMP], f[JUNCTION_TEMP], f[MEMORY_TEMP]) == (44, 58, 49)
    assert f[schema.POWER_USAGE] == 312
    assert f[schema.TOTAL_ENERGY] == pytest.approx(1_000_000 * 15.3 / 1000)  # mJ
    assert f[schema.SM_CLOCK] == 2100
    # Uncorrectable RAS errors land where the NVIDIA health rule for double-bit errors reads them.
    assert (f[schema.ECC_SBE_VOL], f[schema.ECC_DBE_VOL], f[ECC_DEFERRED]) == (4, 1, 2)


def test_an_unsupported_call_or_na_value_is_null_and_the_rest_of_the_sample_stays():
    a, _ = mi300x_pair()
    a.unsupported = {"amdsmi_get_gpu_total_ecc_count", "amdsmi_get_energy_count"}
    a.power_w = "N/A"
    a.temps = {"EDGE": 40}
    backend = AmdsmiBackend(amdsmi=FakeAmdsmi([a]))
    backend.discover()
    (sample,) = backend.sample(NOW)
    f = sample.fields
    assert f[schema.ECC_DBE_VOL] is None and f[schema.TOTAL_ENERGY] is None and f[schema.POWER_USAGE] is None
    assert f[JUNCTION_TEMP] is None and f[schema.GPU_TEMP] == 40 and f[schema.GPU_UTIL] == 37
    assert {"ecc", schema.TOTAL_ENERGY, JUNCTION_TEMP} <= backend.unsupported[f"GPU-{a.uuid}"]


def test_a_gpu_whose_uuid_cannot_be_read_is_left_out_and_the_others_stay():
    a, b = mi300x_pair()
    a.unsupported = {"amdsmi_get_gpu_device_uuid"}
    backend = AmdsmiBackend(amdsmi=FakeAmdsmi([a, b]))
    assert [g.uuid for g in backend.discover()] == [f"GPU-{b.uuid}"]


def test_no_driver_is_a_clear_unavailable_error():
    with pytest.raises(BackendUnavailable, match="amdgpu driver"):
        AmdsmiBackend(amdsmi=FakeAmdsmi([], init_error=AmdSmiRetCode.STATUS_DRIVER_NOT_LOADED))


def test_mig_is_refused_on_amd():
    a, _ = mi300x_pair()
    backend = AmdsmiBackend(amdsmi=FakeAmdsmi([a]))
    assert backend.configure_mig(f"GPU-{a.uuid}", enabled=True, layout=["1g.10gb"]).outcome == "refused"


def test_close_shuts_the_library_down():
    fake = FakeAmdsmi(list(mi300x_pair()))
    AmdsmiBackend(amdsmi=fake).close()
    assert not fake.initialised
