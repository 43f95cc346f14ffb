"""Which GPU devices a container gets, per vendor.

NVIDIA: exactly the launch's GPU or MIG uuids, in ``NVIDIA_VISIBLE_DEVICES`` and in the device request the
NVIDIA container runtime acts on (a MIG uuid gives only that MIG device).

AMD (ROCm): ``/dev/kfd`` (the compute interface every ROCm process opens) and the render node of each allocated
GPU, found from its PCI bus under ``/sys/bus/pci/devices/<bdf>/drm/renderD*``; the container joins the groups
that own those nodes (video and render on most distributions) by number, so an image without a "render" group
still works. ROCm's visible-devices variables then number the passed GPUs from 0, as the container sees them.
Never ``/dev/dri`` as a whole: that would be every GPU of the server.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

KFD = "/dev/kfd"


class DeviceError(RuntimeError):
    """The launch's GPUs cannot be given to a container (a render node that cannot be found); the launch fails
    with this message rather than run without its GPUs or with others."""


@dataclass(frozen=True)
class GpuInfo:
    """What the runtime needs of one GPU: its vendor and PCI bus (from the backend's discovery)."""

    vendor: str
    pci_bus_id: str | None


@dataclass(frozen=True)
class AmdDevices:
    devices: list[str] = field(default_factory=list)  # "host:container:permissions", as docker-py takes them
    group_add: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


def _bdf(bus_id: str) -> str:
    bus_id = bus_id.strip().lower()
    domain, sep, rest = bus_id.partition(":")
    if sep and len(domain) > 4:
        return f"{int(domain, 16):04x}:{rest}"
    return bus_id


def render_node(bus_id: str, *, sysfs_root: Path | str = "/sys") -> str | None:
    """The ``/dev/dri/renderD*`` node of the GPU at ``bus_id``, as sysfs links it; None when there is none."""
    drm = Path(sysfs_root) / "bus" / "pci" / "devices" / _bdf(bus_id) / "drm"
    try:
        names = sorted(p.name for p in drm.iterdir() if p.name.startswith("renderD"))
    except OSError:
        return None
    return f"/dev/dri/{names[0]}" if names else None


def _group_of(path: str) -> str | None:
    try:
        return str(os.stat(path).st_gid)
    except OSError:
        return None


def amd_devices(
    gpus: Sequence[GpuInfo],
    *,
    sysfs_root: Path | str = "/sys",
    group_of: Callable[[str], str | None] = _group_of,
) -> AmdDevices:
    """The devices, groups and variables for a container on these AMD GPUs, in the launch's order."""
    nodes: list[str] = []
    for gpu in gpus:
        node = render_node(gpu.pci_bus_id, sysfs_root=sysfs_root) if gpu.pci_bus_id else None
        if node is None:
            raise DeviceError(f"no render node found for the AMD GPU at PCI bus {gpu.pci_bus_id or 'unknown'}")
        nodes.append(node)
    paths = [KFD, *nodes]
    groups: list[str] = []
    for path in paths:
        gid = group_of(path)
        if gid is not None and gid not in groups:
            groups.append(gid)
    # Without the numbers (a node that cannot be stat'ed here), the names ROCm's documentation gives.
    visible = ",".join(str(i) for i in range(len(nodes)))
    return AmdDevices(
        devices=[f"{p}:{p}:rwm" for p in paths],
        group_add=groups or ["video", "render"],
        env={"ROCR_VISIBLE_DEVICES": visible, "HIP_VISIBLE_DEVICES": visible},
    )
