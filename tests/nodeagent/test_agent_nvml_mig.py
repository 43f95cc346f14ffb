"""MIG through the NVML backend, against a fake pynvml that follows NVML's documented behaviour: discovery of
MIG devices (NotSupported on GPUs without MIG, NOT_FOUND for empty slots), per-field tolerance, and
reconfiguration (create/destroy, INSUFFICIENT_RESOURCES, IN_USE, a mode change pending until a reset)."""

from __future__ import annotations

import pynvml
from nvml_fakes import FakeGpu, FakeMig, FakeNvml

from nodeagent.backends.nvml import NvmlBackend

H100 = "GPU-aaaaaaaa-0000-0000-0000-000000000001"


def h100(**mig: object) -> FakeGpu:
    return FakeGpu(
        uuid=H100,
        bus_id="00000000:18:00.0",
        name="NVIDIA H100 80GB HBM3",
        memory_total_mib=81559,
        mig=FakeMig(model="H100-80GB", **mig),  # type: ignore[arg-type]
    )


def backend_for(*gpus: FakeGpu) -> tuple[NvmlBackend, FakeNvml]:
    fake = FakeNvml(list(gpus))
    return NvmlBackend(nvml=fake), fake


def test_a_gpu_without_mig_reports_no_mig_state_and_keeps_its_other_facts():
    plain = FakeGpu(uuid="GPU-bbbbbbbb-0000-0000-0000-000000000002", bus_id="00000000:2A:00.0")
    backend, _ = backend_for(plain)
    (facts,) = backend.discover()
    assert facts.mig is None
    assert facts.memory_total_mib == plain.memory_total_mib
    assert "mig" not in facts.model_dump(mode="json")  # an older control plane reads the facts as before


def test_mig_disabled_reports_the_mode_and_the_profiles_but_no_devices():
    backend, _ = backend_for(h100())
    (facts,) = backend.discover()
    assert facts.mig is not None
    assert (facts.mig.current, facts.mig.pending, facts.mig.devices) == (False, False, [])
    assert facts.mig.profiles == {
        "1g.10gb": 7,
        "1g.10gb+me": 1,
        "1g.20gb": 4,
        "2g.20gb": 3,
        "3g.40gb": 2,
        "4g.40gb": 1,
        "7g.80gb": 1,
    }


def test_configured_layout_is_discovered_with_uuids_profiles_memory_and_placement():
    gpu = h100()
    backend, _ = backend_for(gpu)
    result = backend.configure_mig(H100, enabled=True, layout=["1g.10gb", "3g.40gb", "2g.20gb"])
    assert (result.outcome, result.message) == ("applied", "MIG layout 1g.10gb + 3g.40gb + 2g.20gb applied")
    (facts,) = backend.discover()
    assert facts.mig is not None and facts.mig.current
    by_profile = {d.profile: d for d in facts.mig.devices}
    assert sorted(by_profile) == ["1g.10gb", "2g.20gb", "3g.40gb"]
    three = by_profile["3g.40gb"]
    assert three.uuid.startswith("MIG-")
    assert (three.memory_mib, three.compute_slices, three.memory_slices, three.profile_id) == (40448, 3, 4, 9)
    assert three.placement_start == 0  # created first, largest first, at its first start
    assert three.compute_instance_id == 0 and three.gpu_instance_id is not None
    # Every MIG device has its own uuid, and none is the parent's.
    assert len({d.uuid for d in facts.mig.devices} | {H100}) == 4


def test_empty_mig_slots_answer_not_found_and_are_skipped():
    gpu = h100()
    backend, fake = backend_for(gpu)
    backend.configure_mig(H100, enabled=True, layout=["7g.80gb"])
    (facts,) = backend.discover()
    assert facts.mig is not None and [d.profile for d in facts.mig.devices] == ["7g.80gb"]
    assert fake.calls.count("nvmlDeviceGetMigDeviceHandleByIndex") >= 7  # every slot asked, six of them empty


def test_a_mig_field_nvml_cannot_read_is_null_and_the_device_stays():
    gpu = h100()
    backend, _ = backend_for(gpu)
    backend.configure_mig(H100, enabled=True, layout=["3g.40gb", "3g.40gb"])
    assert gpu.mig is not None
    gpu.mig.unsupported = {"nvmlGpuInstanceGetInfo", "nvmlDeviceGetMemoryInfo"}
    (facts,) = backend.discover()
    assert facts.mig is not None and len(facts.mig.devices) == 2
    device = facts.mig.devices[0]
    assert (device.profile, device.placement_start, device.memory_slices, device.memory_mib) == (None,) * 4
    assert device.uuid.startswith("MIG-") and device.gpu_instance_id is not None
    assert facts.memory_total_mib == 81559  # the parent still answers


def test_mig_mode_unsupported_by_the_driver_means_no_mig_state():
    gpu = h100()
    assert gpu.mig is not None
    gpu.mig.unsupported = {"nvmlDeviceGetMigMode"}
    backend, _ = backend_for(gpu)
    (facts,) = backend.discover()
    assert facts.mig is None


def test_a_layout_that_does_not_fit_is_refused_with_nvmls_reason_and_leaves_nothing_half_made():
    gpu = h100(current=1, pending=1)
    backend, _ = backend_for(gpu)
    # Four 2-slice instances: the driver has room for three.
    result = backend.configure_mig(H100, enabled=True, layout=["2g.20gb"] * 3 + ["1g.20gb"] * 2)
    assert result.outcome == "refused"
    assert "NVML_ERROR_INSUFFICIENT_RESOURCES" in result.message
    assert gpu.mig is not None and gpu.mig.instances == {}


def test_an_unknown_profile_is_refused_naming_the_profiles_the_gpu_offers():
    backend, _ = backend_for(h100(current=1, pending=1))
    result = backend.configure_mig(H100, enabled=True, layout=["3g.20gb"])
    assert result.outcome == "refused"
    assert "'3g.20gb' is not a MIG profile of this GPU" in result.message and "3g.40gb" in result.message


def test_reconfiguring_replaces_the_previous_layout():
    gpu = h100()
    backend, _ = backend_for(gpu)
    backend.configure_mig(H100, enabled=True, layout=["7g.80gb"])
    result = backend.configure_mig(H100, enabled=True, layout=["1g.10gb"] * 7)
    assert result.outcome == "applied"
    (facts,) = backend.discover()
    assert facts.mig is not None and [d.profile for d in facts.mig.devices] == ["1g.10gb"] * 7


def test_an_instance_in_use_is_not_destroyed_and_the_refusal_says_in_use():
    gpu = h100()
    backend, _ = backend_for(gpu)
    backend.configure_mig(H100, enabled=True, layout=["7g.80gb"])
    assert gpu.mig is not None
    (gi,) = gpu.mig.instances.values()
    gi.compute[0].busy = True
    result = backend.configure_mig(H100, enabled=True, layout=["3g.40gb"])
    assert result.outcome == "refused" and "NVML_ERROR_IN_USE" in result.message
    assert [g.profile.name for g in gpu.mig.instances.values()] == ["7g.80gb"]


def test_a_mode_change_pending_a_reset_is_reported_as_reset_required():
    gpu = h100(reset_required=True)
    backend, fake = backend_for(gpu)
    result = backend.configure_mig(H100, enabled=True, layout=["7g.80gb"])
    assert result.outcome == "reset_required" and "reset" in result.message
    (facts,) = backend.discover()
    assert facts.mig is not None and (facts.mig.current, facts.mig.pending) == (False, True)
    fake.reset(gpu)
    assert backend.configure_mig(H100, enabled=True, layout=["7g.80gb"]).outcome == "applied"


def test_disabling_mig_destroys_the_instances_first():
    gpu = h100()
    backend, _ = backend_for(gpu)
    backend.configure_mig(H100, enabled=True, layout=["3g.40gb", "4g.40gb"])
    result = backend.configure_mig(H100, enabled=False, layout=[])
    assert result.outcome == "applied"
    assert gpu.mig is not None and (gpu.mig.current, gpu.mig.instances) == (pynvml.NVML_DEVICE_MIG_DISABLE, {})


def test_a_gpu_without_mig_refuses_a_layout_with_not_supported():
    plain = FakeGpu(uuid="GPU-bbbbbbbb-0000-0000-0000-000000000002", bus_id="00000000:2A:00.0")
    backend, _ = backend_for(plain)
    result = backend.configure_mig(plain.uuid, enabled=True, layout=["1g.10gb"])
    assert result.outcome == "refused" and "NVML_ERROR_NOT_SUPPORTED" in result.message
