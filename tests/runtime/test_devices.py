"""The GPU devices each kind of container gets: NVIDIA GPUs and MIG devices by uuid (variable and device
request), AMD GPUs as /dev/kfd plus exactly their own render nodes, their groups and ROCm's variables."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeagent.runtime.devices import KFD, GpuInfo, amd_devices, render_node

from .support import T0, ours
from .test_launch import env_of, report_for

MIG_A = "MIG-1d4ffec4-45a4-5f5f-ba77-3c8ef59917a3"
MIG_B = "MIG-fe6fc4c8-4fd5-5959-ad99-5a337ddb6ae9"
AMD = {
    "GPU-amd-0": GpuInfo(vendor="amd", pci_bus_id="0000:0c:00.0"),
    "GPU-amd-1": GpuInfo(vendor="amd", pci_bus_id="0000:22:00.0"),
    "GPU-amd-2": GpuInfo(vendor="amd", pci_bus_id="0000:38:00.0"),
    "GPU-amd-norender": GpuInfo(vendor="amd", pci_bus_id="0000:99:00.0"),
    "GPU-nv-0": GpuInfo(vendor="nvidia", pci_bus_id="00000000:18:00.0"),
}


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    """A sysfs tree as the amdgpu driver lays it out: each GPU's PCI device has a drm/ with its card and
    render node."""
    root = tmp_path / "sys"
    for n, bdf in enumerate(["0000:0c:00.0", "0000:22:00.0", "0000:38:00.0"]):
        drm = root / "bus" / "pci" / "devices" / bdf / "drm"
        (drm / f"card{n}").mkdir(parents=True)
        (drm / f"renderD{128 + n}").mkdir()
    (root / "bus" / "pci" / "devices" / "0000:99:00.0").mkdir(parents=True)
    return root


def test_render_node_is_found_from_the_pci_bus_in_either_spelling(sysfs):  # type: ignore[no-untyped-def]
    assert render_node("0000:22:00.0", sysfs_root=sysfs) == "/dev/dri/renderD129"
    assert render_node("00000000:22:00.0", sysfs_root=sysfs) == "/dev/dri/renderD129"  # NVML's long domain
    assert render_node("0000:99:00.0", sysfs_root=sysfs) is None


def test_amd_devices_are_kfd_and_the_allocated_render_nodes_only(sysfs):  # type: ignore[no-untyped-def]
    devices = amd_devices([AMD["GPU-amd-2"], AMD["GPU-amd-0"]], sysfs_root=sysfs, group_of=lambda p: None)
    assert devices.devices == [f"{KFD}:{KFD}:rwm", "/dev/dri/renderD130:/dev/dri/renderD130:rwm",
                               "/dev/dri/renderD128:/dev/dri/renderD128:rwm"]  # fmt: skip
    assert devices.group_add == ["video", "render"]
    assert devices.env == {"ROCR_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": "0,1"}


def test_amd_groups_are_the_numeric_owners_of_the_device_nodes(sysfs):  # type: ignore[no-untyped-def]
    owners = {KFD: "44", "/dev/dri/renderD128": "109", "/dev/dri/renderD129": "109"}
    devices = amd_devices([AMD["GPU-amd-0"], AMD["GPU-amd-1"]], sysfs_root=sysfs, group_of=owners.get)
    assert devices.group_add == ["44", "109"]


def test_an_amd_launch_gets_its_devices_and_no_nvidia_request(make_runtime, make_desired, sysfs):  # type: ignore[no-untyped-def]
    runtime = make_runtime(nvidia_runtime=True, gpu_info=AMD.get, sysfs_root=sysfs)
    spec = make_desired(gpu_uuids=["GPU-amd-1"], env={"ROCR_VISIBLE_DEVICES": "0,1,2", "HIP_VISIBLE_DEVICES": "2"})

    args = runtime._create_args(spec, runtime.state_dir)

    assert args["devices"] == [f"{KFD}:{KFD}:rwm", "/dev/dri/renderD129:/dev/dri/renderD129:rwm"]
    assert "device_requests" not in args
    assert all("/dev/dri:" not in d for d in args["devices"])  # never the whole of /dev/dri
    env = args["environment"]
    # The tenant's own values cannot widen what ROCm sees.
    assert (env["ROCR_VISIBLE_DEVICES"], env["HIP_VISIBLE_DEVICES"]) == ("0", "0")
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert args["group_add"]


def test_an_amd_launch_on_an_engine_without_the_devices_fails_instead_of_running_without_them(
    make_runtime, make_desired, sysfs, docker_client, node
):  # type: ignore[no-untyped-def]
    if Path(KFD).exists():
        pytest.skip("this host has a ROCm device")
    runtime = make_runtime(gpu_info=AMD.get, sysfs_root=sysfs)
    spec = make_desired(gpu_uuids=["GPU-amd-0"])

    runtime.reconcile([spec], [], T0)

    report = report_for(runtime, spec.launch_id)
    assert report.state == "failed"
    assert "/dev/kfd" in (report.error or "")
    assert [c for c in ours(docker_client, node) if c.status == "running"] == []


def test_an_amd_gpu_without_a_render_node_fails_the_launch_naming_its_bus(make_runtime, make_desired, sysfs):  # type: ignore[no-untyped-def]
    runtime = make_runtime(gpu_info=AMD.get, sysfs_root=sysfs)
    spec = make_desired(gpu_uuids=["GPU-amd-norender"])

    runtime.reconcile([spec], [], T0)

    report = report_for(runtime, spec.launch_id)
    assert report.state == "failed" and "0000:99:00.0" in (report.error or "")


def test_a_launch_mixing_vendors_is_refused(make_runtime, make_desired, sysfs):  # type: ignore[no-untyped-def]
    runtime = make_runtime(gpu_info=AMD.get, sysfs_root=sysfs)
    spec = make_desired(gpu_uuids=["GPU-amd-0", "GPU-nv-0"])
    runtime.reconcile([spec], [], T0)
    report = report_for(runtime, spec.launch_id)
    assert report.state == "failed" and "mix" in (report.error or "")


def test_nvidia_gpus_keep_the_nvidia_path_when_vendors_are_known(make_runtime, make_desired, sysfs):  # type: ignore[no-untyped-def]
    runtime = make_runtime(nvidia_runtime=True, gpu_info=AMD.get, sysfs_root=sysfs)
    args = runtime._create_args(make_desired(gpu_uuids=["GPU-nv-0"]), runtime.state_dir)
    assert "devices" not in args
    assert args["device_requests"][0]["DeviceIDs"] == ["GPU-nv-0"]


def test_a_mig_launch_requests_exactly_its_mig_devices(make_runtime, make_desired):  # type: ignore[no-untyped-def]
    runtime = make_runtime(nvidia_runtime=True)
    spec = make_desired(gpu_uuids=[MIG_A, MIG_B])

    args = runtime._create_args(spec, runtime.state_dir)

    [request] = args["device_requests"]
    assert request["DeviceIDs"] == [MIG_A, MIG_B]
    assert args["environment"]["NVIDIA_VISIBLE_DEVICES"] == f"{MIG_A},{MIG_B}"


def test_a_mig_container_sees_only_its_mig_uuid(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    spec = make_desired(gpu_uuids=[MIG_A], env={"NVIDIA_VISIBLE_DEVICES": "all"})

    runtime.reconcile([spec], [], T0)

    [container] = ours(docker_client, node)
    assert env_of(container)["NVIDIA_VISIBLE_DEVICES"] == MIG_A
